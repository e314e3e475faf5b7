"""A sae_lens SAE or transcoder is read as sae_lens computes it (sae_lens.py step 5): its own
`encode` and forward are the oracle, in float64, for every architecture we read and each option
that changes the function (`apply_b_dec_to_input`, TopK's `rescale_acts_by_decoder_norm`,
thresholds below 0), and for the normalizations sae_lens folds with its own methods."""

import pytest
import torch
from sae_lens.registry import get_sae_class, get_sae_training_class
from sae_lens.saes.sae import SAE, SAEMetadata

from transcoders import UnknownFormatError, load_transcoders

D, S, N = 12, 40, 64
ARCHS = [
    "standard",
    "gated",
    "jumprelu",
    "topk",
    "transcoder",
    "skip_transcoder",
    "jumprelu_transcoder",
    "jumprelu_skip_transcoder",
]


def build(arch: str, layer: int, seed: int, threshold_sign: float = 1.0, **options):
    """A float64 sae_lens object of `arch` at `layer`, random weights, decoder rows of norms 0.05-3."""
    sae_cls, cfg_cls = get_sae_class(arch)
    transcoder = "transcoder" in arch
    if transcoder:
        meta = SAEMetadata(
            hook_name=f"blocks.{layer}.hook_resid_mid", hook_name_out=f"blocks.{layer}.hook_mlp_out"
        )
        options = {"d_out": D, "apply_b_dec_to_input": False} | options
    else:
        meta = SAEMetadata(hook_name=f"blocks.{layer}.hook_resid_pre")
    sae = sae_cls(cfg_cls(d_in=D, d_sae=S, dtype="float64", metadata=meta, **options))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in sae.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 0.5)
        if hasattr(sae, "threshold"):
            sae.threshold.copy_(sae.threshold.abs() * threshold_sign)
        sae.W_dec.mul_(torch.rand(S, 1, generator=g, dtype=torch.float64) * 2.95 + 0.05)
    return sae.eval()


def assert_computes_as_sae_lens(tc, saes, seed=0):
    x = torch.randn(N, len(saes), D, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    res = tc(x)
    for l, sae in enumerate(saes):
        with torch.no_grad():
            acts, out = sae.encode(x[:, l]), sae(x[:, l])
        assert acts.count_nonzero() > 0
        torch.testing.assert_close(res.acts[:, l], acts, rtol=0, atol=1e-12)
        torch.testing.assert_close(res.out[:, l], out, rtol=0, atol=1e-12)


CASES = [(arch, {}) for arch in ARCHS if "transcoder" in arch] + [
    (arch, {"apply_b_dec_to_input": b_dec} | ({"k": 5} if arch == "topk" else {}))
    for arch in ARCHS
    if "transcoder" not in arch
    for b_dec in (True, False)
]
CASES += [
    ("topk", {"k": 5, "rescale_acts_by_decoder_norm": True, "apply_b_dec_to_input": b}) for b in (True, False)
]


@pytest.mark.parametrize("arch, options", CASES, ids=[f"{a}-{o}" for a, o in CASES])
def test_every_architecture_and_option_computes_as_sae_lens(arch, options):
    saes = [build(arch, l, seed=l, **options) for l in range(2)]
    tc = load_transcoders(saes, dtype=torch.float64)
    assert_computes_as_sae_lens(tc, saes)


def test_topk_with_decoder_norm_rescaling_read_from_disk(tmp_path):
    """TopK's `rescale_acts_by_decoder_norm` (ranking h * |W_dec row|): folded when read, so the same
    features are active as in sae_lens (before: acts up to 50 apart, 478 of 4,000 active flags
    differing on 50 tokens)."""
    saes = [build("topk", l, seed=10 + l, k=5, rescale_acts_by_decoder_norm=True) for l in range(2)]
    for l, sae in enumerate(saes):
        sae.save_model(tmp_path / f"layer_{l}")
    tc = load_transcoders(tmp_path, dtype=torch.float64)
    assert_computes_as_sae_lens(tc, [SAE.load_from_disk(str(tmp_path / f"layer_{l}")) for l in range(2)])
    assert_computes_as_sae_lens(tc, saes)


def test_a_topk_sae_saved_by_sae_lens_training_reads_as_sae_lens_loads_it(tmp_path):
    """sae_lens trains TopK with `rescale_acts_by_decoder_norm=True` by default and saves the folded
    weights with the flag still set: both readings must agree with its own loader."""
    sae_cls, cfg_cls = get_sae_training_class("topk")
    for l in range(2):
        meta = SAEMetadata(hook_name=f"blocks.{l}.hook_resid_pre")
        sae = sae_cls(cfg_cls(d_in=D, d_sae=S, k=4, dtype="float64", metadata=meta))
        assert sae.cfg.rescale_acts_by_decoder_norm
        with torch.no_grad():
            g = torch.Generator().manual_seed(l)
            for p in sae.parameters():
                p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64))
        sae.save_inference_model(tmp_path / f"layer_{l}")
    loaded = [SAE.load_from_disk(str(tmp_path / f"layer_{l}")) for l in range(2)]
    assert loaded[0].cfg.rescale_acts_by_decoder_norm
    assert_computes_as_sae_lens(load_transcoders(tmp_path, dtype=torch.float64), loaded)


@pytest.mark.parametrize("arch", ["jumprelu", "jumprelu_transcoder", "jumprelu_skip_transcoder"])
def test_thresholds_below_zero_compute_as_sae_lens(arch):
    """sae_lens's JumpReLU is ReLU(h) * (h > threshold): below 0 a threshold acts as 0 (before: the
    negative pre-activations between it and 0 were kept, acts 1.4 apart)."""
    saes = [build(arch, l, seed=20 + l, threshold_sign=-1.0) for l in range(2)]
    assert bool((saes[0].threshold < 0).all())
    tc = load_transcoders(saes, dtype=torch.float64)
    assert bool((tc.threshold == 0).all())
    assert_computes_as_sae_lens(tc, saes)


def test_precision_is_kept():
    """A float64 SAE read into a float64 set keeps its digits (before: rounded through float32, 2e-6
    apart); a bfloat16 one becomes float32 exactly."""
    saes = [build("standard", l, seed=l) for l in range(2)]
    tc = load_transcoders(saes, dtype=torch.float64)
    assert torch.equal(tc.W_enc[1], saes[1].W_enc.detach())
    half = [s.to(torch.bfloat16) for s in saes]
    tc = load_transcoders(half)
    assert tc.W_dec.dtype == torch.float32 and torch.equal(tc.W_dec[0], half[0].W_dec.detach().float())


def test_a_scaling_factor_is_refused_until_sae_lens_folds_it():
    saes = [build("jumprelu", l, seed=l, normalize_activations="expected_average_only_in") for l in range(2)]
    with pytest.raises(UnknownFormatError, match=r"fold_activation_norm_scaling_factor") as e:
        load_transcoders(saes)
    assert "\n" not in str(e.value)
    for sae in saes:
        sae.fold_activation_norm_scaling_factor(3.7)
    assert_computes_as_sae_lens(load_transcoders(saes, dtype=torch.float64), saes)


def test_a_whitening_is_refused_until_sae_lens_folds_it():
    saes = [build("topk", l, seed=l, k=5, normalize_activations="covariance_whitening") for l in range(2)]
    with pytest.raises(UnknownFormatError, match=r"fold_activation_whitening"):
        load_transcoders(saes)
    g = torch.Generator().manual_seed(5)
    for sae in saes:
        mean = torch.randn(D, generator=g, dtype=torch.float64)
        M = torch.randn(D, D, generator=g, dtype=torch.float64) + 3 * torch.eye(D, dtype=torch.float64)
        sae.fold_activation_whitening(mean, M, torch.linalg.inv(M))
    assert_computes_as_sae_lens(load_transcoders(saes, dtype=torch.float64), saes)


@pytest.mark.parametrize("norm", ["layer_norm", "constant_norm_rescale"])
def test_a_per_token_normalization_is_refused(norm):
    saes = [build("standard", l, seed=l, normalize_activations=norm) for l in range(2)]
    with pytest.raises(
        UnknownFormatError, match=rf"normalizes its input at run time \('{norm}'\), token by token"
    ):
        load_transcoders(saes)

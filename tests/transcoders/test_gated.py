"""Gated SAEs (Rajamanoharan et al. 2024) against sae_lens's `GatedTrainingSAE`, the oracle, on one layer
with identical weights: the activations, each loss term (reconstruction, the gate's decoder-norm-weighted
L1, the auxiliary reconstruction) and every gradient; and one-process training runs.

Scale: our MSE and auxiliary reconstruction average over `d_model` where sae_lens sums, so ours =
theirs / d_model; with `lam = l1_coefficient / d_model` the whole loss is theirs / d_model too.
The auxiliary reconstruction trains the decoder, as sae_lens's does (the paper's eq. 8 stops that
gradient, with unit-norm decoder columns: `Gated.nested_loss` says why we do not), so every gradient
is compared with sae_lens's whole loss."""

import pytest
import torch
from sae_lens.saes.gated_sae import GatedSAE, GatedSAEConfig, GatedTrainingSAE, GatedTrainingSAEConfig
from sae_lens.saes.sae import SAEMetadata, TrainStepInput

from transcoders import (
    TranscoderConfig,
    UnknownFormatError,
    build_transcoders,
    load_transcoders,
    save_transcoders,
)
from transcoders.base import LossWeights
from transcoders.distributed import Dist

D, S, N = 8, 24, 40
L1 = 0.7
HOOK = "blocks.{layer}.hook_resid_pre"
OURS = {
    "W_enc": "W_enc",
    "b_gate": "b_enc",
    "r_mag": "r_mag",
    "b_mag": "b_mag",
    "W_dec": "W_dec",
    "b_dec": "b_dec",
}


def randomized(sae, seed: int):
    """`sae` with every parameter drawn from `seed` (biases and `r_mag` at 0.3 the scale), so that
    gates open and shut and every path carries signal."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name in OURS:
            p = getattr(sae, name)
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if name.startswith(("b", "r")) else 1.0))
    return sae


def theirs(seed: int = 0) -> GatedTrainingSAE:
    cfg = GatedTrainingSAEConfig(
        d_in=D,
        d_sae=S,
        l1_coefficient=L1,
        apply_b_dec_to_input=False,
        metadata=SAEMetadata(hook_name=HOOK.format(layer=0)),
    )
    sae = GatedTrainingSAE(cfg)
    return randomized(sae, seed)


def ours_like(sae) -> torch.nn.Module:
    cfg = TranscoderConfig(
        kind="sae", n_layers=1, d_model=D, d_sae=S, activation="gated", input_hook=HOOK, output_hook=HOOK
    )
    tc = build_transcoders(cfg)
    with torch.no_grad():
        for name, mine in OURS.items():
            getattr(tc, mine)[0].copy_(getattr(sae, name))
    return tc.train()


def step_input(x):
    return TrainStepInput(
        sae_in=x, coefficients={"l1": L1}, dead_neuron_mask=None, n_training_steps=0, is_logging_step=False
    )


def test_forward_and_each_loss_term_equal_sae_lens():
    sae = theirs()
    tc = ours_like(sae)
    x = torch.randn(N, D, generator=torch.Generator().manual_seed(1))
    out = sae.training_forward_pass(step_input(x))
    res = tc(x[:, None])
    torch.testing.assert_close(res.acts[:, 0], out.feature_acts, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(res.out[:, 0], out.sae_out, rtol=1e-5, atol=1e-6)
    assert 0 < (res.acts > 0).sum() < res.acts.numel()  # some gates open, some shut

    step = tc.train_forward(x[:, None], x[:, None], LossWeights(), lam=L1 / D)
    torch.testing.assert_close(step.mse * D, out.losses["mse_loss"], rtol=1e-5, atol=1e-5)
    nl = tc.nonlinearity
    params = nl.layer_params(tc, None)
    l1 = nl.sparsity(res.acts, res.pre_acts, params, tc.decoder_norms(), LossWeights().penalty)
    torch.testing.assert_close(l1 * L1, out.losses["l1_loss"], rtol=1e-5, atol=1e-5)
    aux = nl.nested_loss(tc, res.acts, res.out, x[:, None], Dist(), res.pre_acts)
    torch.testing.assert_close(aux * D, out.losses["auxiliary_reconstruction_loss"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(step.loss * D, out.loss, rtol=1e-5, atol=1e-5)


def grads(sae, loss):
    sae.zero_grad()
    loss.backward()
    return {name: getattr(sae, name).grad.clone() for name in OURS}


def test_gradients_equal_sae_lens():
    sae = theirs(seed=2)
    tc = ours_like(sae)
    x = torch.randn(N, D, generator=torch.Generator().manual_seed(3))
    out = sae.training_forward_pass(step_input(x))
    whole = grads(sae, out.loss)
    out = sae.training_forward_pass(step_input(x))
    no_aux = grads(sae, out.loss - out.losses["auxiliary_reconstruction_loss"])
    tc.zero_grad()
    (tc.train_forward(x[:, None], x[:, None], LossWeights(), lam=L1 / D).loss * D).backward()
    for name, mine in OURS.items():
        torch.testing.assert_close(getattr(tc, mine).grad[0], whole[name], rtol=1e-4, atol=1e-5, msg=name)
    assert not torch.allclose(whole["W_dec"], no_aux["W_dec"])  # the auxiliary term reaches the decoder


def test_one_process_training_runs(tmp_path):
    from tests.transcoders.tc_helpers import tiny_model
    from tests.transcoders.test_train import random_sequences, small_cfg
    from transcoders.train import train

    tc, _ = train(
        small_cfg(tmp_path, activation="gated", n_tokens=256 * 6),
        model=tiny_model(),
        sequences=random_sequences(),
        progress=False,
    )
    assert tc.cfg.activation == "gated" and torch.isfinite(tc.r_mag).all() and (tc.r_mag != 0).any()


@pytest.mark.parametrize(
    "format, match",
    [
        ("circuit-tracer", "circuit-tracer has no gated activation; save a gated set in the native format."),
        ("gemmascope", "GemmaScope files hold per-layer JumpReLU sets, not a plt with gated"),
    ],
)
def test_formats_without_a_magnitude_path_refuse_a_gated_set(tmp_path, format, match):
    """circuit-tracer's and GemmaScope's files have no `r_mag` / `b_mag`: saving there would silently
    turn the set into a ReLU or JumpReLU one."""
    tc = build_transcoders(TranscoderConfig(kind="plt", n_layers=2, d_model=D, d_sae=S, activation="gated"))
    with pytest.raises(UnknownFormatError, match=match):
        save_transcoders(tc, tmp_path, format=format)


def test_a_native_save_reads_back_the_same_set(tmp_path):
    tc = ours_like(theirs(seed=4)).eval()
    save_transcoders(tc, tmp_path)
    back = load_transcoders(tmp_path)
    x = torch.randn(N, 1, D, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        torch.testing.assert_close(back(x).out, tc(x).out, rtol=0, atol=0)


def sae_lens_gated(seed: int, apply_b_dec_to_input: bool) -> GatedSAE:
    cfg = GatedSAEConfig(
        d_in=D,
        d_sae=S,
        apply_b_dec_to_input=apply_b_dec_to_input,
        metadata=SAEMetadata(hook_name=HOOK.format(layer=0)),
    )
    sae = GatedSAE(cfg)
    return randomized(sae, seed)


@pytest.mark.parametrize("apply_b_dec_to_input", [False, True])
def test_a_set_sae_lens_saved_reads_back_as_it_runs(tmp_path, apply_b_dec_to_input):
    """sae_lens's own `GatedSAE.save_model` directory, read by `load_transcoders`, runs as sae_lens
    runs it (with `apply_b_dec_to_input`, `b_dec` is folded into both encoder biases)."""
    sae = sae_lens_gated(6, apply_b_dec_to_input)
    sae.save_model(tmp_path / "layer_0")
    loaded = load_transcoders(tmp_path)
    x = torch.randn(N, D, generator=torch.Generator().manual_seed(7))
    assert loaded.cfg.activation == "gated" and loaded.cfg.kind == "sae"
    with torch.no_grad():
        got, want = loaded(x[:, None]).acts[:, 0], sae.encode(x)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(loaded(x[:, None]).out[:, 0], sae(x), rtol=1e-5, atol=1e-5)
    assert 0 < (got > 0).sum() < got.numel()


def test_a_set_we_save_to_sae_lens_runs_there_as_here(tmp_path):
    tc = ours_like(theirs(seed=8)).eval()
    save_transcoders(tc, tmp_path, format="sae-lens")
    oracle = GatedSAE.load_from_disk(str(tmp_path / "layer_0"))
    x = torch.randn(N, D, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        torch.testing.assert_close(tc(x[:, None]).acts[:, 0], oracle.encode(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(tc(x[:, None]).out[:, 0], oracle(x), rtol=1e-5, atol=1e-5)


def test_sae_lens_has_no_gated_transcoder_so_saving_one_is_refused(tmp_path):
    tc = build_transcoders(TranscoderConfig(kind="plt", n_layers=1, d_model=D, d_sae=S, activation="gated"))
    with pytest.raises(UnknownFormatError, match="sae_lens has no gated transcoder"):
        save_transcoders(tc, tmp_path, format="sae-lens")
    assert not any(tmp_path.iterdir())


def test_one_process_training_resumes_exactly(tmp_path):
    """A run stopped and rerun resumes to the uninterrupted run's weights, `r_mag` and `b_mag` (and
    their Adam moments) included."""
    from tests.transcoders.tc_helpers import tiny_model
    from tests.transcoders.test_train import random_sequences, small_cfg
    from transcoders.train import train

    model, seqs = tiny_model(), random_sequences()
    kw = dict(activation="gated", n_tokens=256 * 12, checkpoint_every=4)
    straight, _ = train(small_cfg(tmp_path / "a", **kw), model=model, sequences=seqs, progress=False)
    cfg = small_cfg(tmp_path / "b", **kw)
    assert train(cfg, model=model, sequences=seqs, progress=False, stop_after=5)[1] == {"stopped_at": 5}
    resumed, _ = train(cfg, model=model, sequences=seqs, progress=False)
    for k, v in straight.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[k], v, rtol=0, atol=0, msg=k)
    assert {"r_mag", "b_mag"} <= set(straight.state_dict())

"""sae_lens SAEs and transcoders, built here with random weights: objects and saved directories
read; our sets written with `format="sae-lens"` read back by us and by sae_lens itself."""

import pytest
import torch
from sae_lens import JumpReLUSAE, JumpReLUSAEConfig, StandardSAE, StandardSAEConfig, TopKSAE, TopKSAEConfig
from sae_lens.saes.sae import SAEMetadata
from sae_lens.saes.transcoder import (
    JumpReLUSkipTranscoder,
    JumpReLUSkipTranscoderConfig,
    JumpReLUTranscoder,
    JumpReLUTranscoderConfig,
    SkipTranscoder,
    SkipTranscoderConfig,
    Transcoder,
)

from tests.transcoders.tc_helpers import random_set
from transcoders import CorruptTranscoderError, UnknownFormatError, load_transcoders, save_transcoders

D, S = 16, 24


def build(arch: str, layer: int, seed: int):
    hook = f"blocks.{layer}.hook_attn_out"
    meta = SAEMetadata(hook_name=hook)
    tmeta = SAEMetadata(
        hook_name=f"blocks.{layer}.ln2.hook_normalized", hook_name_out=f"blocks.{layer}.hook_mlp_out"
    )
    sae = {
        "standard": lambda: StandardSAE(StandardSAEConfig(d_in=D, d_sae=S, metadata=meta)),
        "jumprelu": lambda: JumpReLUSAE(JumpReLUSAEConfig(d_in=D, d_sae=S, metadata=meta)),
        "topk": lambda: TopKSAE(TopKSAEConfig(d_in=D, d_sae=S, k=5, metadata=meta)),
        "skip_transcoder": lambda: SkipTranscoder(
            SkipTranscoderConfig(d_in=D, d_sae=S, d_out=D, apply_b_dec_to_input=False, metadata=tmeta)
        ),
        "jumprelu_transcoder": lambda: JumpReLUTranscoder(
            JumpReLUTranscoderConfig(d_in=D, d_sae=S, d_out=D, apply_b_dec_to_input=False, metadata=tmeta)
        ),
        "jumprelu_skip_transcoder": lambda: JumpReLUSkipTranscoder(
            JumpReLUSkipTranscoderConfig(d_in=D, d_sae=S, d_out=D, apply_b_dec_to_input=False, metadata=tmeta)
        ),
    }[arch]()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in sae.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        if hasattr(sae, "threshold"):
            sae.threshold.abs_()
    return sae.eval()


ARCHS = ["standard", "jumprelu", "topk", "skip_transcoder", "jumprelu_transcoder", "jumprelu_skip_transcoder"]


@pytest.mark.parametrize("arch", ARCHS)
def test_objects_and_saved_dirs_match_sae_lens(tmp_path, arch):
    saes = [build(arch, l, seed=l) for l in range(2)]
    from_objects = load_transcoders(saes[::-1])  # any order: placed by hook name
    for l, sae in enumerate(saes):
        sae.save_model(tmp_path / f"layer_{l}")
    from_dir = load_transcoders(tmp_path)
    x = torch.randn(6, 2, D)
    for tc in (from_objects, from_dir):
        assert tc.cfg.kind == ("plt" if "transcoder" in arch else "sae")
        res = tc(x)
        for l, sae in enumerate(saes):
            with torch.no_grad():
                torch.testing.assert_close(res.out[:, l], sae(x[:, l]), rtol=1e-4, atol=1e-4)
                torch.testing.assert_close(res.acts[:, l], sae.encode(x[:, l]), rtol=1e-4, atol=1e-4)
    assert from_dir.cfg.input_hook == (
        "blocks.{layer}.ln2.hook_normalized" if "transcoder" in arch else "blocks.{layer}.hook_attn_out"
    )


def test_missing_layer_and_mixed_kinds(tmp_path):
    with pytest.raises(CorruptTranscoderError, match=r"layers \[0\]"):
        load_transcoders([build("standard", 1, 0)])
    with pytest.raises(CorruptTranscoderError, match="differs"):
        load_transcoders([build("standard", 0, 0), build("jumprelu", 1, 0)])


def test_run_time_normalization_is_refused():
    sae = StandardSAE(
        StandardSAEConfig(
            d_in=D,
            d_sae=S,
            normalize_activations="layer_norm",
            metadata=SAEMetadata(hook_name="blocks.0.hook_attn_out"),
        )
    )
    with pytest.raises(UnknownFormatError, match="normalizes"):
        load_transcoders(sae)


# ------------------------------------------------------------------ writing
WRITABLE = [  # (kind, activation, skip) and the sae_lens class that must load each layer
    ("sae", "relu", False, StandardSAE),
    ("sae", "jumprelu", False, JumpReLUSAE),
    ("sae", "topk", False, TopKSAE),
    ("sae", "batchtopk", False, JumpReLUSAE),
    ("plt", "relu", False, Transcoder),
    ("plt", "relu", True, SkipTranscoder),
    ("plt", "jumprelu", False, JumpReLUTranscoder),
    ("plt", "jumprelu", True, JumpReLUSkipTranscoder),
    ("plt", "batchtopk", False, JumpReLUTranscoder),
    ("plt", "batchtopk", True, JumpReLUSkipTranscoder),
]
SAME = (
    "kind",
    "n_layers",
    "d_model",
    "d_sae",
    "input_hook",
    "output_hook",
    "skip",
    "output_before_post_norm",
)


def writable_set(kind, activation, skip, seed=0):
    tc = random_set(
        kind,
        activation,
        skip=skip,
        n_layers=3,
        seed=seed,
        model_name="tiny",
        output_before_post_norm=kind == "plt",
    )
    if activation == "batchtopk":  # a trained-looking threshold: one value per layer
        with torch.no_grad():
            tc.threshold.copy_(torch.tensor([0.2, 0.3, 0.4])[:, None].expand_as(tc.threshold))
    return tc.eval()


@pytest.mark.parametrize("kind, activation, skip, sl_cls", WRITABLE)
def test_written_sets_read_back_by_us_and_by_sae_lens(tmp_path, kind, activation, skip, sl_cls):
    tc = writable_set(kind, activation, skip)
    save_transcoders(tc, tmp_path, format="sae-lens")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["layer_0", "layer_1", "layer_2"]

    back = load_transcoders(tmp_path)
    assert {f: getattr(back.cfg, f) for f in SAME} == {f: getattr(tc.cfg, f) for f in SAME}
    assert back.cfg.model_name == "tiny"
    assert back.cfg.activation == ("jumprelu" if activation == "batchtopk" else activation)
    if activation == "topk":
        assert back.cfg.k == tc.cfg.k
    x = torch.randn(6, 3, 32, generator=torch.Generator().manual_seed(1))
    want, got = tc(x), back(x)
    if activation != "relu":  # thresholds / k cut some positive pre-activations: the rule is tested
        assert ((want.pre_acts > 0) & (want.acts == 0)).any()
    torch.testing.assert_close(got.acts, want.acts, rtol=0, atol=0)
    torch.testing.assert_close(got.out, want.out, rtol=0, atol=0)

    for l in range(3):
        sae = sl_cls.load_from_disk(tmp_path / f"layer_{l}")
        assert type(sae) is sl_cls
        assert sae.cfg.metadata.hook_name == tc.cfg.hook_in(l)
        assert sae.cfg.metadata.hook_name_out == (tc.cfg.hook_out(l) if kind == "plt" else None)
        if activation == "topk":
            assert sae.cfg.k == tc.cfg.k
        with torch.no_grad():
            torch.testing.assert_close(sae.encode(x[:, l]), want.acts[:, l], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(sae(x[:, l]), want.out[:, l], rtol=1e-5, atol=1e-6)


def negative_threshold():
    tc = random_set("plt", "jumprelu")
    with torch.no_grad():
        tc.threshold[0, 0] = -0.1
    return tc


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: random_set("clt", "jumprelu"), "cross-layer"),
        (lambda: random_set("clt", "relu", skip=True), "cross-layer"),
        (lambda: random_set("plt", "topk"), "TopK transcoder"),
        (lambda: random_set("plt", "topk", skip=True), "TopK transcoder"),
        (negative_threshold, "negative"),
        (lambda: random_set("plt", input_hook="layers.{layer}.mlp_in"), "per-block"),
    ],
)
def test_sets_sae_lens_cannot_hold_are_refused_before_writing(tmp_path, make, match):
    with pytest.raises(UnknownFormatError, match=match):
        save_transcoders(make(), tmp_path / "out", format="sae-lens")
    assert not (tmp_path / "out").exists()


def test_each_sae_lens_architecture_holds_the_tensors_its_nonlinearity_names():
    """The architectures the nonlinearities read (nonlinearity.py step 13) are the table sae_lens
    defines, and sae_lens's own class of each holds exactly our weights under the nonlinearity's names:
    `b_enc` as its `sae_lens.b_enc`, its `extra_state`, and `W_skip` for a skip transcoder."""
    import dataclasses

    from sae_lens.registry import get_sae_class

    from transcoders.nonlinearity import sae_lens_architectures

    found = sae_lens_architectures()
    want = {
        "standard": ("relu", "sae"),
        "transcoder": ("relu", "transcoder"),
        "skip_transcoder": ("relu", "skip_transcoder"),
        "jumprelu": ("jumprelu", "sae"),
        "jumprelu_transcoder": ("jumprelu", "transcoder"),
        "jumprelu_skip_transcoder": ("jumprelu", "skip_transcoder"),
        "topk": ("topk", "sae"),
        "gated": ("gated", "sae"),
    }
    assert {arch: (nl.name, role) for arch, (nl, role) in found.items()} == want
    for arch, (nl, role) in found.items():
        sae_cls, cfg_cls = get_sae_class(arch)
        kw = {"d_in": 4, "d_sae": 6, "device": "meta", "apply_b_dec_to_input": False}
        has_d_out = "d_out" in {f.name for f in dataclasses.fields(cfg_cls)}
        assert has_d_out == (role != "sae"), arch
        if has_d_out:
            kw["d_out"] = 4
        keys = {"W_enc", nl.sae_lens.b_enc, "W_dec", "b_dec", *nl.extra_state}
        keys |= {"W_skip"} if role == "skip_transcoder" else set()
        assert set(sae_cls(cfg_cls(**kw)).state_dict()) == keys, arch


def test_a_folder_of_layers_is_read_one_object_at_a_time(tmp_path, monkeypatch):
    """Step 9: each layer's sae_lens object is read when its turn comes and gone before the next
    is read (weak references to every object sae_lens made), and the set equals sae_lens's own."""
    import weakref

    from transcoders.formats import sae_lens as reader

    saes = [build("jumprelu_transcoder", l, seed=l) for l in range(4)]
    for l, sae in enumerate(saes):
        sae.save_model(tmp_path / f"layer_{l}")
    made, alive_at_each_read = [], []
    real = reader._load_dir

    def tracked(path):
        alive_at_each_read.append(sum(r() is not None for r in made))
        sae = real(path)
        made.append(weakref.ref(sae))
        return sae

    monkeypatch.setattr(reader, "_load_dir", tracked)
    tc = load_transcoders(tmp_path)
    assert alive_at_each_read == [0, 0, 0, 0]
    x = torch.randn(6, 4, D)
    with torch.no_grad():
        for l, sae in enumerate(saes):
            torch.testing.assert_close(tc(x).out[:, l], sae(x[:, l]), rtol=1e-4, atol=1e-4)

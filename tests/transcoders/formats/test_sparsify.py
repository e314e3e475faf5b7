"""EleutherAI sparsify transcoders (transcoders/formats/sparsify.py): folders written by sparsify's own
`SparseCoder.save_to_disk` read as sparsify computes them (its `encode` and forward are the oracle,
in float64); the MLP module's input, captured by a torch hook on the module, is what the set reads;
our TopK sets written so that sparsify's `load_from_disk` reads them back."""

import json

import pytest
import torch

from tests.transcoders.tc_helpers import random_set
from transcoders import (
    CorruptTranscoderError,
    UnknownFormatError,
    load_transcoders,
    save_transcoders,
)
from transcoders.formats import detect_format

sparsify = pytest.importorskip("sparsify")  # the test extra installs eai-sparsify

D, M, K = 16, 48, 5


def coder(seed: int, skip=True, dtype=torch.float64, d_in=D, **cfg):
    sc = sparsify.SparseCoder(
        d_in,
        sparsify.SparseCoderConfig(num_latents=M, k=K, skip_connection=skip, transcode=True, **cfg),
        dtype=dtype,
    )
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in sc.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64).to(p.dtype) * 0.5)
    return sc


def saved(tmp_path, n_layers=3, prefix="layers", **kw):
    coders = [coder(l, **kw) for l in range(n_layers)]
    for l, sc in enumerate(coders):
        sc.save_to_disk(tmp_path / f"{prefix}.{l}.mlp")
    return coders


def sparsify_out(sc, x):
    """sparsify's dense activations and output of one coder on `x` [n, d_in]."""
    with torch.no_grad():
        enc = sc.encode(x)
        acts = torch.zeros(x.shape[0], M, dtype=x.dtype).scatter(
            -1, enc.top_indices, enc.top_acts.to(x.dtype)
        )
        return acts, sc(x).sae_out


@pytest.mark.parametrize("skip", [True, False])
def test_read_as_sparsify_computes(tmp_path, skip):
    coders = saved(tmp_path, skip=skip)
    assert detect_format(tmp_path) == "sparsify"
    tc = load_transcoders(tmp_path, dtype=torch.float64)
    assert (tc.cfg.kind, tc.cfg.k, tc.cfg.skip, tc.cfg.n_layers) == ("plt", K, skip, 3)
    assert tc.cfg.folded_norms is False and tc.cfg.output_before_post_norm
    x = torch.randn(40, 3, D, generator=torch.Generator().manual_seed(9), dtype=torch.float64)
    res = tc(x)
    for l, sc in enumerate(coders):
        acts, out = sparsify_out(sc, x[:, l])
        assert acts.count_nonzero() > 0
        torch.testing.assert_close(res.acts[:, l], acts, rtol=0, atol=1e-12)
        torch.testing.assert_close(res.out[:, l], out, rtol=0, atol=1e-12)


def test_one_coder_folder_and_gpt2_names_and_bfloat16(tmp_path):
    coders = saved(tmp_path, n_layers=1, prefix="h", dtype=torch.bfloat16)
    tc = load_transcoders(tmp_path / "h.0.mlp", format="sparsify", model_name="gpt2")
    assert tc.cfg.model_name == "gpt2" and tc.W_enc.dtype == torch.float32
    assert torch.equal(tc.W_enc[0], coders[0].encoder.weight.detach().float().T)


def test_a_bfloat16_set_is_read_into_bfloat16_as_stored(tmp_path):
    """The set is allocated once in the dtype asked for and filled from the files (no float32 copy)."""
    coders = saved(tmp_path, n_layers=2, dtype=torch.bfloat16)
    tc = load_transcoders(tmp_path, dtype=torch.bfloat16)
    assert {p.dtype for p in tc.parameters()} == {torch.bfloat16}
    for l, sc in enumerate(coders):
        assert torch.equal(tc.W_enc[l], sc.encoder.weight.detach().T)
        assert torch.equal(tc.W_skip[l], sc.W_skip.detach().T)
        assert torch.equal(tc.b_dec[l], sc.b_dec.detach())


def test_integer_weights_are_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    saved(tmp_path, n_layers=2, dtype=torch.float32)
    path = tmp_path / "layers.1.mlp" / "sae.safetensors"
    tensors = load_file(path) | {"W_dec": torch.zeros(M, D, dtype=torch.int32)}
    save_file(tensors, path)
    with pytest.raises(CorruptTranscoderError, match=r"W_dec holds I32 values, not floating point"):
        load_transcoders(tmp_path)


def test_the_mlp_modules_input_is_what_the_set_reads(tmp_path):
    """sparsify hooks the MLP module: its input, captured here by a torch hook on `blocks[i].mlp`, is
    what the set reads (sites.collect), and its output is the set's output on that input."""
    from tests.transcoders.tc_helpers import tiny_model
    from transcoders.sites import collect

    model = tiny_model(seed=3).double()
    model.cfg.dtype = torch.float64
    coders = [coder(l, d_in=model.cfg.d_model) for l in range(model.cfg.n_layers)]
    for l, sc in enumerate(coders):
        sc.save_to_disk(tmp_path / f"layers.{l}.mlp")
    tc = load_transcoders(tmp_path, dtype=torch.float64)
    seen = {}
    handles = [
        model.blocks[l].mlp.register_forward_pre_hook(
            lambda m, args, l=l: seen.__setitem__(l, args[0].detach())
        )
        for l in range(model.cfg.n_layers)
    ]
    tokens = torch.tensor([[1, 7, 3, 9, 4, 2]])
    try:
        model(tokens)
    finally:
        for h in handles:
            h.remove()
    read, _ = collect(model, tokens, tc.cfg)
    res = tc(read[0])
    for l, sc in enumerate(coders):
        torch.testing.assert_close(read[0, :, l], seen[l][0], rtol=0, atol=1e-12)
        torch.testing.assert_close(res.out[:, l], sparsify_out(sc, seen[l][0])[1], rtol=0, atol=1e-12)


def test_written_sets_are_read_back_by_sparsify(tmp_path):
    tc = random_set("plt", "topk", skip=True, folded_norms=False)
    save_transcoders(tc, tmp_path / "sf", format="sparsify")
    assert sorted(p.name for p in (tmp_path / "sf").iterdir()) == ["layers.0.mlp", "layers.1.mlp"]
    x = torch.randn(20, 2, tc.cfg.d_model, generator=torch.Generator().manual_seed(2))
    res = tc(x)
    for l in range(2):
        sc = sparsify.SparseCoder.load_from_disk(tmp_path / "sf" / f"layers.{l}.mlp")
        assert sc.cfg.transcode and sc.cfg.k == tc.cfg.k == 8
        with torch.no_grad():
            torch.testing.assert_close(sc(x[:, l]).sae_out, res.out[:, l], rtol=1e-5, atol=1e-5)
    back = load_transcoders(tmp_path / "sf")
    assert torch.equal(back.W_skip, tc.W_skip) and torch.equal(back.W_enc, tc.W_enc)


def test_a_gpt2_hookpoint_template(tmp_path):
    from transcoders.formats.sparsify import save_sparsify

    tc = random_set("plt", "topk")
    save_sparsify(tc, tmp_path, hookpoint="h.{layer}.mlp")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["h.0.mlp", "h.1.mlp"]
    with pytest.raises(UnknownFormatError, match=r"does not name layer \{layer\}'s MLP module"):
        save_sparsify(tc, tmp_path / "x", hookpoint="layers.{layer}.attn")


def _edit_cfg(folder, **changes):
    path = folder / "cfg.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | changes))


@pytest.mark.parametrize(
    "edit, error, match",
    [
        (
            lambda d: _edit_cfg(d / "layers.1.mlp", transcode=False),
            UnknownFormatError,
            r"is an SAE \(transcode false",
        ),
        (
            lambda d: (d / "layers.2.mlp").rename(d / "layers.2"),
            UnknownFormatError,
            r"'layers\.2' is not of an MLP module",
        ),
        (
            lambda d: _edit_cfg(d / "layers.0.mlp", activation="groupmax"),
            CorruptTranscoderError,
            r"differs from",
        ),
        (
            lambda d: [_edit_cfg(d / f"layers.{l}.mlp", activation="groupmax") for l in range(3)],
            UnknownFormatError,
            r"activation 'groupmax' is not one we read",
        ),
        (lambda d: _edit_cfg(d / "layers.2.mlp", k=7), CorruptTranscoderError, r"k 7 vs 5"),
        (
            lambda d: (d / "layers.1.mlp").rename(d / "layers.4.mlp"),
            CorruptTranscoderError,
            r"no sparsify coder for layers \[1, 3\]",
        ),
        (
            lambda d: (d / "layers.0.mlp" / "cfg.json").write_text("{"),
            CorruptTranscoderError,
            r"is not readable JSON",
        ),
        (
            lambda d: (d / "layers.0.mlp" / "sae.safetensors").write_bytes(b"\x00" * 10),
            CorruptTranscoderError,
            r"could not be read",
        ),
    ],
    ids=["sae", "not-mlp", "mixed", "groupmax", "mixed-k", "missing-layer", "bad-json", "bad-weights"],
)
def test_what_we_cannot_read_is_one_sentence(tmp_path, edit, error, match):
    saved(tmp_path, dtype=torch.float32)
    edit(tmp_path)
    with pytest.raises(error, match=match) as e:
        load_transcoders(tmp_path)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: random_set("plt", "jumprelu"), r"not a JumpReLU plt set"),
        (lambda: random_set("clt", "topk"), r"not a clt set"),
        (lambda: random_set("sae", "topk"), r"not a sae set"),
        (lambda: random_set("plt", "topk", folded_norms=True), r"with them folded"),
        (
            lambda: random_set("plt", "topk", input_hook="blocks.{layer}.hook_resid_mid"),
            r"replace an MLP module",
        ),
    ],
    ids=["jumprelu", "clt", "sae", "folded", "other-site"],
)
def test_what_sparsify_cannot_hold_is_refused_before_writing(tmp_path, make, match):
    with pytest.raises(UnknownFormatError, match=match):
        save_transcoders(make(), tmp_path / "out", format="sparsify")
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())

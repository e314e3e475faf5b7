"""Formats: ours round trips; circuit-tracer's read (files written here with its keys) and written;
GemmaScope npz; bad input gets a specific error."""

import json
import os
from dataclasses import replace

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import save_file

from tests.transcoders.tc_helpers import random_set
from transcoders import (
    CorruptTranscoderError,
    TranscoderNotFoundError,
    UnknownFormatError,
    load_transcoders,
    save_transcoders,
)
from transcoders.manifest import sha256


def assert_same_set(a, b, ignore=()):
    assert replace(a.cfg, **{f: getattr(b.cfg, f) for f in ignore}) == b.cfg
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for k in sa:
        torch.testing.assert_close(sa[k], sb[k], rtol=0, atol=0)


@pytest.mark.parametrize(
    "kind, activation, skip",
    [
        ("sae", "relu", False),
        ("plt", "jumprelu", True),
        ("plt", "topk", False),
        ("clt", "jumprelu", False),
        ("clt", "relu", True),
    ],
)
def test_native_round_trip(tmp_path, kind, activation, skip):
    tc = random_set(kind, activation, skip=skip, n_layers=3)
    save_transcoders(tc, tmp_path / "set")
    back = load_transcoders(tmp_path / "set")
    assert type(back) is type(tc)
    assert_same_set(tc, back)
    x = torch.randn(4, 3, 32)
    torch.testing.assert_close(back(x).out, tc(x).out, rtol=0, atol=0)


def test_native_truncated_weights(tmp_path):
    save_transcoders(random_set("plt"), tmp_path)
    w = tmp_path / "weights.safetensors"
    w.write_bytes(w.read_bytes()[: w.stat().st_size // 2])
    with pytest.raises(CorruptTranscoderError, match="truncated"):
        load_transcoders(tmp_path)


def test_native_manifest_checksum(tmp_path):
    save_transcoders(random_set("plt"), tmp_path)
    w = tmp_path / "weights.safetensors"
    (tmp_path / "manifest.json").write_text(json.dumps({"files": {"weights.safetensors": sha256(w)}}))
    load_transcoders(tmp_path)
    (tmp_path / "manifest.json").write_text(json.dumps({"files": {"weights.safetensors": "0" * 64}}))
    with pytest.raises(CorruptTranscoderError, match="sha256"):
        load_transcoders(tmp_path)


def test_native_shape_mismatch(tmp_path):
    save_transcoders(random_set("plt"), tmp_path)
    meta = json.loads((tmp_path / "config.json").read_text())
    meta["config"]["d_sae"] = 7
    (tmp_path / "config.json").write_text(json.dumps(meta))
    with pytest.raises(CorruptTranscoderError, match="shape"):
        load_transcoders(tmp_path)


def test_unknown_and_missing(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(UnknownFormatError, match="no format"):
        load_transcoders(tmp_path)
    with pytest.raises(TranscoderNotFoundError):
        load_transcoders(tmp_path / "absent")
    with pytest.raises(UnknownFormatError):
        load_transcoders(tmp_path, format="pickle")
    with pytest.raises(UnknownFormatError):
        save_transcoders(random_set("plt"), tmp_path / "x", format="pickle")
    os.mkfifo(tmp_path / "fifo")  # neither a folder nor a file (as /dev/null is): was NotADirectoryError
    for odd in (tmp_path / "fifo", "/dev/null"):
        with pytest.raises(UnknownFormatError, match="is neither a directory nor a file; pass the directory"):
            load_transcoders(odd)


# ------------------------------------------------------------------ circuit-tracer
def write_ct_plt(
    folder, n_layers, d_model, d_tc, skip, in_hook="mlp.hook_in", out_hook="mlp.hook_out", seed=0
):
    """The files ct_graph.py's save_all writes (SingleLayerTranscoder.to_safetensors keys and orientation)."""
    g = torch.Generator().manual_seed(seed)
    folder.mkdir(parents=True, exist_ok=True)
    layers = []
    for i in range(n_layers):
        d = {
            "W_enc": torch.randn(d_tc, d_model, generator=g),
            "W_dec": torch.randn(d_tc, d_model, generator=g),
            "b_enc": torch.randn(d_tc, generator=g),
            "b_dec": torch.randn(d_model, generator=g),
            "activation_function.threshold": torch.rand(d_tc, generator=g),
        }
        if skip:
            d["W_skip"] = torch.randn(d_model, d_model, generator=g)
        save_file(d, str(folder / f"layer_{i}.safetensors"))
        layers.append(d)
    cfg = dict(
        model_kind="transcoder_set",
        model_name=None,
        feature_input_hook=in_hook,
        feature_output_hook=out_hook,
        scan="peer-harness-seed-0",
    )
    (folder / "config.yaml").write_text(yaml.dump(cfg))
    return layers


def write_ct_clt(folder, n_layers, d_model, d_tc, seed=0):
    """The files CrossLayerTranscoder.to_safetensors writes."""
    g = torch.Generator().manual_seed(seed)
    folder.mkdir(parents=True, exist_ok=True)
    enc, dec = [], []
    for i in range(n_layers):
        e = {
            f"W_enc_{i}": torch.randn(d_tc, d_model, generator=g),
            f"b_enc_{i}": torch.randn(d_tc, generator=g),
            f"b_dec_{i}": torch.randn(d_model, generator=g),
            f"threshold_{i}": torch.rand(d_tc, generator=g),
        }
        d = {f"W_dec_{i}": torch.randn(d_tc, n_layers - i, d_model, generator=g)}
        save_file(e, str(folder / f"W_enc_{i}.safetensors"))
        save_file(d, str(folder / f"W_dec_{i}.safetensors"))
        enc.append(e)
        dec.append(d)
    cfg = dict(
        model_kind="cross_layer_transcoder",
        model_name=None,
        feature_input_hook="mlp.hook_in",
        feature_output_hook="mlp.hook_out",
        scan="x",
    )
    (folder / "config.yaml").write_text(yaml.dump(cfg))
    return enc, dec


@pytest.mark.parametrize("skip", [False, True])
def test_read_circuit_tracer_plt(tmp_path, skip):
    layers = write_ct_plt(tmp_path, 2, 16, 24, skip)
    tc = load_transcoders(tmp_path)
    assert tc.cfg.kind == "plt" and tc.cfg.activation == "jumprelu" and tc.cfg.skip == skip
    assert tc.cfg.input_hook == "blocks.{layer}.ln2.hook_normalized"
    assert tc.cfg.output_hook == "blocks.{layer}.hook_mlp_out" and tc.cfg.output_before_post_norm
    x = torch.randn(5, 2, 16)
    out = tc(x).out
    for i, d in enumerate(layers):  # circuit-tracer's SingleLayerTranscoder arithmetic, by hand
        pre = x[:, i] @ d["W_enc"].T + d["b_enc"]
        acts = pre * (pre > d["activation_function.threshold"])
        want = acts @ d["W_dec"] + d["b_dec"]
        if skip:
            want = want + x[:, i] @ d["W_skip"].T
        torch.testing.assert_close(out[:, i], want, rtol=1e-4, atol=1e-4)


def test_read_circuit_tracer_resid_hooks(tmp_path):
    write_ct_plt(tmp_path, 2, 16, 24, False, in_hook="hook_resid_mid", out_hook="hook_mlp_out")
    tc = load_transcoders(tmp_path)
    assert tc.cfg.input_hook == "blocks.{layer}.hook_resid_mid"
    assert tc.cfg.output_hook == "blocks.{layer}.hook_mlp_out" and not tc.cfg.output_before_post_norm


def test_read_circuit_tracer_clt(tmp_path):
    enc, dec = write_ct_clt(tmp_path, 3, 16, 24)
    tc = load_transcoders(tmp_path)
    assert tc.cfg.kind == "clt" and tc.cfg.n_layers == 3
    x = torch.randn(5, 3, 16)
    out = tc(x).out
    acts = []
    for i, e in enumerate(enc):
        pre = x[:, i] @ e[f"W_enc_{i}"].T + e[f"b_enc_{i}"]
        acts.append(pre * (pre > e[f"threshold_{i}"]))
    for lo in range(3):  # circuit-tracer: output layer lo sums sources i <= lo, plus b_dec[lo]
        want = enc[lo][f"b_dec_{lo}"] + sum(acts[i] @ dec[i][f"W_dec_{i}"][:, lo - i] for i in range(lo + 1))
        torch.testing.assert_close(out[:, lo], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind, skip", [("plt", False), ("plt", True), ("clt", False)])
def test_write_then_read_circuit_tracer(tmp_path, kind, skip):
    tc = random_set(kind, skip=skip, n_layers=3, output_before_post_norm=True, folded_norms=False)
    save_transcoders(tc, tmp_path, format="circuit-tracer")
    meta = yaml.safe_load((tmp_path / "config.yaml").read_text())
    assert meta["feature_input_hook"] == "mlp.hook_in" and meta["feature_output_hook"] == "mlp.hook_out"
    assert_same_set(tc, load_transcoders(tmp_path, format="circuit-tracer"), ignore=("k",))


def test_circuit_tracer_missing_layer(tmp_path):
    write_ct_plt(tmp_path, 3, 8, 8, False)
    (tmp_path / "layer_1.safetensors").unlink()
    with pytest.raises(CorruptTranscoderError, match=r"layers \[1\]"):
        load_transcoders(tmp_path)


def test_circuit_tracer_cannot_hold_topk(tmp_path):
    with pytest.raises(UnknownFormatError, match="TopK"):
        save_transcoders(random_set("plt", "topk"), tmp_path, format="circuit-tracer")


# ------------------------------------------------------------------ GemmaScope
def test_read_gemmascope_params_npz(tmp_path):
    g = np.random.default_rng(0)
    arrays = []
    for l in range(2):
        a = {
            "W_enc": g.normal(size=(16, 24)),
            "W_dec": g.normal(size=(24, 16)),
            "b_enc": g.normal(size=24),
            "b_dec": g.normal(size=16),
            "threshold": g.random(24),
        }
        d = tmp_path / f"layer_{l}" / "width_16k" / "average_l0_10"
        d.mkdir(parents=True)
        np.savez(d / "params.npz", **{k: v.astype(np.float32) for k, v in a.items()})
        arrays.append(a)
    tc = load_transcoders(tmp_path)
    assert tc.cfg.kind == "plt" and tc.cfg.d_model == 16 and tc.cfg.d_sae == 24
    x = torch.randn(3, 2, 16)
    out = tc(x).out
    for l, a in enumerate(arrays):
        t = {k: torch.tensor(v, dtype=torch.float32) for k, v in a.items()}
        pre = x[:, l] @ t["W_enc"] + t["b_enc"]  # GemmaScope stores W_enc as [d_model, d_sae]
        want = (pre * (pre > t["threshold"])) @ t["W_dec"] + t["b_dec"]
        torch.testing.assert_close(out[:, l], want, rtol=1e-4, atol=1e-4)
    # and the writer is its inverse
    save_transcoders(tc, tmp_path / "again", format="gemmascope")
    assert_same_set(tc, load_transcoders(tmp_path / "again"), ignore=("k",))


def test_gemmascope_truncated(tmp_path):
    d = tmp_path / "layer_0"
    d.mkdir()
    np.savez(
        d / "params.npz",
        **{k: np.zeros(4, np.float32) for k in ("W_enc", "W_dec", "b_enc", "b_dec", "threshold")},
    )
    (d / "params.npz").write_bytes((d / "params.npz").read_bytes()[:100])
    with pytest.raises(CorruptTranscoderError):
        load_transcoders(tmp_path)


@pytest.mark.parametrize("kind, activation", [("plt", "relu"), ("plt", "topk"), ("clt", "jumprelu")])
def test_gemmascope_holds_only_per_layer_jumprelu_sets(tmp_path, kind, activation):
    with pytest.raises(UnknownFormatError, match="native"):
        save_transcoders(random_set(kind, activation), tmp_path / "gs", format="gemmascope")
    assert not (tmp_path / "gs" / "layer_0").exists()


@pytest.mark.parametrize("fmt", ["circuit-tracer", "sae-lens", "gemmascope"])
def test_saving_a_smaller_set_over_a_larger_one_is_refused(tmp_path, fmt):
    from transcoders.errors import StaleLayersError

    save_transcoders(random_set("plt", "jumprelu", n_layers=3), tmp_path / "set", format=fmt)
    with pytest.raises(StaleLayersError, match="larger set"):
        save_transcoders(random_set("plt", "jumprelu", n_layers=2), tmp_path / "set", format=fmt)
    save_transcoders(
        random_set("plt", "jumprelu", n_layers=3, seed=1), tmp_path / "set", format=fmt
    )  # same size: fine
    assert load_transcoders(tmp_path / "set").n_layers == 3


@pytest.mark.parametrize("fmt", ["native", "circuit-tracer", "gemmascope", "sae-lens", "sparsify"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.bfloat16])
def test_a_set_is_written_and_read_in_its_own_precision(tmp_path, fmt, dtype):
    """float64 comes back bit for bit (it was rounded through float32: 1e-8 off); bfloat16 too, and
    is stored as bfloat16 where the format can hold it (safetensors), not doubled to float32
    (npz has no bfloat16: float32 there, which holds every bfloat16 value exactly)."""
    from safetensors import safe_open

    kind = "topk" if fmt == "sparsify" else "jumprelu"  # the one nonlinearity sparsify holds
    tc = random_set("plt", kind, n_layers=2, folded_norms=False).to(dtype)
    save_transcoders(tc, tmp_path, format=fmt)
    back = load_transcoders(tmp_path, dtype=dtype)
    assert back.dtype == dtype
    assert_same_set(tc, back, ignore=("k", "output_before_post_norm"))
    if fmt == "circuit-tracer":
        with safe_open(tmp_path / "layer_0.safetensors", "pt") as f:
            assert f.get_tensor("W_enc").dtype == dtype
    if fmt == "gemmascope":
        stored = np.load(tmp_path / "layer_0" / "params.npz")["W_enc"].dtype
        assert stored == (np.float64 if dtype == torch.float64 else np.float32)
    if fmt in ("sae-lens", "sparsify"):
        weights = next(tmp_path.rglob("sae_weights.safetensors" if fmt == "sae-lens" else "sae.safetensors"))
        with safe_open(weights, "pt") as f:
            assert {f.get_tensor(k).dtype for k in f.keys()} == {dtype}
    if fmt == "sae-lens":  # sae_lens's own reader: the same weights, in the same precision
        from sae_lens import SAE

        theirs = SAE.load_from_disk(tmp_path / "layer_1", device="cpu")
        assert theirs.W_enc.dtype == dtype and torch.equal(theirs.W_enc, tc.W_enc[1])
        assert torch.equal(theirs.W_dec, tc.W_dec[1])

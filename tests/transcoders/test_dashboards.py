"""Feature dashboards: answers known by construction or by brute force over the whole corpus,
chunk-size invariance, the HDF5 file (round trip, atomic write, schema version), user labels."""

import json
import os
from dataclasses import asdict

import h5py
import numpy as np
import pytest
import torch

from tests.transcoders.tc_helpers import random_set
from transcoders import DashboardConfig, DashboardFileError, compute_dashboards, load_dashboards, set_labels
from transcoders.dashboard_file import auto_labels, read_user_labels, write_dashboards
from transcoders.dashboards import DashboardAccumulator, accumulate, main
from transcoders.paths import BUNDLED
from transcoders.sites import collect

TOKEN = 7  # the token feature 0 of layer 0 is built to read


def corpus(n=40, n_ctx=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    seqs = torch.randint(1, 50, (n, n_ctx), generator=g)
    seqs[:, 0] = 0  # a BOS-like first token
    seqs[n // 2 : n // 2 + 4] = seqs[:4]  # repeated sequences: exact ties between activations
    return seqs


def small_cfg(**kw):
    base = dict(n_top=5, n_quantiles=3, n_per_quantile=2, reservoir=12, before=3, after=2, n_logits=4)
    base.update(kw)
    return DashboardConfig(progress=False, n_tokens=10**6, **base)


def aligned_set(model, kind="plt"):
    """A random set whose feature (0, 0) reads the direction of TOKEN's MLP input: it fires most on TOKEN."""
    tc = random_set(kind, n_layers=2, d_model=32, d_sae=48, seed=1)
    x, _ = collect(model, corpus(seed=5), tc.cfg)
    x0 = x[:, 1:, 0].flatten(0, 1)
    toks = corpus(seed=5)[:, 1:].flatten()
    d = x0[toks == TOKEN].mean(0) - x0.mean(0)
    with torch.no_grad():
        tc.W_enc[0, :, 0] = d / d.norm() * 3
        tc.b_enc[0, 0] = -(x0 @ tc.W_enc[0, :, 0]).median()
    return tc


@pytest.fixture
def setup(model):
    return model, aligned_set(model)


def brute_acts(model, tc, seqs):
    x, _ = collect(model, seqs, tc.cfg)
    with torch.no_grad():
        return tc.activation(tc.encode(x))  # [n, n_ctx, L, S]


def test_feature_aligned_to_a_token_fires_most_on_it(setup, tmp_path):
    model, tc = setup
    d = load_dashboards(
        compute_dashboards(small_cfg(), model=model, tc=tc, sequences=corpus(), out=tmp_path / "d.h5")
    )
    centers = d["top/tokens"][0, 0, :, 3]
    assert (centers == TOKEN).all(), centers
    assert d.label(0, 0).startswith(f'"{TOKEN}"'), d.label(0, 0)
    ex = d.feature(0, 0)["top"][0]
    assert ex["tokens"][ex["center"]] == str(TOKEN)
    assert abs(ex["acts"][ex["center"]] - ex["act"]) <= ex["act"] / 255
    np.testing.assert_allclose(d.frequency(), d["stats/count"] / d.attrs["n_counted"])


def test_statistics_and_examples_equal_brute_force(setup):
    model, tc = setup
    seqs = corpus()
    cfg = small_cfg()
    acc = accumulate(model, tc, seqs, cfg)
    out, counts = acc.result()
    acts = brute_acts(model, tc, seqs)
    a = acts[:, 1:].flatten(0, 1)  # [N, L, S], position 0 not counted
    active = a > 0
    assert counts["n_counted"] == a.shape[0]
    np.testing.assert_array_equal(out["stats/count"], active.sum(0).numpy())
    big = torch.where(active, a, float("inf")).amin(0)
    np.testing.assert_array_equal(out["stats/min"], torch.where(active.any(0), big, 0.0).numpy())
    np.testing.assert_array_equal(out["stats/max"], a.amax(0).clamp(min=0).numpy())
    mean = (a.double() * active).sum(0) / active.sum(0).clamp(min=1)
    np.testing.assert_allclose(out["stats/mean"], mean.float().numpy(), rtol=1e-5)
    edges = out["hist/edges"].astype(np.float64)
    for l, i in [(0, 0), (1, 5), (0, 17)]:
        v = a[:, l, i][active[:, l, i]].double().numpy()
        h = np.histogram(np.clip(v, edges[0], edges[-1]), bins=edges)[0]
        np.testing.assert_array_equal(out["hist/counts"][l, i], h)
        # the top examples are the largest activations, each with its window read from the corpus
        k = min(5, len(v))
        np.testing.assert_array_equal(out["top/act"][l, i, :k], np.sort(v.astype(np.float32))[::-1][:k])
        full = acts[:, :, l, i]
        for j, act, idx in zip(range(k), out["top/act"][l, i], out["top/index"][l, i]):
            s, p = divmod(int(idx), seqs.shape[1])
            assert full[s, p].item() == act
            for w, q in enumerate(range(p - 3, p + 3)):
                tok = out["top/tokens"][l, i, j, w]
                assert tok == (seqs[s, q].item() if 0 <= q < seqs.shape[1] else -1)
                want = max(full[s, q].item(), 0) if 0 <= q < 32 else 0  # uint8, in units of max / 255
                assert (
                    abs(out["top/token_acts"][l, i, j, w] * out["stats/max"][l, i] / 255 - want)
                    <= 0.51 / 255 * out["stats/max"][l, i]
                )
        # quantile examples: real activations of their tokens, bins in increasing order
        qa, qi = out["quantile/act"][l, i], out["quantile/index"][l, i]
        for act, idx in zip(qa.ravel(), qi.ravel()):
            if idx >= 0:
                s, p = divmod(int(idx), seqs.shape[1])
                assert full[s, p].item() == act and act > 0
        b = out["quantile/bounds"][l, i]
        assert (np.diff(b) >= 0).all() and b[-1] <= v.max() and b[0] >= v.min()


@pytest.mark.parametrize("kind", ["plt", "clt"])
def test_chunk_size_does_not_change_the_results(model, kind):
    tc = aligned_set(model, kind)
    seqs = corpus()
    ref, _ = accumulate(model, tc, seqs, small_cfg(chunk_seqs=40)).result()
    for chunk in (1, 3, 7):
        got, _ = accumulate(model, tc, seqs, small_cfg(chunk_seqs=chunk)).result()
        for name, arr in ref.items():
            np.testing.assert_array_equal(got[name], arr, err_msg=f"{name}, chunk {chunk}")
    # a stream of token lists gives the same as a tensor
    got, _ = accumulate(model, tc, lambda: iter(seqs.tolist()), small_cfg(chunk_seqs=6)).result()
    np.testing.assert_array_equal(got["quantile/index"], ref["quantile/index"])


def test_state_does_not_grow_with_the_corpus(setup):
    model, tc = setup
    a = accumulate(model, tc, corpus(8), small_cfg())
    b = accumulate(model, tc, corpus(40), small_cfg())
    assert a.state_bytes() == b.state_bytes() == DashboardAccumulator(2, 48, small_cfg()).state_bytes()


@pytest.mark.parametrize("kind", ["plt", "clt"])
def test_direct_logits_are_decoder_times_unembedding(model, tmp_path, kind):
    tc = random_set(kind, n_layers=2, d_model=32, d_sae=48, seed=2)
    d = load_dashboards(
        compute_dashboards(small_cfg(), model=model, tc=tc, sequences=corpus(8), out=tmp_path / "d.h5")
    )
    W_U = model.W_U.detach()
    for l, i in [(0, 3), (1, 40)]:
        if kind == "plt":
            vec = tc.W_dec[l, i]
        else:  # the sum of the decoders into every layer it writes
            vec = sum(tc.W_dec[l][i, j] for j in range(2 - l))
        logits = (vec @ W_U).detach()
        top = logits.topk(4)
        np.testing.assert_array_equal(d["logits/top_tokens"][l, i], top.indices.numpy())
        np.testing.assert_allclose(d["logits/top_values"][l, i], top.values.numpy(), rtol=1e-3, atol=1e-3)
        bottom = logits.topk(4, largest=False)
        np.testing.assert_array_equal(d["logits/bottom_tokens"][l, i], bottom.indices.numpy())
        assert d.label(l, i).endswith(f"-> {top.indices[0].item()}") or d.label(l, i) == "dead"
    assert "sum" in d.attrs["direct_path"] if kind == "clt" else "sum" not in d.attrs["direct_path"]


def test_file_round_trip_and_schema_version(setup, tmp_path):
    model, tc = setup
    cfg = small_cfg()
    path = compute_dashboards(cfg, model=model, tc=tc, sequences=corpus(), out=tmp_path / "d.h5")
    ref, _ = accumulate(model, tc, corpus(), cfg).result()
    d = load_dashboards(path)
    assert {n for n in ref if n.endswith("/index")} == {"top/index", "quantile/index"}  # kept in memory only
    vmax = ref["stats/max"]
    halves = {"top/act", "quantile/act", "quantile/bounds"}  # float16 fractions of the max in the file
    for name, arr in ref.items():
        if not name.endswith("/index") and name not in halves:
            np.testing.assert_array_equal(d[name], arr, err_msg=name)
    for name in ("top/act", "quantile/act"):
        scale = vmax.reshape(vmax.shape + (1,) * (ref[name].ndim - 2))
        assert d[name].dtype == np.float32
        assert (np.abs(d[name] - ref[name]) <= scale * 2**-11).all(), name  # float16: 11 bits of the max
    top = ref["top/act"]
    np.testing.assert_array_equal(d["top/act"][..., 0], top[..., 0])  # the largest is the max, exactly
    alive = ref["stats/count"] > 0
    b, rb = d["quantile/bounds"], ref["quantile/bounds"]
    np.testing.assert_array_equal(b[..., 0], np.where(alive, ref["stats/min"], 0))  # outer edges: min, max
    np.testing.assert_array_equal(b[..., -1], np.where(alive, vmax, 0))
    assert (np.abs(b[..., 1:-1] - rb[..., 1:-1]) <= vmax[..., None] * 2**-11).all()
    with h5py.File(path) as f:  # what the file holds: schema 2, float16 fractions, no automatic labels
        assert f.attrs["schema_version"] == 2 and "labels/auto" not in f and "top/act" not in f
        assert f["top/rel_act"].dtype == f["quantile/rel_act"].dtype == np.float16
        assert f["quantile/rel_inner_bounds"].shape == (2, 48, 2) and f["stats/count"].dtype == np.int32
    assert d.vocab[TOKEN] == str(TOKEN) and d["labels/auto"].shape == (2, 48)
    np.testing.assert_array_equal(d["labels/auto"], auto_labels({**ref, **d.data}, d.vocab, 3))
    json.dumps(d.feature(1, 7))  # JSON-ready
    assert json.loads(d.attrs["config"])["n_top"] == 5
    with h5py.File(path, "a") as f:
        f.attrs["schema_version"] = 1  # the layout before float16 fractions
    with pytest.raises(DashboardFileError, match="schema version 1, this code reads version 2; recompute"):
        load_dashboards(path)
    with h5py.File(path, "a") as f:
        f.attrs["schema_version"] = 2
        del f["quantile/rel_act"]
    with pytest.raises(DashboardFileError, match=r"lacks \['quantile/rel_act'\]; it is incomplete"):
        load_dashboards(path)
    (tmp_path / "x.h5").write_bytes(b"not hdf5")
    with pytest.raises(DashboardFileError, match="not a readable HDF5"):
        load_dashboards(tmp_path / "x.h5")
    with pytest.raises(DashboardFileError, match="does not exist"):
        load_dashboards(tmp_path / "missing.h5")


def test_a_write_that_fails_midway_leaves_the_old_file(tmp_path):
    path = tmp_path / "d.h5"
    good = {"stats/count": np.arange(4).reshape(2, 2)}
    attrs = {"n_layers": 2, "d_sae": 2}
    write_dashboards(path, good, attrs)
    before = path.read_bytes()
    bad = {"stats/count": np.zeros((2, 2)), "stats/count/x": np.zeros(3)}  # the second cannot be created
    with pytest.raises(Exception):  # noqa: B017 - h5py's own error, raised midway through the write
        write_dashboards(path, bad, attrs)
    assert path.read_bytes() == before
    files = lambda: sorted(n for n in os.listdir(tmp_path) if not n.endswith(".lock"))  # noqa: E731 (writer locks stay)
    assert files() == ["d.h5"]  # no temporary file left behind
    with pytest.raises(Exception):  # noqa: B017
        write_dashboards(tmp_path / "new.h5", bad, attrs)
    assert files() == ["d.h5"]


def test_user_labels_are_kept_when_dashboards_are_recomputed(setup, tmp_path):
    model, tc = setup
    path = compute_dashboards(small_cfg(), model=model, tc=tc, sequences=corpus(), out=tmp_path / "d.h5")
    auto = load_dashboards(path).label(1, 2)
    set_labels(path, {(0, 3): "my feature", "L1/F2": "Mary detector"})
    d = load_dashboards(path)
    assert d.label(0, 3) == "my feature" and d.label(1, 2) == "Mary detector"
    assert d["labels/auto"][1, 2] == auto and d.labels()[1, 2] == "Mary detector"
    compute_dashboards(small_cfg(n_top=3), model=model, tc=tc, sequences=corpus(10), out=path)
    d = load_dashboards(path)
    assert d.label(0, 3) == "my feature" and d.label(1, 2) == "Mary detector"
    assert d["top/act"].shape[-1] == 3  # recomputed
    set_labels(path, {"L1/F2": None})
    assert load_dashboards(path).label(1, 2) == str(load_dashboards(path)["labels/auto"][1, 2])
    with pytest.raises(DashboardFileError, match="outside this set"):
        set_labels(path, {(2, 0): "x"})
    with pytest.raises(DashboardFileError, match="neither"):
        set_labels(path, {"feature 3": "x"})


def test_cli_reports_a_bad_option_in_one_line(capsys):
    assert main(["--n-top", "0", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "n_top is 0" in err and "Traceback" not in err


@pytest.mark.parametrize(
    "name,d_sae", [("default-plt", 1024), ("default-clt", 1024), ("default-attn-sae", 512)]
)
def test_bundled_dashboards(name, d_sae):
    path = BUNDLED[name] / "dashboards.h5"
    assert path.stat().st_size < 400_000, "keep data/ small (issue 13: a few hundred kB)"
    d = load_dashboards(path)
    assert (d.n_layers, d.d_sae) == (4, d_sae)
    shipped = {k: v for k, v in json.loads(d.attrs["config"]).items() if k != "progress"}
    assert shipped == {k: v for k, v in asdict(DashboardConfig(transcoders=name)).items() if k != "progress"}
    assert d.attrs["n_tokens"] >= 100_000
    labels = d.labels()
    assert all(isinstance(s, str) and s for s in labels.ravel())
    alive = d["stats/count"] > 0
    assert alive.mean() > 0.9
    assert (d["top/act"][alive][:, 0] == d["stats/max"][alive]).all()


def test_dashboards_of_a_retrained_set_are_told_apart_from_the_old_ones(model, tmp_path):
    """A dashboards file records the fingerprint of its set (the one a graph's provenance records),
    so a stale file beside a set retrained in its folder, of the same shape, is not taken for the new
    set's: the lookup passes it over, saying why (before: its examples were shown for other features),
    a file given by name is used with that caveat, and a recompute refuses to carry its user labels
    over to features they do not name."""
    from attrgraph.graph.dashboard_lookup import find_dashboards
    from transcoders.fingerprint import fingerprint

    old, new = aligned_set(model), aligned_set(model)
    with torch.no_grad():
        new.W_enc[1, 0, 0] += 1.0  # retrained: one weight moved
    path = compute_dashboards(
        small_cfg(), model=model, tc=old, sequences=corpus(), out=tmp_path / "dashboards.h5"
    )
    assert load_dashboards(path).attrs["transcoder_fingerprint"] == fingerprint(old)
    meta = {"n_layers": 2, "transcoder_d_sae": 48, "transcoders": str(tmp_path)}  # the set's folder
    for tc, used in ((old, True), (new, False)):
        found = find_dashboards(dict(meta, transcoder_fingerprint=fingerprint(tc)), "mlp")
        assert (found.dashboards is not None) == used
    stale = (
        f"{path} was computed for another set (fingerprint {fingerprint(old)}; the graph's transcoder "
        f"set is {fingerprint(new)}: retrained, or loaded in another dtype)"
    )
    assert found.reason == stale
    given = find_dashboards(dict(meta, transcoder_fingerprint=fingerprint(new)), "mlp", path)
    assert given.dashboards is not None and given.caveat == stale  # asked for by name: used, and said
    compute_dashboards(small_cfg(), model=model, tc=new, sequences=corpus(), out=path)  # no labels: replaced
    set_labels(path, {(0, 3): "mine"})
    with pytest.raises(DashboardFileError, match=r"holds 1 user labels of another set of this shape") as e:
        compute_dashboards(small_cfg(), model=model, tc=old, sequences=corpus(), out=path)
    assert "move the file away to keep them" in str(e.value)
    assert load_dashboards(path).attrs["transcoder_fingerprint"] == fingerprint(new)  # unchanged
    compute_dashboards(small_cfg(), model=model, tc=new, sequences=corpus(), out=path)  # its own labels: kept
    assert read_user_labels(path) == {(0, 3): "mine"}

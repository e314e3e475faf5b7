"""Feature files filled from dashboards: the histogram and percentiles on hand-built and sampled
cases, the files against the dashboards they come from (bundled ones), labels into clerps,
feature_details, no dashboards (one warning), dashboards that do not fit; and circuit-tracer's
pydantic models as the judge when its peer venv exists."""

import json
import shutil
import warnings

import numpy as np
import pytest

from attrgraph.errors import AttrgraphError, ExportError, ExportWarning
from attrgraph.graph.neuronpedia import export_json
from attrgraph.graph.neuronpedia_features import bin_ranges, cantor, linear_histogram, percentiles
from attrgraph.graph.supernodes import supernode
from tests.attrgraph.graph.test_neuronpedia import layered_graph
from tests.attrgraph.peer_frontend import CHECK, run_peer

EDGES = np.logspace(-3, 3, 25)  # the dashboards' default bins: 4 per decade


# ------------------------------------------------------------------------- histogram and percentiles
def test_one_log_bin_spreads_as_a_log_uniform_density():
    counts = np.zeros(24)
    counts[12:16] = 25  # [1, 10): four bins, as a log-uniform sample on [1, 10] fills them
    hist = linear_histogram(EDGES, counts, 1.0, 10.0, 10.0, 10)
    x = np.linspace(0, 10, 11)
    want = 100 * np.diff(np.log10(np.clip(x, 1, 10)))  # mass of [x_k, x_k+1] under 1/(v ln 10)
    np.testing.assert_allclose(hist, want, atol=1e-9)
    q = percentiles(EDGES, counts, 1.0, 10.0)
    np.testing.assert_allclose(q, 10 ** (np.arange(1, 101) / 100), rtol=1e-9)  # the p-th: 10^(p/100)


def test_end_bins_hold_what_lies_outside_the_edges_within_min_and_max():
    lo, hi = bin_ranges(EDGES, 2e-4, 5e3)
    assert (lo[0], hi[0]) == (2e-4, EDGES[1]) and (lo[-1], hi[-1]) == (EDGES[-2], 5e3)
    lo, hi = bin_ranges(EDGES, 0.02, 0.05)  # bins outside [min, max] shrink to a point there
    assert (lo >= 0.02).all() and (hi <= 0.05).all() and (lo <= hi).all()
    counts = np.zeros(24)
    counts[0] = 7  # all below 1.8e-3, here within [min, max] = [1e-5, 1.5e-3]; none above
    hist = linear_histogram(EDGES, counts, 1e-5, 1.5e-3, 3e-3, 3)
    first = 7 * np.log(1e-3 / 1e-5) / np.log(1.5e-3 / 1e-5)
    np.testing.assert_allclose(hist, [first, 7 - first, 0], atol=1e-9)


def test_estimates_keep_totals_and_each_percentile_in_its_true_bin():
    rng = np.random.default_rng(0)
    v = np.exp(rng.normal(-3, 1.5, 5000)).astype(np.float32)
    e = EDGES.astype(np.float32)
    counts = np.histogram(np.clip(v, e[0], e[-1]), bins=e)[0]  # what the dashboards store
    vmin, vmax = float(v.min()), float(v.max())
    hist = linear_histogram(e, counts, vmin, vmax, vmax * 1.2, 24)
    assert hist.sum() == pytest.approx(len(v)) and (hist >= -1e-9).all()
    q = percentiles(e, counts, vmin, vmax)
    assert len(q) == 100 and q[-1] == vmax and (np.diff(q) >= 0).all()
    true = np.quantile(v, np.arange(1, 101) / 100, method="inverted_cdf")
    lo, hi = bin_ranges(e, vmin, vmax)
    j = np.searchsorted(e[1:-1], true, side="right")  # the bin of the true percentile
    assert ((q >= lo[j] * (1 - 1e-6)) & (q <= hi[j] * (1 + 1e-6))).all()
    assert percentiles(e, np.zeros(24), 0.0, 0.0).size == 0
    assert linear_histogram(e, np.zeros(24), 0.0, 0.0, 1.0, 5).tolist() == [0] * 5


# ------------------------------------------------------------------------- files from the bundled dashboards
def bundled_graph(seed=0):
    from transcoders import load_dashboards
    from transcoders.paths import BUNDLED

    g = layered_graph(seed)
    # as `attrgraph build` records it; the hand-built graph uses layers 0-1 of default-plt's 4
    g.meta.update(transcoders="default-plt", n_layers=4)
    # a graph `attrgraph build` stores holds features that fired: move any feature the bundled
    # dashboards saw dead (never active on their tokens) to the next live one of its layer
    d = load_dashboards(BUNDLED["default-plt"] / "dashboards.h5")
    n = g.nodes
    for i in np.flatnonzero(n.kind == "feature"):
        f = int(n.feature[i])
        while d.feature(int(n.layer[i]), f)["count"] == 0:
            f += 1
        n.feature[i] = f
    return g


@pytest.mark.bundled("default-plt")
def test_feature_files_hold_the_dashboards_of_the_graphs_set(tmp_path):
    from transcoders import load_dashboards
    from transcoders.paths import BUNDLED

    g = bundled_graph()
    with warnings.catch_warnings():
        warnings.simplefilter("error", ExportWarning)  # found: no warning
        res = export_json(g, tmp_path, slug="s")
    assert res.dashboards == BUNDLED["default-plt"] / "dashboards.h5"
    d = load_dashboards(res.dashboards)
    n = g.nodes
    data = json.loads(res.path.read_text())
    files = 0
    for l, f in sorted(
        {(int(a), int(b)) for a, b in zip(n.layer[n.kind == "feature"], n.feature[n.kind == "feature"])}
    ):
        feat = json.loads((tmp_path / "features" / "default-plt" / f"{cantor(l, f)}.json").read_text())
        want = d.feature(l, f)
        graph_max = float(n.activation[(n.kind == "feature") & (n.layer == l) & (n.feature == f)].max())
        assert feat["act_min"] == 0 and feat["act_max"] == pytest.approx(max(want["max"], graph_max))
        assert feat["activation_frequency"] == pytest.approx(want["frequency"])
        assert feat["top_logits"] == [t for t, _ in want["top_logits"]] and len(feat["bottom_logits"]) == 4
        assert sum(feat["histogram"]) == pytest.approx(want["count"], abs=0.1)
        assert len(feat["quantile_values"]) == 100 and feat["quantile_values"][-1] == pytest.approx(
            want["max"], rel=1e-3
        )
        top = feat["examples_quantiles"][0]
        assert top["quantile_name"] == "Top activations" and len(top["examples"]) == len(want["top"]) > 0
        for ex, w in zip(top["examples"], want["top"]):
            # the bundled vocabulary is of words without spaces: the file spaces them for the frontend
            assert ex["tokens"] == [t if k == 0 else f" {t}" for k, t in enumerate(w["tokens"])]
            assert ex["train_token_ind"] == w["center"]
            np.testing.assert_allclose(ex["tokens_acts_list"], w["acts"], rtol=1e-3)
            assert ex["tokens_acts_list"][ex["train_token_ind"]] == pytest.approx(
                w["act"], rel=0.01, abs=w["act"] / 255
            )
        names = [q["quantile_name"] for q in feat["examples_quantiles"][1:]]
        assert names and all(s.startswith("Quantile ") for s in names)
        assert names == sorted(names, reverse=True)  # highest bin first
        files += 1
    assert files == res.n_feature_files
    # clerps: the dashboards' labels (automatic here)
    for node in data["nodes"]:
        if node["feature_type"] == "cross layer transcoder":
            l, f = (int(x) for x in node["node_id"].split("_")[:2])
            assert node["clerp"] == d.label(l, f) != "dead"


@pytest.mark.bundled("default-plt")
def test_label_order_and_explicit_dashboards(tmp_path):
    from transcoders import set_labels
    from transcoders.paths import BUNDLED

    path = tmp_path / "mine.h5"
    shutil.copyfile(BUNDLED["default-plt"] / "dashboards.h5", path)
    g = bundled_graph(1)
    feats = np.flatnonzero(g.nodes.kind == "feature")
    key = lambda i: (int(g.nodes.layer[i]), int(g.nodes.feature[i]))  # noqa: E731
    a, b, c = feats[0], feats[1], feats[2]
    set_labels(path, {key(a): "user label", key(b): "user label b"})
    sn = [supernode(g, "group", [a, b, c])]
    res = export_json(g, tmp_path / "o", supernodes=sn, labels={key(b): "passed in"}, dashboards=path)
    assert res.dashboards == path
    clerp = {d["node_id"]: d["clerp"] for d in json.loads(res.path.read_text())["nodes"]}
    ids = [f"{l}_{f}_{int(g.nodes.position[i])}" for i in (a, b, c) for l, f in [key(i)]]
    # passed in > the user's label > supernode name > automatic label
    assert [clerp[i] for i in ids] == ["user label", "passed in", "group"]


@pytest.mark.bundled("default-plt")
def test_feature_url_gives_neuronpedia_feature_details(tmp_path):
    g = bundled_graph(2)
    meta = json.loads(export_json(g, tmp_path, feature_url="https://example.org/site/").path.read_text())[
        "metadata"
    ]
    assert meta["feature_details"] == {
        "feature_json_base_url": "https://example.org/site/features/default-plt"
    }
    assert "feature_details" not in json.loads(export_json(g, tmp_path).path.read_text())["metadata"]


@pytest.mark.bundled("default-plt")
def test_circuit_tracer_validates_feature_files_with_examples(tmp_path):
    out = tmp_path / "site"
    export_json(bundled_graph(3), out, slug="one")
    report = run_peer(CHECK, out)
    assert report["feature_files"] > 0
    for f in (out / "features" / "default-plt").iterdir():
        feat = json.loads(f.read_text())
        assert feat["examples_quantiles"][0]["examples"] and feat["histogram"] and feat["top_logits"]


# ------------------------------------------------------------------------- without dashboards, and bad ones
def test_without_dashboards_export_works_and_warns_once(tmp_path):
    g = layered_graph(4)  # its set, /some/dir/my-plt/, has no dashboards
    with pytest.warns(ExportWarning) as record:
        res = export_json(g, tmp_path)
    assert len(record) == 1 and "\n" not in str(record[0].message)
    assert "feature files have no examples" in str(record[0].message)
    assert res.dashboards is None and res.n_feature_files > 0
    for f in (tmp_path / "features" / "my-plt").iterdir():
        feat = json.loads(f.read_text())
        assert feat["examples_quantiles"] == [] and feat["histogram"] == [] and feat["act_max"] > 0
    del g.meta["transcoders"]
    with pytest.warns(ExportWarning, match="names no transcoder set"):
        export_json(g, tmp_path)


@pytest.mark.bundled("default-plt")
def test_dashboards_that_do_not_fit_or_do_not_exist_are_errors(tmp_path):
    from transcoders.paths import BUNDLED

    g = layered_graph(5, d_sae=2000)  # features past the 1024 of default-plt
    g.meta.update(transcoders="default-plt", n_layers=4)
    with pytest.raises(ExportError, match=r"cover 4 layers x 1024 features but the graph has L\d/F\d+") as e:
        export_json(g, tmp_path / "o")
    assert "\n" not in str(e.value) and not (tmp_path / "o").exists()
    with pytest.raises(AttrgraphError, match="does not exist"):
        export_json(layered_graph(5), tmp_path / "o", dashboards=tmp_path / "missing.h5")
    bad = tmp_path / "set"
    bad.mkdir()
    (bad / "dashboards.h5").write_text("not hdf5")  # found by the set's folder but unreadable: a warning
    g = layered_graph(5)
    g.meta["transcoders"] = str(bad)
    with pytest.warns(ExportWarning, match="not a readable HDF5 file"):
        assert export_json(g, tmp_path / "o2").dashboards is None
    g.meta.update(transcoders="default-clt", n_layers=4)  # the wrong set's dashboards, passed by hand:
    with pytest.warns(ExportWarning, match="computed for transcoder set 'default-plt'"):  # said, not refused
        export_json(g, tmp_path / "o3", dashboards=BUNDLED["default-plt"] / "dashboards.h5")
    g.meta.update(transcoders="default-plt", transcoder_fingerprint="0123456789abcdef")  # retrained
    with pytest.warns(ExportWarning, match="was computed for another set") as record:  # by hand: said
        assert export_json(g, tmp_path / "o6", dashboards="default-plt").dashboards is not None
    assert len(record) == 1
    with pytest.warns(ExportWarning, match="was computed for another set"):  # found: passed over
        assert export_json(g, tmp_path / "o7").dashboards is None
    del g.meta["transcoder_fingerprint"]
    # dashboards of another width than the graph's set records (dashboard_lookup.fits): passed by
    # hand, an error; found for the set the graph names, passed over with one warning line
    g.meta.update(transcoders="default-plt", transcoder_d_sae=2000)
    with pytest.raises(ExportError, match="has 1024 features per layer, the graph's transcoder set 2000"):
        export_json(g, tmp_path / "o4", dashboards="default-plt")
    with pytest.warns(ExportWarning, match="has 1024 features per layer") as record:
        assert export_json(g, tmp_path / "o5").dashboards is None
    assert len(record) == 1 and "\n" not in str(record[0].message)


# ------------------------------------------------------------------------- attention features
@pytest.mark.bundled("default", "default-plt", "default-attn-sae")
def test_attention_feature_files_hold_the_attention_sets_dashboards(tmp_path):
    from attrgraph.graph.neuronpedia_features import feature_index
    from tests.attrgraph.ag_helpers import bundled_attention_graph
    from transcoders import load_dashboards
    from transcoders.paths import BUNDLED

    g = bundled_attention_graph()  # built from Python: the sets are found by their fingerprints
    with warnings.catch_warnings():
        warnings.simplefilter("error", ExportWarning)  # both found: no warning
        res = export_json(g, tmp_path, slug="a")
    assert res.dashboards == BUNDLED["default-plt"] / "dashboards.h5"
    assert res.attn_dashboards == BUNDLED["default-attn-sae"] / "dashboards.h5"
    d = load_dashboards(res.attn_dashboards)
    n = g.nodes
    attn = (n.kind == "feature") & (n.site == "attn")
    pairs = sorted({(int(l), int(f)) for l, f in zip(n.layer[attn], n.feature[attn])})
    assert pairs and ((n.kind == "feature") & (n.site == "mlp")).any()
    clerp = {x["node_id"]: x["clerp"] for x in json.loads(res.path.read_text())["nodes"]}
    for l, f in pairs:
        feat = json.loads(
            (tmp_path / "features" / "transcoders" / f"{feature_index(l, f, True)}.json").read_text()
        )
        want = d.feature(l, f)
        assert feat["transcoder_id"] == f"transcoders/attn/{l}"
        assert feat["activation_frequency"] == pytest.approx(want["frequency"])
        assert feat["top_logits"] == [t for t, _ in want["top_logits"]]
        top = feat["examples_quantiles"][0]["examples"]
        assert len(top) == len(want["top"]) > 0
        for ex, w in zip(top, want["top"]):
            assert ex["train_token_ind"] == w["center"]
            np.testing.assert_allclose(ex["tokens_acts_list"], w["acts"], rtol=1e-3)
        pos = int(n.position[np.flatnonzero(attn & (n.layer == l) & (n.feature == f))[0]])
        assert clerp[f"A{l}_{f}_{pos}"] == (d.label(l, f) if d.label(l, f) != "dead" else f"A{l}/F{f}")
    # the attention set not found: its files have no examples, and one warning line says so
    meta = g.meta.copy()
    g.meta["attn_transcoder_fingerprint"] = "0123456789abcdef"
    with pytest.warns(ExportWarning, match="attention feature files have no examples") as record:
        res = export_json(g, tmp_path / "b")
    assert len(record) == 1 and res.attn_dashboards is None and res.dashboards is not None
    l, f = pairs[0]
    feat = json.loads(
        (tmp_path / "b" / "features" / "transcoders" / f"{feature_index(l, f, True)}.json").read_text()
    )
    assert feat["examples_quantiles"] == [] and feat["top_logits"] == []
    # given by hand instead: the attention set's, never the MLP set's
    g.meta = meta
    res = export_json(g, tmp_path / "c", attn_dashboards="default-attn-sae")
    assert res.attn_dashboards == BUNDLED["default-attn-sae"] / "dashboards.h5"
    with pytest.raises(ExportError, match="1024 features per layer, the graph's attention set 512"):
        export_json(g, tmp_path / "d", dashboards="default-plt", attn_dashboards="default-plt")

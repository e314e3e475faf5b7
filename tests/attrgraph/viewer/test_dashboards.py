"""Which dashboards label a graph's features: named by the graph, found by the transcoders'
fingerprint, given by the caller; refused when they do not fit; and the labels in the payload."""

import pytest

from attrgraph.errors import GraphFileError
from attrgraph.viewer.dashboards import feature_dashboard, find_dashboards
from attrgraph.viewer.payload import graph_payload

pytestmark = pytest.mark.bundled("default", "default-plt", "default-clt")


def test_named_by_the_graph_or_found_by_fingerprint(ioi):
    from transcoders.paths import BUNDLED

    plt = BUNDLED["default-plt"] / "dashboards.h5"
    found = find_dashboards(ioi.meta)  # meta["transcoders"] == "default-plt", as `attrgraph build` writes
    assert found.dashboards.path == plt and str(plt) in found.note
    unnamed = {k: v for k, v in ioi.meta.items() if k != "transcoders"}  # a graph built from Python
    assert find_dashboards(unnamed).dashboards.path == plt
    foreign = dict(unnamed, transcoder_fingerprint="0123456789abcdef")
    assert find_dashboards(foreign).dashboards is None  # the CLT's file has the same shape: not taken
    given = find_dashboards(foreign, "default-clt")
    assert given.dashboards.path == BUNDLED["default-clt"] / "dashboards.h5"


def test_dashboards_that_do_not_fit_or_do_not_exist(ioi, tmp_path):
    wrong = dict(ioi.meta, n_layers=7)
    source = find_dashboards(wrong)
    assert source.dashboards is None and "covers 4 layers, the graph 7" in source.note
    assert "features are labelled L{layer}/F{feature}" in find_dashboards({}).note
    with pytest.raises(GraphFileError, match="no dashboards file at"):
        find_dashboards(ioi.meta, tmp_path)
    board = find_dashboards(ioi.meta).dashboards
    assert feature_dashboard(board, 4, 0) is None and feature_dashboard(board, 0, 1024) is None


def test_feature_labels_and_dashboards_in_the_payload(ioi):
    source = find_dashboards(ioi.meta)
    data = graph_payload(ioi, "ioi", source=source)
    feats = [n for n in data["nodes"] if n["kind"] == "feature"]
    assert feats and len(data["dashboards"]) == len({(n["layer"], n["feature"]) for n in feats})
    for n in feats:
        assert n["label"] == source.dashboards.label(n["layer"], n["feature"])
        board = data["dashboards"][f"{n['layer']}/{n['feature']}"]
        assert board["label"] == n["label"] and board["top"] and board["top_logits"]
    bare = graph_payload(ioi, "ioi")
    assert {n["label"] for n in bare["nodes"] if n["kind"] == "feature"} == {
        f"L{n['layer']}/F{n['feature']}" for n in feats
    }


@pytest.mark.bundled("default-attn-sae")
def test_attention_features_found_by_fingerprint_or_noted(tmp_path):
    from tests.attrgraph.ag_helpers import bundled_attention_graph
    from transcoders.paths import BUNDLED

    g = bundled_attention_graph()  # built from Python: no set names in meta, only fingerprints
    data = graph_payload(g, "g", source=find_dashboards(g.meta))
    attn = [n for n in data["nodes"] if n["kind"] == "feature" and n["site"] == "attn"]
    assert attn and all(f"A{n['layer']}/{n['feature']}" in data["dashboards"] for n in attn)
    g.meta["attn_transcoder_fingerprint"] = "0123456789abcdef"
    data = graph_payload(g, "g", source=find_dashboards(g.meta))
    assert not any(k.startswith("A") for k in data["dashboards"])
    assert any(
        s.startswith("no attention feature dashboards (") and "no bundled set has its fingerprint" in s
        for s in data["notes"]
    )
    given = find_dashboards(g.meta, "default-attn-sae", "attn")
    assert given.dashboards.path == BUNDLED["default-attn-sae"] / "dashboards.h5"
    data = graph_payload(g, "g", source=find_dashboards(g.meta), attn_source=given)
    assert all(f"A{n['layer']}/{n['feature']}" in data["dashboards"] for n in attn)

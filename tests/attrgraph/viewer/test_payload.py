"""The page's JSON for a graph: every node and edge as stored, the pruned view of a huge unpruned
graph, the edge cap, hierarchical attribution, strict JSON."""

import json
import math

import numpy as np
import pytest
import torch

from attrgraph.graph.prune import prune_graph
from attrgraph.viewer import payload as payload_module
from attrgraph.viewer.payload import graph_payload, graph_view, view_keys
from tests.attrgraph.ag_helpers import random_graph, tiny_model, tiny_transcoders
from tests.attrgraph.viewer.viewer_helpers import random_full_graph


def test_every_node_and_edge_as_stored():
    g = random_graph(3)
    g.nodes.influence[:] = np.nan  # not computed: null in JSON, not NaN
    data = graph_payload(g, "g")
    json.dumps(data, allow_nan=False)
    assert [n["id"] for n in data["nodes"]] == list(range(g.n_nodes))
    assert all(n["influence"] is None for n in data["nodes"])
    A = g.adjacency.toarray()
    assert len(data["edges"]) == g.n_edges
    for s, t, w in data["edges"]:
        assert w == float(A[t, s]) and w != 0  # full precision: the sliders score edges by them
    rows = {n["kind"]: n["row"] for n in data["nodes"]}
    assert rows["embedding"] == 0 and rows["logit"] == data["n_layers"] + 1 == 3
    assert data["row_labels"] == ["emb", "L0", "L1", "logit"]
    logit = next(n for n in data["nodes"] if n["kind"] == "logit")
    assert logit["label"] == f"logit 'out0' p={g.logit_probs[0]:.3f}"
    assert data["notes"] == [] and data["stored"] == {"n_nodes": g.n_nodes, "n_edges": g.n_edges}


def test_a_huge_unpruned_graph_is_shown_pruned_with_a_note(monkeypatch):
    g = random_full_graph(0, n_feat=60)
    monkeypatch.setattr(payload_module, "MAX_NODES", 40)
    view, index, notes = graph_view(g)
    expected = prune_graph(g, 0.8, 0.98)
    assert view.n_nodes == expected.n_nodes < g.n_nodes and view.n_edges == expected.n_edges
    assert view_keys(view) == [view_keys(g)[i] for i in index]
    assert notes[0].startswith(
        f"This graph is stored unpruned ({g.n_nodes} nodes, {g.n_edges} edges); shown pruned"
    )
    g.meta["pruned"] = True  # a pruned graph is shown as it is
    view, index, notes = graph_view(g)
    assert view.n_nodes == g.n_nodes and notes == []


def test_a_view_keeps_its_strongest_edges_up_to_the_cap(monkeypatch):
    g = random_graph(1)
    monkeypatch.setattr(payload_module, "MAX_EDGES", 30)
    view, _, notes = graph_view(marked_pruned(g))
    kept = np.abs(view.adjacency.data)
    all_w = np.sort(np.abs(g.adjacency.data))[::-1]
    assert view.n_edges == 30 and np.allclose(np.sort(kept)[::-1], all_w[:30])
    assert notes == [f"Showing the 30 strongest of this view's {g.n_edges} edges (by |weight|)."]


def marked_pruned(g):
    g.meta["pruned"] = True
    return g


def test_hierarchical_attribution_follows_its_node_into_the_view(monkeypatch):
    from attrgraph.engine.hierarchical import attribute_hierarchical

    model = tiny_model("gpt2", dtype=torch.float32)
    g = attribute_hierarchical(
        model, tiny_transcoders(model, "plt"), torch.tensor([0, 5, 9, 3, 17, 22]), tau=-math.inf
    )
    data = graph_payload(g, "h")
    assert [n["attribution"] for n in data["nodes"]] == [
        pytest.approx(a, rel=1e-5) for a in g.meta["attribution"]
    ]
    assert data["hierarchical"]["root_value"] == g.meta["root_value"]
    monkeypatch.setattr(payload_module, "MAX_NODES", g.n_nodes // 2)
    view, index, _ = graph_view(g)
    data = graph_payload(g, "h")
    assert view.n_nodes < g.n_nodes and len(data["nodes"]) == view.n_nodes
    assert [n["attribution"] for n in data["nodes"]] == [
        pytest.approx(g.meta["attribution"][i], rel=1e-5) for i in index
    ]
    pruned = prune_graph(g, 0.5, 0.9)  # stored pruned: its per-node values no longer line up
    assert "attribution" not in graph_payload(pruned, "p")["nodes"][0]


@pytest.mark.bundled("default", "default-plt", "default-attn-sae")
def test_attention_features_carry_their_site_labels_and_dashboards(tmp_path):
    """A graph with attention-output SAE features: each node says its site, attention features are
    labelled and get dashboards from the attention set's file (never the MLP set's), and supernode
    keys carry the site, so that an attention node and an MLP node never share a key."""
    import attrgraph
    from transcoders import load_transcoders

    model = attrgraph.load_model("default")
    sets = [load_transcoders("default-plt"), load_transcoders("default-attn-sae")]
    g = prune_graph(
        attrgraph.attribute(model, sets, "When Mary and John went to the store, John gave a drink to")
    )
    g.meta.update(transcoders="default-plt", attn_transcoders="default-attn-sae")
    from attrgraph.viewer.dashboards import find_dashboards

    data = graph_payload(g, "g", source=find_dashboards(g.meta))
    attn = [n for n in data["nodes"] if n["site"] == "attn" and n["kind"] == "feature"]
    mlp = [n for n in data["nodes"] if n["site"] == "mlp" and n["kind"] == "feature"]
    assert attn and mlp
    mlp_boards = load_dashboards_labels("default-plt")
    attn_boards = load_dashboards_labels("default-attn-sae")
    for n in attn:
        assert n["key"][4] == "attn"
        board = data["dashboards"][f"A{n['layer']}/{n['feature']}"]
        assert n["label"] == board["label"] == attn_boards[n["layer"], n["feature"]]
    for n in mlp:
        assert n["key"][4] == "mlp" and n["label"] == mlp_boards[n["layer"], n["feature"]]
    keys = [json.dumps(n["key"]) for n in data["nodes"] if n["kind"] != "logit"]
    assert len(set(keys)) == len(keys)


def load_dashboards_labels(name):
    from transcoders.dashboard_file import load_dashboards
    from transcoders.paths import BUNDLED

    return load_dashboards(BUNDLED[name] / "dashboards.h5").labels()


def test_feature_names_say_a_for_attention_and_sliders_read_stored_unpruned_influence():
    from attrgraph.viewer.payload import graph_payload
    from tests.attrgraph.ag_helpers import random_graph

    graph = random_graph(3)
    graph.nodes.influence = np.linspace(0.0, 0.5, graph.n_nodes)
    feats = np.flatnonzero(graph.nodes.kind == "feature")
    graph.nodes.site = np.where(np.isin(np.arange(graph.n_nodes), feats[:2]), "attn", graph.nodes.site)
    data = graph_payload(graph, "g")
    names = {n["id"]: n["name"] for n in data["nodes"] if n["kind"] == "feature"}
    for i in feats:
        letter = "A" if i in feats[:2] else "L"
        assert names[int(i)] == f"{letter}{graph.nodes.layer[i]}/F{graph.nodes.feature[i]}"
    assert data["slider_influence"] == "stored"
    # full precision: the page's sliders rank and cut by these (viewer.js step 1)
    assert [n["slider_influence"] for n in data["nodes"]] == graph.nodes.influence.tolist()
    full = np.linspace(1.0, 2.0, graph.n_nodes)
    graph.meta["unpruned_influence"] = full.tolist()  # as a pruned graph may remember it (issue 21)
    data = graph_payload(graph, "g")
    assert data["slider_influence"] == "unpruned"
    assert [n["slider_influence"] for n in data["nodes"]] == full.tolist()
    graph.meta["unpruned_influence"] = [1.0, 2.0]  # the wrong length: not used
    assert graph_payload(graph, "g")["slider_influence"] == "stored"


def test_the_sliders_start_with_the_rule_the_view_was_pruned_by(monkeypatch):
    g = random_full_graph(0, n_feat=60)
    assert graph_payload(g, "g")["prune_rule"] == "circuit-tracer"  # unpruned: prune_graph's default
    for rule in ("appendix", "circuit-tracer"):
        assert graph_payload(prune_graph(g, 0.8, 0.98, rule=rule), "p")["prune_rule"] == rule
    old = marked_pruned(random_graph(2))  # pruned before the rule was recorded: the appendix's
    assert "prune_rule" not in old.meta and graph_payload(old, "o")["prune_rule"] == "appendix"
    monkeypatch.setattr(payload_module, "MAX_NODES", 40)  # shown pruned by prune_graph's default
    assert graph_payload(g, "g")["prune_rule"] == "circuit-tracer"

"""read_view: a shared Neuronpedia graph link read against a graph.

Expected values from outside the reader: circuit-tracer's own `decode_url_features` on the same
links (peer venv), the fields circuit-tracer's `create_graph_files` writes beside each node id it
names, Neuronpedia's own default view (its graph page's pinnedIds, supernodes and clerps for
gemma-fact-dallas-austin, with the nodes they name worked out by hand), and the supernodes our
export was given."""

import json
import urllib.parse

import numpy as np
import pytest

from attrgraph.errors import GraphError, SupernodeError, ViewError
from attrgraph.graph.graph import Graph, Nodes
from attrgraph.graph.neuronpedia import graph_to_json, load_json, node_ids
from attrgraph.graph.neuronpedia_features import cantor
from attrgraph.graph.shared_view import read_view
from attrgraph.graph.supernodes import NodeKey, Supernode, node_key, supernode
from tests.attrgraph.graph.test_neuronpedia import N_LAYERS, circuit_tracer_export, layered_graph
from tests.attrgraph.peer_frontend import run_peer

pytestmark = pytest.mark.filterwarnings("ignore::attrgraph.errors.ExportWarning")

CT_DECODE = r"""
import json, sys
from circuit_tracer.utils.decode_url_features import decode_url_features
out = []
for url in json.loads(sys.argv[1]):
    groups, pinned = decode_url_features(url)
    out.append({"supernodes": {k: [list(f) for f in v] for k, v in groups.items()}, "pinned": [list(f) for f in pinned]})
print(json.dumps(out))
"""


def link(query: dict, model: str = "gemma-2-2b") -> str:
    """A graph page URL as the browser's address bar holds it (each value percent-encoded once)."""
    return f"https://www.neuronpedia.org/{model}/graph?" + urllib.parse.urlencode(
        query, quote_via=urllib.parse.quote
    )


def triple(graph: Graph, key: NodeKey) -> list[int]:
    """A key as circuit-tracer's `Feature(layer, pos, feature_idx)` (an embedding: (-1, pos, token))."""
    if key.kind == "embedding":
        return [-1, key.position, int(graph.prompt_ids[key.position])]
    return [key.layer, key.position, key.feature]


def test_the_same_nodes_and_names_as_circuit_tracers_decoder():
    """Features, errors and embeddings, supernodes with a repeated name, a member the graph lacks:
    what decode_url_features reads from each link, node for node and name for name (it cannot read
    an embedding inside a supernode: the export test below has one)."""
    g = layered_graph(3)
    ids, n = node_ids(g), g.nodes
    feats = [ids[i] for i in np.flatnonzero(n.kind == "feature")]
    errors = [ids[i] for i in np.flatnonzero(n.kind == "error")]
    embeds = [ids[i] for i in np.flatnonzero(n.kind == "embedding")]
    links = [
        link(
            {
                "slug": "s",
                "pinnedIds": ",".join([feats[0], feats[7], embeds[2], errors[3], feats[-1]]),
                "supernodes": json.dumps(
                    [["say w", feats[1], feats[4]], ["say w", feats[5]], ["x", feats[2], "1_45_4"]]
                ),
            }
        ),
        link({"slug": "t", "supernodes": json.dumps([["only", *feats[10:14], errors[0]]])}),
        "https://www.neuronpedia.org/gemma-2-2b/graph?slug=u&pinnedIds=" + ",".join(feats[3:9]),  # raw commas
    ]
    theirs = run_peer(CT_DECODE, json.dumps(links))
    for url, ct in zip(links, theirs):
        view = read_view(url, g)
        assert {sn.name: [triple(g, m) for m in sn.members] for sn in view.supernodes} == ct["supernodes"]
        assert [triple(g, k) for k in view.pinned] == ct["pinned"]
        assert [triple(g, k) for k in view.pinned] == [triple(g, node_key(g, i)) for i in view.pinned_nodes]
    first = read_view(links[0], g)
    assert first.absent == ("1_45_4",) and first.slug == "s" and first.model == "gemma-2-2b"
    assert len(first.pinned_nodes) == 5 and all(ids[i] in links[0] for i in first.pinned_nodes)


def test_ids_of_circuit_tracers_export_name_the_nodes_it_wrote(tmp_path):
    """Every node id of a file circuit-tracer's create_graph_files wrote (its errors are
    `0_{layer}_{pos}`, its logits `{n_layers + 1}_{token}_{pos}`), pinned in a link and read against
    that file loaded here: each names the node whose fields circuit-tracer wrote beside the id."""
    g = layered_graph(5, n_pos=6)
    n = g.nodes
    n.feature[n.kind == "feature"] += N_LAYERS  # so that circuit-tracer's error ids name no feature
    data = json.loads(circuit_tracer_export(g, tmp_path, 0.8, 0.98).read_text())
    h = load_json(tmp_path / "ct" / "ct.json")
    kinds = {"cross layer transcoder": "feature", "mlp reconstruction error": "error"}
    kinds |= {"embedding": "embedding", "logit": "logit"}
    assert {"error", "logit", "embedding", "feature"} <= {kinds[d["feature_type"]] for d in data["nodes"]}
    view = read_view({"pinnedIds": [d["node_id"] for d in data["nodes"]]}, h)
    assert view.absent == () and len(view.pinned_nodes) == len(data["nodes"])
    for d, i in zip(data["nodes"], view.pinned_nodes):
        kind = kinds[d["feature_type"]]
        assert h.nodes.kind[i] == kind and h.nodes.position[i] == d["ctx_idx"], d["node_id"]
        if kind == "feature":
            assert cantor(int(h.nodes.layer[i]), int(h.nodes.feature[i])) == d["feature"]
        elif kind == "error":
            assert str(h.nodes.layer[i]) == d["layer"]
        elif kind == "logit":
            assert int(h.nodes.token[i]) == d["feature"] and str(h.nodes.layer[i] + 1) == d["layer"]
        else:
            assert int(h.nodes.token[i]) == int(d["node_id"].split("_")[1])


def dallas_austin_graph() -> Graph:
    """A graph holding the nodes of Neuronpedia's default gemma-2-2b view (26 layers, 11 tokens):
    every feature, embedding and logit its pinnedIds name, and one error; activations 1."""
    pinned = (
        "27_22605_10,20_15589_10,E_26865_9,21_5943_10,23_12237_10,20_15589_9,16_25_9,14_2268_9,18_8959_10,"
        "4_13154_9,7_6861_9,19_1445_10,E_2329_7,E_6037_4,0_13727_7,6_4012_7,17_7178_10,15_4494_4,6_4662_4,"
        "4_7671_4,3_13984_4,1_1000_4,19_7477_9,18_6101_10,16_4298_10,7_691_10"
    ).split(",")
    prompt = [2, 17534, 235292, 714, 6037, 576, 573, 2329, 10751, 26865, 603]  # the 3 E_ ids at 4, 7, 9
    rows = [("embedding", -1, p, -1, t) for p, t in enumerate(prompt)] + [("error", 5, 9, -1, -1)]
    for node_id in pinned:
        layer, feature, pos = (int(x) for x in node_id.replace("E_", "-1_").split("_"))
        if 0 <= layer < 26:
            rows.append(("feature", layer, pos, feature, -1))
    rows.sort(key=lambda r: (r[0] != "embedding", r[0] != "error", r[1], r[2], r[3]))
    rows.append(("logit", 26, 10, -1, 22605))
    kind, layer, pos, feat, tok = (np.array(c) for c in zip(*rows))
    return Graph(
        nodes=Nodes(
            kind=kind, layer=layer, position=pos, feature=feat, activation=np.ones(len(rows)), token=tok
        ),
        adjacency=np.zeros((len(rows), len(rows)), np.float32),
        prompt_ids=np.array(prompt),
        prompt_tokens=[f"t{t}" for t in prompt],
        logit_tokens=np.array([22605]),
        logit_probs=np.array([0.5]),
        logit_strings=[" Austin"],
        meta={"n_layers": 26},
    )


def test_neuronpedias_default_view():
    """The view Neuronpedia's graph page opens on gemma-fact-dallas-austin (page.tsx): its supernodes
    name features by `{layer}_{index}_{pos}`, its two clerps use schema 0's `{layer}{index:05d}`
    (`23_2312237_10` is L23/F12237 at 10); the sliders are 0.6 and 0.99. Members, pins and labels
    as worked out by hand from the page's ids."""
    g = dallas_austin_graph()
    query = {
        "slug": "gemma-fact-dallas-austin",
        "pinnedIds": "27_22605_10,E_26865_9,0_13727_7,15_4494_4",
        "supernodes": json.dumps(
            [
                ["capital", "15_4494_4", "6_4662_4", "4_7671_4", "3_13984_4", "1_1000_4"],
                ["state", "6_4012_7", "0_13727_7"],
                ["preposition followed by place name", "19_1445_10", "18_6101_10"],
            ]
        ),
        "clerps": json.dumps(
            [
                ["23_2312237_10", "Cities and states names (say Austin)"],
                ["18_1808959_10", "state/regional government"],
            ]
        ),
        "pruningThreshold": "0.6",
        "densityThreshold": "0.99",
    }
    url = "https://www.neuronpedia.org/gemma-2-2b/graph?" + urllib.parse.urlencode(query)  # spaces as '+'
    view = read_view(url, g)
    f = lambda layer, pos, index: NodeKey("feature", layer, pos, index)  # noqa: E731
    assert view.supernodes == (
        Supernode("capital", (f(15, 4, 4494), f(6, 4, 4662), f(4, 4, 7671), f(3, 4, 13984), f(1, 4, 1000))),
        Supernode("state", (f(6, 7, 4012), f(0, 7, 13727))),
        Supernode("preposition followed by place name", (f(19, 10, 1445), f(18, 10, 6101))),
    )
    assert view.pinned == (
        NodeKey("logit", 26, 10, -1),
        NodeKey("embedding", -1, 9, -1),
        f(0, 7, 13727),
        f(15, 4, 4494),
    )
    assert [g.nodes.kind[i] for i in view.pinned_nodes] == ["logit", "embedding", "feature", "feature"]
    assert view.labels == {
        f(23, 10, 12237): "Cities and states names (say Austin)",
        f(18, 10, 8959): "state/regional government",
    }
    assert (view.model, view.slug, view.node_threshold, view.density_threshold) == (
        "gemma-2-2b",
        "gemma-fact-dallas-austin",
        0.6,
        0.99,
    )
    assert view.absent == ()
    # the same view encoded twice (a link pasted through another URL), and as a bare query string
    twice = "https://www.neuronpedia.org/gemma-2-2b/graph?" + "&".join(
        f"{k}={urllib.parse.quote(urllib.parse.quote(v, safe=''), safe='')}" for k, v in query.items()
    )
    for other in (twice, urllib.parse.urlencode(query)):
        again = read_view(other, g)
        assert (
            again.supernodes == view.supernodes
            and again.labels == view.labels
            and again.pinned == view.pinned
        )
    # a logit the graph lacks (another token at the last position) is a logit key, not a layer-27 feature
    other_logit = read_view({"pinnedIds": "27_9999_10,27_22605_10"}, g)
    assert other_logit.pinned == (NodeKey("logit", 26, 10, -1),) * 2 and other_logit.absent == ("27_9999_10",)
    assert len(other_logit.pinned_nodes) == 1


def test_a_schema_1_clerp_and_attention_ids():
    """Clerps keyed by the Cantor pairing (schema 1, what circuit-tracer and our export write) and an
    attention feature's `A{layer}_{feature}_{pos}` with its offset feature number."""
    from attrgraph.graph.neuronpedia_features import ATTN_INDEX_OFFSET

    g = dallas_austin_graph()
    n = g.nodes
    i = int(np.flatnonzero((n.kind == "feature") & (n.layer == 20) & (n.position == 10))[0])
    n.site = np.where(
        np.arange(len(n)) == i, "attn", np.where(np.isin(n.kind, ("feature", "error")), "mlp", "")
    )
    view = read_view(
        {
            "pinnedIds": ["A20_15589_10"],
            "clerps": [
                ["20_" + str(ATTN_INDEX_OFFSET + cantor(20, 15589)) + "_10", "attention label"],
                [f"7_{cantor(7, 691)}_10", "schema 1"],
                ["E_9_9", "an embedding's clerp"],
                ["5_-1_9_mlp__err_idx_2", "an error's"],
                ["27_22605_10", "a logit's"],
            ],
        },
        g,
    )
    assert view.pinned == (NodeKey("feature", 20, 10, 15589, "attn"),) and list(view.pinned_nodes) == [i]
    assert view.labels == {
        NodeKey("feature", 20, 10, 15589, "attn"): "attention label",
        NodeKey("feature", 7, 10, 691): "schema 1",
    }


def test_circuit_tracers_error_ids_and_the_feature_they_shadow():
    """`0_{a}_{p}` (step 2): feature a of layer 0 when the graph holds it, else the error of layer a
    when it holds that, else the feature, as circuit-tracer's decoder reads it."""
    g = layered_graph(3)
    n = g.nodes
    i = int(np.flatnonzero((n.kind == "feature") & (n.layer == 0))[0])
    p, a = int(n.position[i]), int(n.feature[i])
    n.feature[i] = 1  # feature 1 of layer 0 at p: id 0_1_p, also circuit-tracer's id of the error (1, p)
    err = int(np.flatnonzero((n.kind == "error") & (n.layer == 1) & (n.position == p))[0])
    both = read_view({"pinnedIds": f"0_1_{p}"}, g)
    assert list(both.pinned_nodes) == [i] and both.pinned == (NodeKey("feature", 0, p, 1),)
    n.feature[i] = a
    error_only = read_view({"pinnedIds": f"0_1_{p}"}, g)
    assert list(error_only.pinned_nodes) == [err] and error_only.pinned == (NodeKey("error", 1, p, -1),)
    neither = read_view({"pinnedIds": f"0_1_{p},{node_ids(g)[0]}"}, g.subgraph(np.arange(g.n_nodes) != err))
    assert neither.pinned[0] == NodeKey("feature", 0, p, 1) and neither.absent == (f"0_1_{p}",)


def test_our_exports_view_reads_back_as_the_supernodes_it_was_given():
    """export's qParams (as a mapping, and as a link built from it) give back the supernodes export
    was given (members the exported graph lacks left out, as it leaves them out) and its pins."""
    g = layered_graph(4)
    feats = np.flatnonzero(g.nodes.kind == "feature")
    groups = [
        supernode(g, "early", feats[:3]),
        supernode(g, "late", feats[-2:]),
        supernode(g, "mixed", [0, feats[5]]),
    ]
    data, dropped = graph_to_json(g, slug="s", supernodes=groups)
    assert dropped == 0
    q = data["qParams"]
    url = link({"pinnedIds": ",".join(q["pinnedIds"]), "supernodes": json.dumps(q["supernodes"])})
    for source in (q, url):
        view = read_view(source, g)
        assert view.supernodes == tuple(groups)
        expected = [*feats[:3], *feats[-2:], 0, feats[5], *np.flatnonzero(g.nodes.kind == "logit")]
        assert list(view.pinned_nodes) == list(dict.fromkeys(int(x) for x in expected))


@pytest.mark.parametrize(
    "query, says",
    [
        ({"pinnedIds": "E_7_1"}, "is token 7 at position 1, but the graph's prompt has token"),
        ({"pinnedIds": "9_3_1"}, "names layer 9, but the graph's model has 2 layers"),
        ({"pinnedIds": "0_3_12"}, "position 12, past the graph's 5 prompt tokens"),
        ({"pinnedIds": "1_45_4,0_41_0"}, "none of the 2 nodes the link names is in this graph"),
        ({"pinnedIds": "1_x_4"}, "is none of Neuronpedia's forms"),
        ({"pinnedIds": "0_-5_1"}, "names feature -5"),
        ({"supernodes": '[["a", '}, "supernodes is not JSON"),
        ({"supernodes": '[["a", 3]]'}, "must be a list of lists of strings"),
        ({"supernodes": '[["lonely"]]'}, "has no members"),
        ({"clerps": '[["0_999999_1", "x"]]'}, "names feature number 999999, which is no feature of layer 0"),
        ({"clerps": '[["0_1_1"]]'}, "a clerp is [featureId, label]"),
        ({"subgraph": "cm9x"}, "names a subgraph saved on Neuronpedia (subgraph=cm9x)"),
        ({"slug": "s"}, "holds no pinnedIds, supernodes or clerps"),
        ({"pinnedIds": "0_1_1", "pruningThreshold": "high"}, "pruningThreshold is 'high'"),
    ],
)
def test_links_that_cannot_be_read_are_one_line(query, says):
    g = layered_graph(3)
    with pytest.raises(ViewError) as e:
        read_view(link(query), g)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_what_is_not_a_link_or_a_graph():
    g = layered_graph(3)
    with pytest.raises(
        ViewError, match="takes a graph URL, its query string or a qParams mapping, got a int"
    ):
        read_view(3, g)
    with pytest.raises(ViewError, match=r"the link is not a URL \(Invalid IPv6 URL"):
        read_view("https://www.neuronpedia.org[/gemma-2-2b/graph?pinnedIds=0_1_1", g)  # a pasting slip
    with pytest.raises(GraphError, match="read_view takes a Graph, got a str"):
        read_view(link({"pinnedIds": "0_1_1"}), "g.h5")


def test_repeated_names_stay_unique_when_a_counted_name_is_also_given():
    g = layered_graph(3)
    feats = [node_ids(g)[i] for i in np.flatnonzero(g.nodes.kind == "feature")]
    groups = [["a", feats[0]], ["a", feats[1]], ["a (2)", feats[2]], ["a", feats[3]]]
    view = read_view({"supernodes": groups}, g)
    assert [sn.name for sn in view.supernodes] == ["a", "a (2)", "a (2) (2)", "a (3)"]


# ------------------------------------------------------------------------------------ view_link
def test_a_link_written_here_is_read_by_circuit_tracer_and_back_here():
    """view_link of supernodes (one member the graph lacks), pins (a feature, an embedding, an
    error) and a label: circuit-tracer's decode_url_features reads the same nodes and names, and
    read_view gives back the supernodes, every pinned node and the label at each of its nodes."""
    from attrgraph.graph.shared_view import view_link

    g = layered_graph(7)
    n = g.nodes
    feats = np.flatnonzero(n.kind == "feature")
    err = int(np.flatnonzero(n.kind == "error")[3])
    gone = NodeKey("feature", 1, 4, 45)  # d_sae is 40 here: no such node
    groups = [supernode(g, "early", feats[:3]), Supernode("late", (node_key(g, int(feats[-1])), gone))]
    layer, feature = int(n.layer[feats[5]]), int(n.feature[feats[5]])
    url = view_link(g, groups, [int(feats[4]), 0, err], {(layer, feature): "my label"}, model="m", slug="s")
    assert url.startswith("https://www.neuronpedia.org/m/graph?slug=s&pinnedIds=")
    (ct,) = run_peer(CT_DECODE, json.dumps([url]))
    assert ct["supernodes"] == {sn.name: [triple(g, m) for m in sn.members] for sn in groups}
    pins = [node_key(g, int(feats[4])), node_key(g, 0), node_key(g, err)]
    pins += [m for sn in groups for m in sn.members]
    assert ct["pinned"] == [triple(g, k) for k in pins]
    view = read_view(url, g)
    assert view.supernodes == tuple(groups) and view.pinned == tuple(pins) and view.absent == ("1_45_4",)
    at = np.flatnonzero((n.kind == "feature") & (n.layer == layer) & (n.feature == feature))
    assert view.labels == {node_key(g, int(i)): "my label" for i in at} and len(at) >= 1
    # members given as intervene's (layer, position, feature): the same link
    plain = [Supernode(sn.name, [(m.layer, m.position, m.feature) for m in sn.members]) for sn in groups]
    assert (
        view_link(g, plain, [int(feats[4]), 0, err], {(layer, feature): "my label"}, model="m", slug="s")
        == url
    )


def test_circuit_tracers_error_ids_in_a_link():
    from attrgraph.graph.shared_view import view_link

    g = layered_graph(8)
    n = g.nodes
    n.feature[n.kind == "feature"] += N_LAYERS  # no feature of layer 0 shares an error's id
    errors = [int(i) for i in np.flatnonzero(n.kind == "error")[:4]]
    url = view_link(
        g, [supernode(g, "errs", errors)], model="gemma-2-2b", slug="x", error_ids="circuit-tracer"
    )
    keys = [node_key(g, i) for i in errors]
    assert f"0_{keys[0].layer}_{keys[0].position}" in urllib.parse.unquote(url)
    assert read_view(url, g).supernodes == (Supernode("errs", tuple(keys)),)


@pytest.mark.parametrize(
    "kwargs, says",
    [
        ({"error_ids": "mine"}, "error_ids is 'mine'; pass one of"),
        ({"slug": " "}, "slug is ' '; pass the Neuronpedia slug"),
        ({"pinned": [10**6]}, "pinned node 1000000 is not a node index"),
        ({"pinned": [True]}, "pinned node True is not a node index"),
        (
            {"supernodes": [Supernode("e", (NodeKey("error", 1, 99, -1),))]},
            "only a feature can be named without it",
        ),
        ({"labels": {"L0/F1": "x"}}, "label key 'L0/F1' is not a (layer, feature) pair"),
        ({"supernodes": "early"}, "supernodes is a str"),
    ],
)
def test_links_that_cannot_be_written_are_one_line(kwargs, says):
    from attrgraph.graph.shared_view import view_link

    g = layered_graph(7)
    args = {"model": "m", "slug": "s"} | kwargs
    with pytest.raises(Exception) as e:
        view_link(g, **args)
    assert says in str(e.value) and "\n" not in str(e.value)
    assert isinstance(e.value, (ViewError, SupernodeError))

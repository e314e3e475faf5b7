"""`attrgraph import-view LINK FILE[:NAME]` on a real attribution graph of a tiny model: a link made
of the node ids our export wrote (as Neuronpedia's page would hold them after grouping) is stored
as supernodes whose members are the nodes those ids stand for in the exported file, `export` then
writes the link's groups again, and the supernodes act in `intervene` as the features they name."""

import json
import urllib.parse

import numpy as np
import pytest
import torch

from attrgraph.cli import main
from attrgraph.graph.neuronpedia import export_json
from attrgraph.graph.neuronpedia_features import cantor
from attrgraph.graph.prune import prune_graph
from attrgraph.graph.store import load_graph, save_graph
from attrgraph.graph.supernode_store import load_supernodes, save_supernodes
from attrgraph.graph.supernodes import NodeKey, supernode
from tests.attrgraph.ag_helpers import tiny_model, tiny_transcoders

pytestmark = [
    pytest.mark.usefixtures("one_torch_thread"),
    pytest.mark.filterwarnings("ignore::attrgraph.errors.ExportWarning"),
]
PROMPT = [0, 5, 9, 3, 17, 22, 5, 9]


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    """A tiny GPT-2 with a PLT, `graph` (pruned) and `graph_full` stored, and the pruned graph's export."""
    from attrgraph.engine.attribute import attribute

    torch.set_num_threads(1)
    model = tiny_model("gpt2", dtype=torch.float32)
    tc = tiny_transcoders(model, "plt")
    full = attribute(model, tc, torch.tensor(PROMPT), progress=False)
    full.meta.update(model="tiny", transcoders="tiny-plt")
    pruned = prune_graph(full, 0.8, 0.98)
    root = tmp_path_factory.mktemp("view")
    save_graph(pruned, root / "g.h5", "graph")
    save_graph(full, root / "g.h5", "graph_full")
    data = json.loads(export_json(pruned, root / "site", slug="graph").path.read_text())
    return model, tc, root, data


def key_of(node: dict) -> NodeKey:
    """What an exported node stands for, read off its JSON fields (feature: inverse Cantor pairing)."""
    kind = {"cross layer transcoder": "feature", "mlp reconstruction error": "error"}.get(
        node["feature_type"]
    )
    kind = kind or node["feature_type"]
    if kind == "feature":
        z = node["feature"]
        w = int(((8 * z + 1) ** 0.5 - 1) // 2)
        index = z - w * (w + 1) // 2
        assert cantor(int(node["layer"]), index) == z
        return NodeKey("feature", int(node["layer"]), node["ctx_idx"], index)
    if kind == "embedding":
        return NodeKey("embedding", -1, node["ctx_idx"], -1)
    return NodeKey(kind, int(node["layer"]), node["ctx_idx"], -1)


def page_link(groups, pinned=()) -> str:
    query = {"slug": "graph", "pinnedIds": ",".join(pinned), "supernodes": json.dumps(groups)}
    return "https://www.neuronpedia.org/tiny/graph?" + urllib.parse.urlencode(query)


def groups_of(data: dict) -> list:
    by_kind = {}
    for node in data["nodes"]:
        by_kind.setdefault(node["feature_type"], []).append(node["node_id"])
    feats, errors = by_kind["cross layer transcoder"], by_kind["mlp reconstruction error"]
    return [["first", *feats[:3]], ["with an error", feats[-1], errors[0]], ["first", feats[3]]]


def test_the_links_supernodes_are_stored_and_exported_again(case, tmp_path, capsys):
    _, _, root, data = case
    path = tmp_path / "g.h5"
    path.write_bytes((root / "g.h5").read_bytes())
    groups = groups_of(data)
    node = {d["node_id"]: d for d in data["nodes"]}
    assert main(["import-view", page_link(groups, pinned=groups[0][1:]), str(path)]) == 0
    out = capsys.readouterr().out
    assert f"{path}:graph: stored 3 supernodes (6 members)" in out
    assert "not stored: 3 pinned nodes and 0 labels" in out
    stored = load_supernodes(path, "graph")
    assert [sn.name for sn in stored] == ["first", "with an error", "first (2)"]
    assert [list(sn.members) for sn in stored] == [[key_of(node[i]) for i in g[1:]] for g in groups]
    assert load_supernodes(path, "graph_full") == []
    assert main(["export", f"{path}:graph", "-o", str(tmp_path / "site")]) == 0
    again = json.loads((tmp_path / "site" / "graph.json").read_text())["qParams"]["supernodes"]
    assert again == [["first", *groups[0][1:]], groups[1], ["first (2)", *groups[2][1:]]]


def test_members_the_graph_lacks_are_left_out_as_the_viewer_requires(case, tmp_path, capsys):
    """A member pruned away here (a feature of the full graph only), and a supernode of such members
    alone: left out and said; what is stored passes the viewer's own check (so the page can save it)."""
    from attrgraph.viewer.supernode_request import check_members

    _, _, root, data = case
    path = tmp_path / "g.h5"
    path.write_bytes((root / "g.h5").read_bytes())
    pruned, full = load_graph(path, "graph"), load_graph(path, "graph_full")
    ids = {d["node_id"] for d in data["nodes"]}
    gone = [
        i
        for i in (
            f"{l}_{f}_{p}" for l, p, f in zip(full.nodes.layer, full.nodes.position, full.nodes.feature)
        )
    ]
    gone = [i for i, k in zip(gone, full.nodes.kind) if k == "feature" and i not in ids][:3]
    feats = [d["node_id"] for d in data["nodes"] if d["feature_type"] == "cross layer transcoder"]
    link = page_link([["kept", feats[0], gone[0]], ["pruned away", gone[1], gone[2]]])
    assert main(["import-view", link, str(path)]) == 0
    out = capsys.readouterr().out
    assert "stored 1 supernode (1 member)" in out
    assert "left out, not nodes of this graph: 3 members" in out
    assert "not stored, no member in this graph: 'pruned away'" in out
    stored = load_supernodes(path, "graph")
    assert [sn.name for sn in stored] == ["kept"] and len(stored[0].members) == 1
    check_members(pruned, stored)
    # into the full graph, the same link keeps every member
    assert main(["import-view", link, f"{path}:graph_full"]) == 0
    assert [len(sn.members) for sn in load_supernodes(path, "graph_full")] == [2, 2]


def test_a_node_in_two_supernodes_or_a_name_hdf5_cannot_hold_is_refused(case, tmp_path, capsys):
    _, _, root, data = case
    feats = [d["node_id"] for d in data["nodes"] if d["feature_type"] == "cross layer transcoder"]
    before = (root / "g.h5").read_bytes()
    for groups, says in [
        (
            [["a", feats[0], feats[1]], ["b", feats[1]]],
            "is in supernodes 'a' and 'b'; a node may belong to one",
        ),
        ([["nul\x00name", feats[0]]], "holds a NUL or a lone surrogate"),
        ([["gone", "1_9999_3"]], "none of the link's 1 supernode has a member in"),
    ]:
        link = page_link(groups, pinned=[feats[0]])  # json.dumps writes the NUL as \u0000
        assert main(["import-view", link, str(root / "g.h5")]) == 2
        err = capsys.readouterr().err.strip()
        assert says in err and "\n" not in err
    assert (root / "g.h5").read_bytes() == before


def test_supernodes_there_already_are_replaced_only_when_asked(case, tmp_path, capsys):
    _, _, root, data = case
    path = tmp_path / "g.h5"
    path.write_bytes((root / "g.h5").read_bytes())
    g = load_graph(path, "graph")
    save_supernodes(path, [supernode(g, "mine", [0])], "graph")
    url = page_link(groups_of(data))
    assert main(["import-view", url, f"{path}:graph"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"attrgraph import-view: error: {path}:graph already has 1 supernode ('mine'); pass --replace to "
        "replace them with the link's."
    )
    assert [sn.name for sn in load_supernodes(path, "graph")] == ["mine"]
    assert main(["import-view", url, f"{path}:graph", "--replace"]) == 0
    assert "replacing 1" in capsys.readouterr().out
    assert [sn.name for sn in load_supernodes(path, "graph")] == ["first", "with an error", "first (2)"]


def test_a_graph_json_with_a_view_is_read_as_its_link(case, tmp_path, capsys):
    """A graph JSON whose qParams hold supernodes (our export, or a file made for Neuronpedia's upload)."""
    _, _, root, _ = case
    path = tmp_path / "g.h5"
    path.write_bytes((root / "g.h5").read_bytes())
    g = load_graph(path, "graph_full")
    feats = np.flatnonzero(g.nodes.kind == "feature")
    given = [supernode(g, "pair", feats[:2]), supernode(g, "one", feats[2:3])]
    written = export_json(g, tmp_path / "site", slug="full", supernodes=given).path
    assert main(["import-view", str(written), f"{path}:graph_full"]) == 0
    assert load_supernodes(path, "graph_full") == given


@pytest.mark.parametrize(
    "args, says",
    [
        (["{link}", "{path}:nope"], "has no graph named 'nope'"),
        (["{link}", "{root}/missing.h5"], "missing.h5 does not exist"),
        (
            ["https://www.neuronpedia.org/tiny/graph?pinnedIds=E_0_0", "{path}"],
            "the link holds no supernodes",
        ),
        (
            ["https://www.neuronpedia.org/tiny/graph?pinnedIds=E_7_0", "{path}"],
            "the link shows another prompt",
        ),
        (["{root}/site/graph-metadata.json", "{path}"], "holds no qParams"),
    ],
)
def test_what_cannot_be_imported_is_one_line(case, capsys, args, says):
    _, _, root, data = case
    fill = {"link": page_link(groups_of(data)), "path": root / "g.h5", "root": root}
    before = (root / "g.h5").read_bytes()
    assert main(["import-view", *(a.format(**fill) for a in args)]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "\n" not in err and err.startswith("attrgraph import-view: error: ")
    assert (root / "g.h5").read_bytes() == before


def test_a_file_of_several_graphs_needs_a_name(case, tmp_path, capsys):
    _, _, root, data = case
    path = tmp_path / "two.h5"
    g = load_graph(root / "g.h5", "graph")
    save_graph(g, path, "a")
    save_graph(g, path, "b")
    assert main(["import-view", page_link(groups_of(data)), str(path)]) == 2
    assert "holds 2 graphs (['a', 'b']); name one as" in capsys.readouterr().err


def test_a_links_supernode_acts_in_intervene_as_the_features_it_names(case):
    """Ablating a supernode read from the link changes the logits exactly as ablating the
    (layer, position, feature) triples parsed by hand from the link's ids."""
    from attrgraph.analysis.intervene import intervene
    from attrgraph.graph.shared_view import read_view

    model, tc, root, data = case
    feats = [d["node_id"] for d in data["nodes"] if d["feature_type"] == "cross layer transcoder"][:4]
    view = read_view(page_link([["four", *feats]]), load_graph(root / "g.h5", "graph"))
    triples = [tuple(int(x) for x in f.split("_")) for f in feats]  # (layer, feature, position)
    by_hand = intervene(model, tc, PROMPT, {(layer, pos, feat): 0.0 for layer, feat, pos in triples})
    by_view = intervene(model, tc, PROMPT, {view.supernodes[0]: 0.0})
    clean = intervene(model, tc, PROMPT, {})
    assert not torch.equal(by_hand.logits, clean.logits)
    assert torch.equal(by_view.logits, by_hand.logits)

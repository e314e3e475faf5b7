"""Supernodes: the frac_external adjacency on a hand-built graph, suggestions, HDF5 round trip."""

import numpy as np
import pytest

from attrgraph.errors import GraphFileError, SupernodeError
from attrgraph.graph.store import save_graph
from attrgraph.graph.supernode_store import load_supernodes, save_supernodes
from attrgraph.graph.supernodes import (
    NodeKey,
    Supernode,
    node_indices,
    suggest_supernodes,
    supernode,
    supernode_adjacency,
)
from tests.attrgraph.ag_helpers import graph_from_dense, tiny_model, tiny_transcoders


def hand_graph():
    kinds = ["embedding", "embedding", "feature", "feature", "feature", "logit"]
    A = np.zeros((6, 6))
    A[2, 0], A[2, 1] = 1.0, -1.0
    A[3, 0], A[3, 2] = 2.0, 2.0
    A[4, 2], A[4, 3] = 1.0, 3.0
    A[5, 4], A[5, 3] = 2.0, -2.0
    return graph_from_dense(kinds, A, layers=[-1, -1, 0, 0, 1, 2], positions=[0, 1, 1, 1, 1, 1])


def test_frac_external_adjacency_by_hand():
    g = hand_graph()
    sg = supernode_adjacency(g, [supernode(g, "X", [2, 3])])
    np.testing.assert_allclose(sg.frac_external, [0, 0, 1.0, 0.5, 1.0, 1.0])
    name = {n: i for i, n in enumerate(sg.names)}
    X, e0, e1, f4 = name["X"], name[g.label(0)], name[g.label(1)], name[g.label(4)]
    lg = name[g.label(5)]
    S = sg.adjacency
    assert S[X, e0] == pytest.approx(0.5)  # (1 * 0.5 + 0.5 * 0.5) / 1.5
    assert S[X, e1] == pytest.approx(-1 / 3)  # (1 * -0.5 + 0.5 * 0) / 1.5
    assert S[f4, X] == pytest.approx(1.0)
    assert S[lg, X] == pytest.approx(-0.5) and S[lg, f4] == pytest.approx(0.5)
    assert S[X, X] == 0.0
    # without supernodes the supernode graph is the input-normalized adjacency itself
    plain = supernode_adjacency(g, []).adjacency
    A = g.dense().astype(np.float64)
    sums = np.abs(A).sum(1, keepdims=True)
    np.testing.assert_allclose(plain, A / np.where(sums > 0, sums, 1.0))


def test_grouping_errors():
    g = hand_graph()
    with pytest.raises(SupernodeError, match="one supernode"):
        supernode_adjacency(g, [supernode(g, "a", [2, 3]), supernode(g, "b", [3, 4])])
    with pytest.raises(SupernodeError, match="not in this graph"):
        node_indices(g, Supernode("z", (NodeKey("feature", 7, 0, 3),)))
    with pytest.raises(SupernodeError, match="no members"):
        Supernode("empty", ())


def test_members_given_as_intervene_keys_become_node_keys():
    """A feature's (layer, position, feature), as `intervene` takes it, or a NodeKey's fields (as
    JSON gives them back): the same supernode as one of NodeKeys, found in the graph by index."""
    g = hand_graph()
    by_index = supernode(g, "X", [2, 3])
    assert Supernode("X", ((0, 1, 2), (0, 1, 3))) == Supernode(
        "X", (NodeKey("feature", 0, 1, 2), by_index.members[1])
    )
    assert by_index.members == (NodeKey("feature", 0, 1, 2), NodeKey("feature", 0, 1, 3))
    assert Supernode("X", [(0, 1, 2), ["feature", 0, 1, 3, "mlp"]]) == by_index
    assert Supernode("E", (("error", 1, 2),)).members == (NodeKey("error", 1, 2, -1, "mlp"),)
    assert node_indices(g, Supernode("X", [(np.int64(0), 1, 3)])).tolist() == [3]
    for members, says in [
        ("abc", "has members 'abc'"),
        (5, "has members 5"),
        (((0, 1.5, 2),), r"member \(0, 1.5, 2\) is not a node key"),
        ((NodeKey("neuron", 0, 1, 2),), "member NodeKey\\(kind='neuron'"),
        ((("feature", 0, 1, 2, "resid"),), "is not a node key"),
        (((True, 1, 2),), "is not a node key"),
    ]:
        with pytest.raises(SupernodeError, match=says) as e:
            Supernode("bad", members)
        assert "\n" not in str(e.value)


def test_suggestions_by_edges_and_by_decoder():
    kinds = ["embedding"] * 3 + ["feature"] * 4 + ["logit"]
    A = np.zeros((8, 8))
    A[3, :3] = [1.0, 2.0, 0.0]
    A[4, :3] = [2.0, 4.0, 0.0]  # same input profile as node 3
    A[5, :3] = [0.0, 0.0, 1.0]
    A[6, 3:6] = [1.0, 1.0, 1.0]
    A[7, 6] = 1.0
    A[7, 5] = 5.0
    g = graph_from_dense(kinds, A, layers=[-1] * 3 + [0, 0, 0, 1, 2])
    groups = suggest_supernodes(g, by="edges", threshold=0.95)
    assert [sorted(node_indices(g, s).tolist()) for s in groups] == [[3, 4]]

    model = tiny_model("gpt2", n_layers=2)
    tc = tiny_transcoders(model, "clt")
    import torch

    with torch.no_grad():
        tc.W_dec[0][5] = 2.0 * tc.W_dec[0][1]
    kinds = ["embedding", "feature", "feature", "feature", "logit"]
    A = np.zeros((5, 5))
    A[1:4, 0] = 1.0
    A[4, 1:4] = 1.0
    g = graph_from_dense(kinds, A, layers=[-1, 0, 0, 0, 2])
    g.nodes.feature[1:4] = [1, 5, 7]
    groups = suggest_supernodes(g, by="decoder", transcoders=tc, threshold=0.99)
    assert [sorted(node_indices(g, s).tolist()) for s in groups] == [[1, 2]]
    with pytest.raises(SupernodeError, match="transcoders"):
        suggest_supernodes(g, by="decoder")


def test_storage_round_trip(tmp_path):
    g = hand_graph()
    path = tmp_path / "g.h5"
    save_graph(g, path, "ioi")
    sns = [supernode(g, "X", [2, 3]), supernode(g, "say out", [4])]
    save_supernodes(path, sns, "ioi")
    save_graph(g, path, "other")  # adding a graph keeps the supernodes
    back = load_supernodes(path, "ioi")
    assert back == sns
    assert load_supernodes(path, "other") == []
    with pytest.raises(GraphFileError, match="no graph named"):
        save_supernodes(path, sns, "missing")


def test_attention_features_in_suggestions_and_storage(tmp_path):
    """Attention features' decoder directions come from the attention set and never group with an
    MLP feature of the same index; stored supernodes keep their members' sites."""
    import torch

    from tests.attrgraph.ag_helpers import tiny_attn_saes

    model = tiny_model("gpt2", n_layers=2)
    tc, sae = tiny_transcoders(model, "plt"), tiny_attn_saes(model)
    with torch.no_grad():
        sae.W_dec[0][5] = 2.0 * sae.W_dec[0][1]
        tc.W_dec[0][1] = sae.W_dec[0][1]  # an MLP feature with the same direction as attention feature 1
    kinds = ["embedding", "feature", "feature", "feature", "feature", "logit"]
    A = np.zeros((6, 6))
    A[1:5, 0] = 1.0
    A[5, 1:5] = 1.0
    g = graph_from_dense(kinds, A, layers=[-1, 0, 0, 0, 0, 2])
    g.nodes.feature[1:5] = [1, 5, 7, 1]
    g.nodes.site[1:5] = ["attn", "attn", "attn", "mlp"]
    groups = suggest_supernodes(g, by="decoder", transcoders=[tc, sae], threshold=0.99)
    assert [sorted(node_indices(g, s).tolist()) for s in groups] == [[1, 2]]
    assert all(m.site == "attn" for m in groups[0].members)
    with pytest.raises(SupernodeError, match="attention features"):
        suggest_supernodes(g, by="decoder", transcoders=tc)
    path = tmp_path / "g.h5"
    save_graph(g, path)
    save_supernodes(path, groups)
    assert load_supernodes(path) == groups

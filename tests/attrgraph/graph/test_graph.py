"""The Graph dataclass: node order constant, validation, subgraphs."""

import numpy as np
import pytest

from attrgraph.errors import GraphError
from attrgraph.graph.graph import NODE_ORDER, Graph


def test_attributed_graph_follows_the_documented_node_order():
    """graph.py step 3 on a real graph: embeddings by position, errors by (layer, position), the
    active features by (layer, position, feature), logits by descending probability; every edge
    runs from a lower index to a higher one. The active features are recomputed here from the
    transcoders' weights on what each MLP receives."""
    import torch

    from attrgraph.engine.attribute import attribute
    from tests.attrgraph.ag_helpers import tiny_model, tiny_transcoders

    tokens = [3, 17, 5, 9, 17, 5]
    model = tiny_model("gpt2", n_layers=2)
    tc = tiny_transcoders(model, "plt")
    P, L = len(tokens), 2
    inputs = {}
    handles = [
        model.blocks[l].mlp.register_forward_pre_hook(lambda m, a, l=l: inputs.__setitem__(l, a[0][0]))
        for l in range(L)
    ]
    with torch.no_grad():
        model(torch.tensor([tokens]))
    for h in handles:
        h.remove()
    active = [
        (l, p, f)
        for l in range(L)
        for p, f in torch.nonzero(inputs[l].to(tc.W_enc) @ tc.W_enc[l] + tc.b_enc[l] > 0).tolist()
    ]

    g = attribute(model, tc, tokens, exclude_bos=False)
    n = g.nodes
    n_logit = len(g.logit_tokens)
    kinds = ["embedding"] * P + ["error"] * (L * P) + ["feature"] * len(active) + ["logit"] * n_logit
    assert n.kind.tolist() == kinds
    assert list(NODE_ORDER) == list(dict.fromkeys(kinds))
    emb, err = slice(0, P), slice(P, P + L * P)
    feat, logit = slice(P + L * P, P + L * P + len(active)), slice(P + L * P + len(active), None)
    assert n.position[emb].tolist() == list(range(P)) and n.token[emb].tolist() == tokens
    assert list(zip(n.layer[err].tolist(), n.position[err].tolist())) == [
        (l, p) for l in range(L) for p in range(P)
    ]
    assert list(zip(n.layer[feat].tolist(), n.position[feat].tolist(), n.feature[feat].tolist())) == active
    assert (n.layer[logit] == L).all() and (n.position[logit] == P - 1).all()
    assert (np.diff(g.logit_probs) <= 0).all() and n.token[logit].tolist() == g.logit_tokens.tolist()
    A = g.adjacency.tocoo()
    assert A.nnz > 0 and (A.col < A.row).all()


def test_graph_rejects_nodes_out_of_order(make_graph_from_dense):
    with pytest.raises(GraphError, match="NODE_ORDER"):
        make_graph_from_dense(["feature", "embedding", "logit"], np.zeros((3, 3)))


def test_graph_rejects_wrong_adjacency_shape(make_graph_from_dense):
    g = make_graph_from_dense(["embedding", "logit"], np.zeros((2, 2)))
    with pytest.raises(GraphError, match="square"):
        Graph(
            nodes=g.nodes,
            adjacency=np.zeros((2, 3)),
            prompt_ids=g.prompt_ids,
            prompt_tokens=g.prompt_tokens,
            logit_tokens=g.logit_tokens,
            logit_probs=g.logit_probs,
        )


def test_subgraph_and_sizes(make_random_graph):
    g = make_random_graph(0)
    assert g.n_nodes == 30 and g.n_features == 20
    assert g.n_edges == np.count_nonzero(g.dense())
    keep = np.ones(g.n_nodes, bool)
    keep[[10, 11]] = False  # two features
    s = g.subgraph(keep)
    np.testing.assert_array_equal(s.dense(), g.dense()[keep][:, keep])
    assert s.n_features == 18
    assert g.label(0).startswith("emb@") and g.label(g.n_nodes - 1).startswith("logit")

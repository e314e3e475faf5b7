"""The Graph dataclass: node order constant, validation, subgraphs."""

import numpy as np
import pytest

from attrgraph.errors import GraphError
from attrgraph.graph.graph import NODE_ORDER, Graph


def test_node_order_constant():
    assert NODE_ORDER == ("embedding", "error", "feature", "logit")


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

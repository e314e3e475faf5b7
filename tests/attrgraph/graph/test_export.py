"""networkx export: same nodes, edges and weights as the adjacency."""

import numpy as np

from attrgraph.graph.export import to_networkx


def test_to_networkx_matches_adjacency(make_random_graph):
    g = make_random_graph(0)
    G = to_networkx(g)
    A = g.dense()
    assert G.number_of_nodes() == g.n_nodes
    assert G.number_of_edges() == np.count_nonzero(A)
    t, s = np.nonzero(A)
    for ti, si in list(zip(t, s))[:50]:
        assert G.edges[int(si), int(ti)]["weight"] == A[ti, si]
    node = G.nodes[10]
    assert node["kind"] == "feature" and node["layer"] == g.nodes.layer[10]
    assert "label" in node and G.graph["logit_tokens"] == g.logit_tokens.tolist()

"""The summary of a graph: sizes, logits, top features, scores (given or computed)."""

from attrgraph.graph.scores import GraphScores, compute_graph_scores
from attrgraph.graph.summary import summarize
from tests.attrgraph.ag_helpers import random_graph


def test_scores_are_computed_unless_given():
    g = random_graph(0, n_feat=30)
    s = summarize(g)
    assert (s["n_nodes"], s["n_edges"], s["n_features"]) == (g.n_nodes, g.n_edges, 30)
    want = compute_graph_scores(g)
    assert s["replacement_score"] == round(want.replacement, 6)
    assert s["completeness_score"] == round(want.completeness, 6)
    given = summarize(g, scores=GraphScores(0.25, 0.5))  # attribute's, in the build command
    assert (given["replacement_score"], given["completeness_score"]) == (0.25, 0.5)

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


def test_nan_is_never_turned_into_a_score():
    """Bad input round 2: a graph holding NaN (stored by a version that did not refuse it) has no
    scores, says how many values are NaN, and its --json output is plain JSON (no NaN token)."""
    import json

    import numpy as np

    from attrgraph.graph.summary import format_summary

    g = random_graph(0, n_feat=30)
    g.adjacency.data[:4] = np.nan
    g.nodes.influence = np.full(g.n_nodes, np.nan)
    g.nodes.activation[g.nodes.kind == "feature"] = np.nan
    scores = compute_graph_scores(g)
    assert np.isnan(scores.replacement) and np.isnan(scores.completeness)
    s = summarize(g)
    assert s["replacement_score"] is None and s["completeness_score"] is None
    assert s["non_finite"] == {"edges": 4, "activations": 30}
    json.dumps(s, allow_nan=False)
    text = format_summary(s)
    assert "scores: not defined" in text and "1.000" not in text and "NaN or inf values: 4 edges" in text
    assert "non_finite" not in summarize(random_graph(0, n_feat=30))  # a finite graph: as before

"""Graph scores: known answers on hand-built graphs and the dense formula (circuit-tracer's) on random ones."""

import tracemalloc

import numpy as np
import pytest

from attrgraph.graph.prune import prune_graph
from attrgraph.graph.scores import compute_graph_scores
from tests.attrgraph.ag_helpers import graph_from_dense, large_graph, random_graph


def dense_scores(graph):
    """circuit-tracer's compute_graph_scores, written with a dense inverse."""
    A = np.abs(graph.dense().astype(np.float64))
    s = A.sum(1, keepdims=True)
    A = np.divide(A, s, out=np.zeros_like(A), where=s > 0)
    w = graph.logit_weights()
    influence = (np.linalg.inv(np.eye(len(A)) - A) - np.eye(len(A))).T @ w
    k = graph.nodes.kind
    tok, err = influence[k == "embedding"].sum(), influence[k == "error"].sum()
    out = influence + w
    return tok / (tok + err), ((1 - A[:, k == "error"].sum(1)) * out).sum() / out.sum()


@pytest.mark.parametrize("seed", range(4))
def test_scores_equal_dense_formula(seed):
    g = random_graph(seed)
    got = compute_graph_scores(g)
    want = dense_scores(g)
    np.testing.assert_allclose([got.replacement, got.completeness], want, rtol=1e-10)
    assert 0 < got.replacement < 1 and 0 < got.completeness < 1
    p = prune_graph(g, 0.5, 0.9)
    np.testing.assert_allclose(list(compute_graph_scores(p)), dense_scores(p), rtol=1e-10)


def test_scores_known_answers():
    kinds = ["embedding", "error", "feature", "logit"]
    # emb -> feature (weight 3), error -> feature (weight -1), feature -> logit (2): feature row is 3/4 non-error
    A = np.zeros((4, 4))
    A[2, 0], A[2, 1], A[3, 2] = 3.0, -1.0, 2.0
    s = compute_graph_scores(graph_from_dense(kinds, A, logit_probs=[1.0]))
    # influence: feature 1, emb 0.75, error 0.25 -> replacement 0.75
    assert s.replacement == pytest.approx(0.75)
    # weights I + w: emb .75, err .25, feature 1, logit 1; non-error share 1, 1, .75, 1
    assert s.completeness == pytest.approx((0.75 + 0.25 + 0.75 + 1) / 3.0)
    A[2, 1] = 0.0
    s = compute_graph_scores(graph_from_dense(kinds, A, logit_probs=[1.0]))
    assert s == (1.0, 1.0)


def test_scores_count_attention_errors_as_errors():
    from tests.attrgraph.ag_helpers import attention_graph

    g = attention_graph()[0]
    got = compute_graph_scores(g)
    np.testing.assert_allclose([got.replacement, got.completeness], dense_scores(g), rtol=1e-8)
    np.testing.assert_allclose(
        [g.meta["unpruned_replacement_score"], g.meta["unpruned_completeness_score"]],
        dense_scores(g),
        rtol=1e-6,
    )
    # treating the attention errors as features would give other scores
    g.nodes.kind[g.nodes.mask("error", "attn")] = "feature"
    assert not np.allclose(dense_scores(g), [got.replacement, got.completeness])


def test_scores_make_no_copy_of_the_adjacency():
    """One streamed pass: numpy allocations stay far below one copy of the edge values (the dense
    path made a float64 copy, and scipy's solve copied that again)."""
    g = large_graph()
    tracemalloc.start()
    got = compute_graph_scores(g)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < g.adjacency.data.nbytes / 2, (peak, g.adjacency.data.nbytes)
    assert 0 < got.replacement <= 1 and 0 < got.completeness <= 1

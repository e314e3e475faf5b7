"""The streamed influence pass equals prune.compute_influence (and scores.py's error shares)."""

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from attrgraph.engine.attribute import attribute
from attrgraph.errors import GraphError
from attrgraph.graph.prune import compute_influence, normalize_matrix
from attrgraph.graph.streamed_influence import (
    InfluenceSolve,
    layer_blocks,
    logit_influence,
    row_blocks,
    streamed_influence,
)
from tests.attrgraph.ag_helpers import random_graph, tiny_model, tiny_transcoders


def reference(g):
    A = normalize_matrix(g.adjacency)
    return compute_influence(A, g.logit_weights()), A @ (g.nodes.kind == "error").astype(float)


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("chunk", [3, 10**6])
def test_equals_dense_path_on_random_graphs(seed, chunk):
    g = random_graph(seed, n_feat=30)
    blocks = [(i, i + 1) for i in range(g.n_nodes)]  # one row per block is always valid
    got = streamed_influence(
        g.adjacency, g.logit_weights(), blocks, g.nodes.kind == "error", chunk_edges=chunk
    )
    want, err = reference(g)
    np.testing.assert_allclose(got.influence, want, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(got.error_share, err, rtol=1e-12, atol=1e-15)
    with pytest.raises(GraphError, match="own block"):
        streamed_influence(g.adjacency, g.logit_weights(), [(0, g.n_nodes)])


def test_equals_dense_path_on_an_attribution_graph():
    model = tiny_model("gpt2", n_layers=3)
    g = attribute(model, tiny_transcoders(model, "clt"), torch.tensor([0, 5, 9, 3, 17, 22, 5, 9]))
    blocks = layer_blocks(g.nodes)
    assert len(blocks) == 1 + 3 + 3 + 1  # embeddings, errors of 3 layers, features of 3 layers, logits
    got = streamed_influence(g.adjacency, g.logit_weights(), blocks, g.nodes.kind == "error", chunk_edges=50)
    want, err = reference(g)
    np.testing.assert_allclose(got.influence, want, rtol=1e-10, atol=1e-14)
    np.testing.assert_allclose(got.error_share, err, rtol=1e-10, atol=1e-14)


def test_row_blocks_known_answer():
    """Rows 0-1 have no inputs; row 2 reads 0 (a new block at 2); row 3 reads 1 < 2 (joins it);
    row 4 reads 3 >= 2 (a new block at 4); row 5 reads 2 < 4 (joins it); row 6 reads 5 (new)."""
    edges = [(2, 0), (3, 1), (4, 3), (5, 2), (6, 5)]
    rows, cols = zip(*edges)
    A = sp.csr_array((np.ones(len(edges)), (rows, cols)), shape=(7, 7))
    assert row_blocks(A) == [(0, 2), (2, 4), (4, 6), (6, 7)]
    with pytest.raises(GraphError, match="strictly lower-triangular"):
        row_blocks(sp.csr_array((np.ones(1), ([3], [3])), shape=(7, 7)))
    # rows 0-9 empty; 10 reads 0 (new); 11-74 read 5 (join); 75, the first row of row_blocks' second
    # search window after 10, reads 10 (new); 76-99 read 5 (join)
    edges = [(10, 0)] + [(r, 5) for r in range(11, 75)] + [(75, 10)] + [(r, 5) for r in range(76, 100)]
    rows, cols = zip(*edges)
    A = sp.csr_array((np.ones(len(edges)), (rows, cols)), shape=(100, 100))
    assert row_blocks(A) == [(0, 10), (10, 75), (75, 100)]


def row_blocks_one_row_at_a_time(A):
    """row_blocks' rule as a plain loop: a row starts a new block when it reads a column at or
    after the current block's start."""
    A = sp.csr_array(A)
    starts = [0]
    for r in range(A.shape[0]):
        cols = A.indices[A.indptr[r] : A.indptr[r + 1]]
        if len(cols) and cols.max() >= starts[-1]:
            starts.append(r)
    return list(zip(starts, starts[1:] + [A.shape[0]]))


@pytest.mark.parametrize("seed", range(8))
def test_row_blocks_equals_the_row_by_row_rule(seed):
    """On random strictly lower-triangular matrices (blocks of 1 to ~300 rows, so that the search
    windows of 64 rows and more are crossed; empty rows; indices sorted or not)."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, [3, 20, 300][seed % 3], size=int(rng.integers(1, 12)))
    starts = np.concatenate([[0], np.cumsum(sizes)])
    n = int(starts[-1])
    rows, cols = [], []
    for b in range(1, len(sizes)):
        for r in range(starts[b], starts[b + 1]):
            k = int(rng.integers(0, 4))  # some rows stay empty
            rows += [r] * k
            cols += rng.integers(0, starts[b], size=k).tolist()
    A = sp.csr_array((np.ones(len(rows)), (rows, cols)), shape=(n, n))
    want = row_blocks_one_row_at_a_time(A)
    assert row_blocks(A) == want
    assert len(want) > 1 or n < 3
    shuffled = sp.csr_array(A, copy=True)  # the same rows with their indices reversed
    for r in range(n):
        p0, p1 = shuffled.indptr[r], shuffled.indptr[r + 1]
        shuffled.indices[p0:p1] = shuffled.indices[p0:p1][::-1].copy()
    shuffled = sp.csr_array((shuffled.data, shuffled.indices, shuffled.indptr), shape=(n, n))
    assert row_blocks(shuffled) == want
    assert not shuffled.has_sorted_indices or n < 20  # the reduceat branch of _max_columns
    with pytest.raises(GraphError, match="not square"):
        row_blocks(sp.csr_array((n, n + 1)))


def test_rows_fed_block_by_block_in_any_grouping():
    """InfluenceSolve: a graph's rows given a few at a time, blocks from the last down, rows of a
    block in any order and grouping (empty rows between), equal the one-call pass; the result does
    not depend on the rows being kept."""
    g = random_graph(1, n_feat=40, density=0.3)
    w, is_error = g.logit_weights(), g.nodes.kind == "error"
    blocks = row_blocks(g.adjacency)
    want = streamed_influence(g.adjacency, w, blocks, is_error)
    solve = InfluenceSolve(w, is_error, chunk_edges=4)
    rng = np.random.default_rng(0)
    for b0, b1 in reversed(blocks):
        solve.start_block(b0, b1)
        nodes = rng.permutation(np.arange(b0, b1))
        for group in np.array_split(nodes, rng.integers(1, 4)):
            group = np.sort(group)
            solve.add_rows(group, g.adjacency[group].copy())  # a copy, as a rows engine gives
    got = solve.result()
    np.testing.assert_allclose(got.influence, want.influence, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(got.error_share, want.error_share, rtol=1e-12, atol=1e-15)


def test_influence_solve_refuses_blocks_out_of_order():
    g = random_graph(2)
    blocks = row_blocks(g.adjacency)
    solve = InfluenceSolve(g.logit_weights())
    b0, b1 = blocks[-2]
    solve.start_block(b0, b1)
    with pytest.raises(GraphError, match="from the last down"):
        solve.start_block(*blocks[-1])
    last = np.arange(*blocks[-1])
    with pytest.raises(GraphError, match="outside the current block"):
        solve.add_rows(last, g.adjacency[last])


def test_logit_influence_sums_duplicates_before_the_absolute_value():
    """A -> B stored as two entries +3 and -1 is one edge of weight 2 (normalize_matrix's rule)."""
    kinds = np.array(["embedding", "feature", "logit"])
    A = sp.csr_array((np.array([3.0, -1.0, 1.0]), np.array([0, 0, 1]), np.array([0, 0, 2, 3])), shape=(3, 3))
    assert not A.has_canonical_format
    w = np.array([0.0, 0.0, 1.0])
    got = logit_influence(A, w, kinds == "error").influence
    np.testing.assert_allclose(got, compute_influence(normalize_matrix(A), w))
    np.testing.assert_allclose(got, [1.0, 1.0, 0.0])

"""Logit influence and error shares of a large graph in one streamed pass over its rows.

Seed: circuit-tracing appendix, "Graph Pruning". The same numbers as `prune.compute_influence`
on `prune.normalize_matrix(adjacency)` (and as scores.py), without materializing the normalized
matrix, its transpose or `I - A`: on a graph of ~10^4 features the adjacency holds ~3 10^7 edges,
and those copies would triple the peak memory of `attribute`.

1. Blocks: contiguous row ranges whose rows have no edge from inside their own block or from a
   later row (`layer_blocks`: the features of one layer and site, the logits; embeddings and errors have
   no rows; `row_blocks`: the greedy split of any strictly lower-triangular matrix, which is
   the layer split or finer). Every edge goes from a lower block to a higher one.
2. `z = (I - A)^-T w` solved block by block from the last: `z_B = w_B + acc_B`, then every edge
   `t -> s` of block B adds `|A[t, s]| / rowsum_t * z_t` to `acc_s` (per chunk of rows: the row
   sums, then one transposed sparse product of the chunk's |values| in float64; the
   normalization `1 / rowsum_t` is applied on the fly). Influence is `z - w`.
3. In the same pass, each row's share of |input| that comes from error nodes (scores.py step 3).
4. The rows may also come as several CSR matrices whose rows belong to given nodes
   (`streamed_influence_rows`; adaptive.py keeps the rows of the explored nodes that way); nodes
   without a row have no inputs. Within a block the order of rows does not matter, so a caller
   may compute them as it goes and drop them (`InfluenceSolve`; pruned_build.py).
Peak extra memory: a few arrays of the size of one chunk of edges (`chunk_edges`). With
`progress=True` a tqdm bar counts the edges done. Cost: 5.2 10^5 edges in 0.84x one scipy
triangular solve on the normalized matrix already built (benchmarks/influence.py).
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp
from jaxtyping import Float, Int
from tqdm import tqdm

from attrgraph.errors import GraphError
from attrgraph.graph.graph import Nodes


class StreamedInfluence(NamedTuple):
    """What one streamed pass computes."""

    influence: Float[np.ndarray, " n_nodes"]
    """Logit influence `((I - A)^-1 - I)^T w`, equal to `prune.compute_influence`."""
    error_share: Float[np.ndarray, " n_nodes"]
    """Per row, `sum_{s error} |A[t, s]| / sum_s |A[t, s]|` (0 for rows without inputs)."""


def layer_blocks(nodes: Nodes) -> list[tuple[int, int]]:
    """Step 1: contiguous runs of nodes of one kind, one layer and one site, in node order (the
    attention features of a layer feed its MLP features: they are separate blocks)."""
    key = np.char.add(np.char.add(nodes.kind.astype(str), nodes.layer.astype(str)), nodes.site.astype(str))
    if not len(key):
        return []
    cuts = np.flatnonzero(key[1:] != key[:-1]) + 1
    starts = np.concatenate([[0], cuts])
    ends = np.concatenate([cuts, [len(key)]])
    return list(zip(starts.tolist(), ends.tolist()))


def row_blocks(adjacency: sp.csr_array) -> list[tuple[int, int]]:
    """Step 1 for any matrix: the greedy split into contiguous row ranges `[b0, b1)` whose rows read
    only columns `< b0` (a row starts a new block when it reads from the current one). Raises
    `GraphError` unless the matrix is strictly lower-triangular."""
    A = adjacency if isinstance(adjacency, sp.csr_array) else sp.csr_array(adjacency)
    n = A.shape[0]
    if A.shape != (n, n):
        raise GraphError(f"matrix {A.shape} is not square; pass one row and one column per node.")
    max_col = _max_columns(A)
    if np.any(max_col >= np.arange(n)):
        raise GraphError(
            "the adjacency is not strictly lower-triangular in node order; order nodes as graph.NODE_ORDER documents."
        )
    # The next block starts at the first row after the current start `s` that reads a column >= s
    # (an empty row reads none: -1). Searched in windows doubling from 64 rows: a pass over each
    # block's rows without a Python step per row.
    starts, s = [0], 0
    while True:
        lo, width, found = s + 1, 64, -1
        while lo < n and found < 0:
            hit = np.flatnonzero(max_col[lo : lo + width] >= s)
            found = lo + int(hit[0]) if len(hit) else -1
            lo, width = lo + width, 2 * width
        if found < 0:
            break
        starts.append(found)
        s = found
    return list(zip(starts, starts[1:] + [n])) if n else []


def _max_columns(A: sp.csr_array) -> Int[np.ndarray, " n_rows"]:
    """The largest column of each row, -1 for an empty row (the last index when sorted)."""
    counts = np.diff(A.indptr)
    nonempty = np.flatnonzero(counts > 0)
    max_col = np.full(A.shape[0], -1, np.int64)
    if len(nonempty):
        if A.has_sorted_indices:  # cached by scipy once known (logit_influence's canonical check)
            max_col[nonempty] = A.indices[A.indptr[1:][nonempty] - 1]
        else:
            max_col[nonempty] = np.maximum.reduceat(A.indices, A.indptr[:-1][nonempty])
    return max_col


def streamed_influence(
    adjacency: sp.csr_array,
    logit_weights: Float[np.ndarray, " n_nodes"],
    blocks: list[tuple[int, int]],
    is_error: np.ndarray | None = None,
    chunk_edges: int = 1 << 18,
    progress: bool = False,
) -> StreamedInfluence:
    """Steps 2-3 (module docstring); raises `GraphError` if an edge stays inside a block or goes up."""
    N = adjacency.shape[0]
    if adjacency.shape != (N, N):
        raise GraphError(f"matrix {adjacency.shape} is not square; pass one row and one column per node.")
    return streamed_influence_rows(
        [(np.arange(N), adjacency)], logit_weights, blocks, is_error, chunk_edges, progress
    )


def logit_influence(
    adjacency: sp.sparray,
    logit_weights: Float[np.ndarray, " n_nodes"],
    is_error: np.ndarray | None = None,
    progress: bool = False,
) -> StreamedInfluence:
    """`prune.compute_influence(prune.normalize_matrix(adjacency), w)` (and the error shares) of any
    strictly lower-triangular matrix in one streamed pass (`row_blocks`). Duplicate entries are
    summed before |.| as normalize_matrix does (a copy only when there are any); a canonical CSR
    matrix is read in place."""
    A = adjacency if isinstance(adjacency, sp.csr_array) else sp.csr_array(adjacency)
    if not A.has_canonical_format:  # scipy caches the answer on `adjacency`
        A = A.copy()
        A.sum_duplicates()
    return streamed_influence(A, logit_weights, row_blocks(A), is_error, progress=progress)


def streamed_influence_rows(
    row_sets: list[tuple[Int[np.ndarray, " n_rows"], sp.csr_array]],
    logit_weights: Float[np.ndarray, " n_nodes"],
    blocks: list[tuple[int, int]],
    is_error: np.ndarray | None = None,
    chunk_edges: int = 1 << 18,
    progress: bool = False,
) -> StreamedInfluence:
    """`streamed_influence` of the graph whose row for node `nodes[i]` is row i of `rows`, for each
    `(nodes, rows)` in `row_sets` (nodes ascending within a set, each node in at most one set;
    columns are node indices); other nodes have no inputs (step 4)."""
    solve = InfluenceSolve(logit_weights, is_error, chunk_edges)
    for nodes, rows in row_sets:
        solve.check(nodes, rows)
    n_edges = sum(int(rows.indptr[-1] - rows.indptr[0]) for _, rows in row_sets)
    bar = tqdm(total=n_edges, desc="influence", unit="edge", unit_scale=True) if progress else None
    with bar or nullcontext():  # no bar to set up unless shown
        for b0, b1 in reversed(blocks):
            solve.start_block(b0, b1)
            for nodes, rows in row_sets:
                r0, r1 = np.searchsorted(nodes, [b0, b1]).tolist()
                done = solve.add_rows(nodes, rows, r0, r1, checked=True)
                if bar is not None:
                    bar.update(done)
    return solve.result()


class InfluenceSolve:
    """Steps 2-3 fed one block at a time, from the last block to the first, for a caller that
    computes the rows as it goes and need not keep them (attribute_pruned): `start_block(b0, b1)`,
    then `add_rows(nodes, rows)` for the rows of that block's nodes (any grouping, any order), then
    the next lower block; `result()` at the end. Nodes whose rows never come have no inputs."""

    def __init__(
        self,
        logit_weights: Float[np.ndarray, " n_nodes"],
        is_error: np.ndarray | None = None,
        chunk_edges: int = 1 << 18,
    ):
        self.w = np.asarray(logit_weights, np.float64)
        self.is_error = None if is_error is None else np.asarray(is_error, bool).astype(np.float64)
        self.chunk_edges = chunk_edges
        self.acc = np.zeros(len(self.w))
        self.z = self.w.copy()
        self.error_share = np.zeros(len(self.w))
        self.block = (len(self.w), len(self.w))

    def check(self, nodes: np.ndarray, rows: sp.csr_array) -> None:
        N = len(self.w)
        if rows.shape != (len(nodes), N) or np.any(np.diff(nodes) <= 0):
            raise GraphError(
                f"a row set has {len(nodes)} nodes for a {rows.shape} matrix over {N} weights; give one "
                "ascending node per row and one column per node."
            )

    def start_block(self, b0: int, b1: int) -> None:
        """The block `[b0, b1)`, below the blocks done: every node above it has all its rows."""
        if b1 > self.block[0]:
            raise GraphError(
                f"block [{b0}, {b1}) overlaps or follows the previous block; go from the last down."
            )
        self.block = (b0, b1)
        self.z[b0:b1] = self.w[b0:b1] + self.acc[b0:b1]

    def add_rows(
        self,
        nodes: Int[np.ndarray, " n_rows"],
        rows: sp.csr_array,
        r0: int = 0,
        r_end: int | None = None,
        checked: bool = False,
    ) -> int:
        """Rows `r0 .. r_end - 1` (default all) of `rows`, those of `nodes[r0:r_end]` (ascending,
        inside the current block; read in place, not copied); returns their edge count.
        `checked`: `check(nodes, rows)` was done already (a row set given once per block)."""
        if not checked:
            self.check(nodes, rows)
        r_end = len(nodes) if r_end is None else r_end
        b0, b1 = self.block
        if r_end > r0 and (nodes[r0] < b0 or nodes[r_end - 1] >= b1):
            raise GraphError(
                f"rows of nodes outside the current block [{b0}, {b1}); start their block first."
            )
        indptr, indices, data = rows.indptr, rows.indices, rows.data
        r_start = r0
        while r0 < r_end:  # chunks of rows with about chunk_edges edges
            r1 = int(np.searchsorted(indptr, indptr[r0] + self.chunk_edges, side="right")) - 1
            r1 = min(max(r1, r0 + 1), r_end)
            p0, p1 = int(indptr[r0]), int(indptr[r1])
            if p1 > p0:
                _accumulate(
                    nodes[r0:r1],
                    indptr[r0 : r1 + 1] - p0,
                    indices[p0:p1],
                    data[p0:p1],
                    b0,
                    self.z,
                    self.acc,
                    self.error_share,
                    self.is_error,
                )
            r0 = r1
        return int(indptr[r_end] - indptr[r_start])

    def result(self) -> StreamedInfluence:
        return StreamedInfluence(influence=self.z - self.w, error_share=self.error_share)


SPARSE_PRODUCTS_FROM = 1 << 12
"""Chunks of at least this many edges use scipy's sparse products (fewest passes over the edges);
smaller ones numpy's `bincount` (no sparse matrix to set up, ~0.3 ms each, which dominates for
the one-row blocks of a dense random graph). Both compute the same sums in the same order."""


def _accumulate(targets, indptr, cols, values, b0, z, acc, error_share, is_error) -> None:
    """Steps 2-3 for one chunk of rows (nodes `targets`, all in the block starting at b0), on the
    chunk's |values| in float64."""
    if cols.max() >= b0:
        raise GraphError(
            "an edge comes from its own block or a later node; order nodes as graph.NODE_ORDER documents."
        )
    a = values.astype(np.float64)  # then |.| in place: the same numbers, one temporary less
    np.abs(a, out=a)
    counts = np.diff(indptr)
    rowsum = np.zeros(len(targets))
    nonempty = counts > 0
    rowsum[nonempty] = np.add.reduceat(a, indptr[:-1][nonempty])
    inv = np.divide(1.0, rowsum, out=np.zeros_like(rowsum), where=rowsum > 0)
    if len(a) >= SPARSE_PRODUCTS_FROM:
        indptr = indptr.astype(cols.dtype, copy=False)
        if is_error is not None:
            chunk = sp.csr_array((a, cols, indptr), shape=(len(targets), len(acc)))
            error_share[targets] = (chunk @ is_error) * inv
        # the chunk's transpose built as CSC on the same arrays (what `chunk.T` returns, set up once)
        acc += sp.csc_array((a, cols, indptr), shape=(len(acc), len(targets))) @ (z[targets] * inv)
        return
    if is_error is not None:
        error_share[targets] = (
            np.bincount(
                np.repeat(np.arange(len(targets)), counts), weights=a * is_error[cols], minlength=len(targets)
            )
            * inv
        )
    acc += np.bincount(cols, weights=a * np.repeat(z[targets] * inv, counts), minlength=len(acc))

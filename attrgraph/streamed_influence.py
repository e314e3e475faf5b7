"""Logit influence and error shares of a large graph in one streamed pass over its rows.

Seed: circuit-tracing appendix, "Graph Pruning". The same numbers as `prune.compute_influence`
on `prune.normalize_matrix(adjacency)` (and as scores.py), without materializing the normalized
matrix, its transpose or `I - A`: on a graph of ~10^4 features the adjacency holds ~3 10^7 edges,
and those copies would triple the peak memory of `attribute`.

1. Blocks: contiguous row ranges whose rows have no edge from inside their own block or from a
   later row (`layer_blocks`: the features of one layer, the logits; embeddings and errors have
   no rows). Every edge goes from a lower block to a higher one.
2. `z = (I - A)^-T w` solved block by block from the last: `z_B = w_B + acc_B`, then every edge
   `t -> s` of block B adds `|A[t, s]| / rowsum_t * z_t` to `acc_s` (one `bincount` per chunk of
   rows; the normalization `1 / rowsum_t` is applied on the fly). Influence is `z - w`.
3. In the same pass, each row's share of |input| that comes from error nodes (scores.py step 3).
Peak extra memory: a few arrays of the size of one chunk of edges (`chunk_edges`).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import scipy.sparse as sp
from jaxtyping import Float

from attrgraph.errors import GraphError
from attrgraph.graph import Nodes


class StreamedInfluence(NamedTuple):
    """What one streamed pass computes."""

    influence: Float[np.ndarray, " n_nodes"]
    """Logit influence `((I - A)^-1 - I)^T w`, equal to `prune.compute_influence`."""
    error_share: Float[np.ndarray, " n_nodes"]
    """Per row, `sum_{s error} |A[t, s]| / sum_s |A[t, s]|` (0 for rows without inputs)."""


def layer_blocks(nodes: Nodes) -> list[tuple[int, int]]:
    """Step 1: contiguous runs of nodes of one kind and one layer, in node order."""
    key = np.char.add(nodes.kind.astype(str), nodes.layer.astype(str))
    if not len(key):
        return []
    cuts = np.flatnonzero(key[1:] != key[:-1]) + 1
    starts = np.concatenate([[0], cuts])
    ends = np.concatenate([cuts, [len(key)]])
    return list(zip(starts.tolist(), ends.tolist()))


def streamed_influence(
    adjacency: sp.csr_array,
    logit_weights: Float[np.ndarray, " n_nodes"],
    blocks: list[tuple[int, int]],
    is_error: np.ndarray | None = None,
    chunk_edges: int = 1 << 18,
) -> StreamedInfluence:
    """Steps 2-3 (module docstring); raises `GraphError` if an edge stays inside a block or goes up."""
    A = adjacency
    N = A.shape[0]
    w = np.asarray(logit_weights, np.float64)
    if A.shape != (N, N) or w.shape != (N,):
        raise GraphError(
            f"matrix {A.shape} and weights {w.shape} do not match; pass a square matrix and one weight per node."
        )
    is_error = np.zeros(N, bool) if is_error is None else np.asarray(is_error, bool)
    indptr, indices, data = A.indptr, A.indices, A.data
    acc = np.zeros(N)
    z = w.copy()
    error_share = np.zeros(N)
    for b0, b1 in reversed(blocks):
        z[b0:b1] = w[b0:b1] + acc[b0:b1]
        r0 = b0
        while r0 < b1:  # chunks of rows with about chunk_edges edges
            r1 = int(np.searchsorted(indptr, indptr[r0] + chunk_edges, side="right")) - 1
            r1 = min(max(r1, r0 + 1), b1)
            p0, p1 = int(indptr[r0]), int(indptr[r1])
            if p1 > p0:
                cols = indices[p0:p1]
                if cols.max() >= b0:
                    raise GraphError(
                        "an edge comes from its own block or a later node; order nodes as graph.NODE_ORDER documents."
                    )
                a = np.abs(data[p0:p1], dtype=np.float64)
                local = np.repeat(np.arange(r1 - r0), np.diff(indptr[r0 : r1 + 1]))
                rowsum = np.bincount(local, weights=a, minlength=r1 - r0)
                inv = np.divide(1.0, rowsum, out=np.zeros_like(rowsum), where=rowsum > 0)
                error_share[r0:r1] = np.bincount(local, weights=a * is_error[cols], minlength=r1 - r0) * inv
                a *= (z[r0:r1] * inv)[local]
                acc += np.bincount(cols, weights=a, minlength=N)
                del a, local
            r0 = r1
    return StreamedInfluence(influence=z - w, error_share=error_share)

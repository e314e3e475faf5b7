"""Graph scores: how much of a graph's logit influence runs through features rather than errors.

Seed: circuit-tracing appendix, "Graph Pruning" (influence) and "Evaluating Attribution Graphs";
the definitions are circuit-tracer's `compute_graph_scores`, so the numbers are comparable:

1. `A = normalize_matrix(adjacency)` (|A|, rows summing to 1) and the logit influence
   `I = ((I - A)^-1 - I)^T w` of every node (prune.compute_influence), `w` the logit weights.
2. Replacement score: `sum_{embeddings} I / (sum_{embeddings} I + sum_{errors} I)`, the share of the
   end-to-end influence of the inputs that reaches the logits through features instead of errors
   (1 when no error node has influence).
3. Completeness score: each node's share of non-error input `1 - sum_{s error} A[t, s]` (1 for
   nodes without inputs), averaged with weights `I + w`:
   `sum_t (1 - A_err[t]) (I_t + w_t) / sum_t (I_t + w_t)`.
Both lie in [0, 1]; a graph holding NaN or inf (in its edges or logit weights) has no scores: both
are NaN, never the 1 that a comparison with NaN would give. Both are computed on whatever graph they are given, so the scores of a pruned
graph are those of its kept nodes and edges. `save_graph` stores them as HDF5 attributes and
`attrgraph show` prints them.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import scipy.sparse as sp
from jaxtyping import Float

from attrgraph.graph.graph import Graph, check_graph
from attrgraph.graph.streamed_influence import logit_influence


class GraphScores(NamedTuple):
    """circuit-tracer's two graph scores."""

    replacement: float
    """Share of the embeddings' logit influence (vs the errors') (step 2)."""
    completeness: float
    """Influence-weighted share of non-error inputs over all nodes (step 3)."""


def compute_graph_scores(graph: Graph) -> GraphScores:
    """Replacement and completeness scores of `graph` (module docstring, steps 1-3), from one
    streamed pass over its rows (streamed_influence.logit_influence: no copy of the adjacency)."""
    check_graph(graph, "compute_graph_scores")
    w = graph.logit_weights()
    kind = graph.nodes.kind
    pass_ = logit_influence(graph.adjacency, w, kind == "error")
    return scores_from_shares(kind, pass_.influence, pass_.error_share, w)


def scores_from_influence(
    kind: np.ndarray,
    A: sp.csr_array,
    influence: Float[np.ndarray, " n_nodes"],
    logit_weights: Float[np.ndarray, " n_nodes"],
) -> GraphScores:
    """Steps 2-3 from a normalized adjacency and the influence already computed on it."""
    return scores_from_shares(kind, influence, A @ (kind == "error").astype(np.float64), logit_weights)


def scores_from_shares(
    kind: np.ndarray,
    influence: Float[np.ndarray, " n_nodes"],
    error_share: Float[np.ndarray, " n_nodes"],
    logit_weights: Float[np.ndarray, " n_nodes"],
) -> GraphScores:
    """Steps 2-3 from the influence and each row's error share `sum_{s error} A[t, s]`
    (as streamed_influence.py computes them in one pass)."""
    w = np.asarray(logit_weights, np.float64)
    if not (np.isfinite(influence).all() and np.isfinite(error_share).all() and np.isfinite(w).all()):
        return GraphScores(replacement=float("nan"), completeness=float("nan"))
    token = float(influence[kind == "embedding"].sum())
    error = float(influence[kind == "error"].sum())
    replacement = token / (token + error) if token + error > 0 else 1.0
    out = influence + w
    total = float(out.sum())
    completeness = float(((1.0 - error_share) * out).sum() / total) if total > 0 else 1.0
    return GraphScores(replacement=replacement, completeness=completeness)

"""Influence and pruning (seed: circuit-tracing appendix, "Graph Pruning"; circuit-tracer's
`graph.prune_graph`, which its `create_graph_files` exports).

1. `A = normalize_matrix(adjacency)`: absolute values, each row (the inputs of one target)
   scaled to sum to 1; rows without inputs stay zero.
2. Indirect influence `B = A + A^2 + ... = (I - A)^-1 - I`; the logit influence of every node is
   `B^T w` with `w` the logit probabilities on logit nodes and 0 elsewhere. Because the node order
   (graph.NODE_ORDER) makes `A` strictly lower-triangular, `I - A` is unit-triangular and
   `z = (I - A)^-T w` is one sparse triangular solve; the influence is `z - w`. No dense inverse.
3. Nodes: sort the influence of the non-logit nodes in descending order and keep the shortest
   prefix whose share of the total reaches `node_threshold` (0.8), plus every node tied with the
   last one kept (`find_threshold`: the first index whose cumulative share is >= the threshold,
   as circuit-tracer's `searchsorted`). Embedding and logit nodes always stay (logit nodes were
   chosen by probability when the graph was built: smallest top-K past 0.95, K <= 10).
4. Edges: on the node-pruned graph recompute `A` and `z` (each node's influence plus its own logit
   weight); an edge `s -> t` scores `A[t, s] * z[t]`; keep the edges that make up `edge_threshold`
   (0.98) of the total score by the same rule.
5. The rule (`rule=`), named after its source; the two differ in error nodes and in the last step:
   "circuit-tracer" (the default: what `attrgraph build` stores and the Neuronpedia export draws)
       step 3 prunes error nodes by influence like features; after step 4, a feature or error
       node without a kept outgoing edge, and a feature without a kept incoming edge, is removed
       with its edges, repeated until none is left (circuit-tracer's `prune_graph`).
   "appendix"
       error nodes are never pruned (the appendix: "Embedding nodes and error nodes are not
       pruned"); after step 4 a feature that had outgoing edges and has none left is removed
       with its edges, repeated until none is left.
A threshold of 1.0 keeps everything at that step (circuit-tracer's own `find_threshold` at 1.0
depends on float rounding: it may drop the nodes of zero influence or keep absent edges).

The pruned graph remembers how it was made: meta `pruned`, `node_threshold`, `edge_threshold`,
`prune_rule`; node fields `unpruned_influence` (step 2 on the full graph) and `unpruned_share`
(`influence_shares` of it: circuit-tracer's cumulative node influence, which its export writes).
Pruning a pruned graph again is refused (`GraphError`): prune the unpruned graph instead.

`prune_graph` computes step 2 on the full graph as one streamed pass over its rows
(streamed_influence.py, the same numbers without the normalized copy and its transpose, which
on a graph of 10^8 edges took longer than attribution itself); `progress=True` shows it. A graph
fresh from `attribute` already carries that pass's result (`nodes.influence`); `influence=` takes
it instead of computing it again, so that the build computes it once. Step 3 is `select_nodes`,
steps 4-5 `prune_graph_edges` (attribute_pruned applies them to rows it never holds all at once).
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from jaxtyping import Float
from scipy.sparse.linalg import spsolve_triangular

from attrgraph.errors import GraphError
from attrgraph.graph.graph import Graph, check_graph
from attrgraph.graph.streamed_influence import logit_influence
from transcoders.arguments import is_numbers, shown
from transcoders.config import is_real

RULES: tuple[str, ...] = ("circuit-tracer", "appendix")
"""The pruning rules of step 5, each named after its source."""
DEFAULT_RULE = "circuit-tracer"
"""The rule of `prune_graph`, `attrgraph build` and the Neuronpedia export unless told otherwise."""


def _row_reduce(A: sp.csr_array, ufunc: np.ufunc, init: float) -> np.ndarray:
    """Per-row reduction of `A.data` without a per-entry row index (memory: O(n_rows))."""
    out = np.full(A.shape[0], init, A.data.dtype if ufunc is np.add else A.indices.dtype)
    counts = np.diff(A.indptr)
    nonempty = counts > 0
    if nonempty.any():
        values = A.data if ufunc is np.add else A.indices
        out[nonempty] = ufunc.reduceat(values, A.indptr[:-1][nonempty])
    return out


def normalize_matrix(adjacency: sp.sparray | np.ndarray) -> sp.csr_array:
    """|adjacency| with every nonzero row scaled to sum to 1 (float64, CSR, zeros dropped, indices sorted).

    The sparsity pattern is that of `adjacency` without explicit zeros, entry for entry; a canonical
    CSR input (sorted, no duplicates, no explicit zeros) shares its index arrays with the result."""
    if len(getattr(adjacency, "shape", ())) != 2 or adjacency.shape[0] != adjacency.shape[1]:
        raise GraphError(
            f"the adjacency has shape {getattr(adjacency, 'shape', None)}; pass a square matrix [n_nodes, n_nodes]."
        )
    A = sp.csr_array(adjacency)
    if not A.has_canonical_format or (A.data == 0).any():
        A = A.copy()
        A.sum_duplicates()
        A.eliminate_zeros()
    data = np.abs(A.data).astype(np.float64)
    A = sp.csr_array((data, A.indices, A.indptr), shape=A.shape, copy=False)
    row_sums = _row_reduce(A, np.add, 0.0)
    counts = np.diff(A.indptr)
    for r0 in range(0, A.shape[0], 4096):  # bounded temporaries on graphs with tens of millions of edges
        r1 = min(r0 + 4096, A.shape[0])
        A.data[A.indptr[r0] : A.indptr[r1]] /= np.repeat(row_sums[r0:r1], counts[r0:r1])
    return A


def compute_influence(
    A: sp.sparray | np.ndarray, logit_weights: Float[np.ndarray, " n_nodes"]
) -> Float[np.ndarray, " n_nodes"]:
    """Logit influence `((I - A)^-1 - I)^T w` of every node by one triangular solve.

    `A` must be strictly lower-triangular (every edge from a lower to a higher node index), which the
    graph node order guarantees; pass `normalize_matrix(graph.adjacency)` for the seed's influence.
    """
    if not (sp.issparse(A) or (is_numbers(A) and np.ndim(A) == 2)) or not is_numbers(logit_weights):
        raise GraphError(
            f"compute_influence takes a square matrix (sparse or ndarray) and one number per node, got a "
            f"{type(A).__name__} and a {type(logit_weights).__name__}; pass normalize_matrix(graph.adjacency) "
            "and graph.logit_weights()."
        )
    A = sp.csr_array(A)
    if A.dtype != np.float64:
        A = A.astype(np.float64)
    n = A.shape[0]
    w = np.asarray(logit_weights, np.float64)
    if A.shape != (n, n) or w.shape != (n,):
        raise GraphError(
            f"matrix {A.shape} and weights {w.shape} do not match; pass a square matrix and one weight per node."
        )
    if n == 0:
        return w.copy()
    nonempty = np.diff(A.indptr) > 0
    if nonempty.any() and np.any(_row_reduce(A, np.maximum, -1)[nonempty] >= np.flatnonzero(nonempty)):
        raise GraphError(
            "the adjacency is not strictly lower-triangular in node order; order nodes as graph.NODE_ORDER documents."
        )
    # (I - A)^T is upper unit-triangular; with unit_diagonal the solver assumes the ones, so (-A)^T
    # suffices, and its CSC form is a transpose view of CSR. Negate in place (exact) and restore.
    np.negative(A.data, out=A.data)
    try:
        z = spsolve_triangular(A.T, w, lower=False, unit_diagonal=True)
    finally:
        np.negative(A.data, out=A.data)
    return z - w


def find_threshold(scores: Float[np.ndarray, " n"], threshold: float) -> float:
    """The smallest score to keep so that the kept scores make up `threshold` of the total.

    Scores sorted in descending order; the cutoff is the score at which the cumulative share first
    reaches `threshold` (an exact tie counts as reached: [4, 3, 2, 1] at 0.7 gives 3, as
    circuit-tracer's `find_threshold`). `threshold >= 1` returns -inf (keep everything).
    """
    if not is_real(threshold) or not 0.0 <= threshold <= 1.0:
        raise GraphError(f"threshold {shown(threshold)} is outside [0, 1]; pass a fraction such as 0.8.")
    if not is_numbers(scores) or np.ndim(scores) != 1:
        raise GraphError(f"scores is {shown(scores)}; pass a 1-d array of numbers (one score per node).")
    scores = np.asarray(scores, np.float64)
    if threshold >= 1.0 or scores.size == 0:
        return -np.inf
    ordered = np.sort(scores)[::-1]
    total = ordered.sum()
    if total <= 0:
        return -np.inf
    cumulative = np.cumsum(ordered) / total
    index = min(int(np.searchsorted(cumulative, threshold)), len(ordered) - 1)
    return float(ordered[index])


def prune_graph(
    graph: Graph,
    node_threshold: float = 0.8,
    edge_threshold: float = 0.98,
    progress: bool = False,
    influence: Float[np.ndarray, " n_nodes"] | None = None,
    rule: str = DEFAULT_RULE,
) -> Graph:
    """The pruned graph (steps 3-5 of the module docstring, by `rule`: "circuit-tracer", the
    default, or "appendix"); influence on its nodes is filled in, and what it was pruned from.

    `influence`: step 2 on `graph` when already computed on this very adjacency (a graph fresh
    from `attribute` carries it as `graph.nodes.influence`, float64), which saves one streamed pass
    over the full graph; by default that pass computes it. A graph already pruned is refused."""
    check_graph(graph, "prune_graph")
    check_rule(rule)
    check_thresholds(node_threshold, edge_threshold)
    check_unpruned(graph)
    if influence is None:
        influence = logit_influence(graph.adjacency, graph.logit_weights(), progress=progress).influence
    influence = np.asarray(influence, np.float64)
    if influence.shape != (graph.n_nodes,) or np.isnan(influence).any():
        raise GraphError(
            f"influence has shape {influence.shape}{' and NaN' * bool(np.isnan(influence).any())} for "
            f"a graph of {graph.n_nodes} nodes; pass one computed value per node (attribute fills "
            "graph.nodes.influence) or None to compute it."
        )
    keep = select_nodes(graph.nodes.kind, influence, node_threshold, rule)
    idx = np.flatnonzero(keep)
    adjacency = graph.adjacency if keep.all() else graph.adjacency[idx][:, idx]  # read only
    # the node-pruned graph's nodes and logit weights (every logit node is kept), no Graph built
    kept, adjacency, kept_influence = _prune_edges(
        graph.nodes.kind[idx], graph.logit_weights()[idx], adjacency, edge_threshold, progress, rule
    )
    keep[idx[~kept]] = False
    out = _pruned(graph, keep, adjacency, kept_influence, node_threshold, edge_threshold, rule)
    out.nodes.unpruned_influence = influence[keep]
    out.nodes.unpruned_share = influence_shares(influence)[keep]
    return out


def influence_shares(influence: Float[np.ndarray, " n_nodes"]) -> Float[np.ndarray, " n_nodes"]:
    """circuit-tracer's cumulative node influence: nodes sorted by influence, descending (ties in
    node order), each gets the running sum up to and including itself over the total; so the
    nodes whose share is <= t make up t of the total influence."""
    influence = np.asarray(influence, np.float64)
    order = np.argsort(-influence, kind="stable")
    total = influence.sum()
    out = np.zeros(len(influence))
    out[order] = np.cumsum(influence[order]) / (total if total > 0 else 1.0)
    return out


def check_rule(rule: str) -> None:
    if rule not in RULES:
        raise GraphError(f"pruning rule {rule!r} is unknown; pass one of {list(RULES)}.")


def check_unpruned(graph: Graph) -> None:
    """Refuse a graph that is already pruned: pruning it again would apply the thresholds twice."""
    m = graph.meta
    if m.get("pruned"):
        raise GraphError(
            f"this graph is already pruned ({m.get('prune_rule', 'appendix')} rule, node threshold "
            f"{m.get('node_threshold')}, edge threshold {m.get('edge_threshold')}); prune the unpruned "
            "graph instead (`attrgraph build --full` stores it as NAME_full)."
        )


def check_thresholds(node_threshold: float, edge_threshold: float) -> None:
    """`GraphError` in one line unless both thresholds are fractions in [0, 1]."""
    for name, t in (("node_threshold", node_threshold), ("edge_threshold", edge_threshold)):
        if not is_real(t) or not 0.0 <= t <= 1.0:
            raise GraphError(f"{name} is {shown(t)}; pass a fraction in [0, 1] such as 0.8.")


def select_nodes(
    kind: np.ndarray,
    influence: Float[np.ndarray, " n_nodes"],
    node_threshold: float,
    rule: str = DEFAULT_RULE,
) -> np.ndarray:
    """Step 3: the boolean mask of the nodes kept: embeddings, logits (and by the appendix's rule
    every error node), and the nodes whose logit influence reaches the cutoff of `find_threshold`
    over the non-logit nodes (features; errors too by circuit-tracer's rule)."""
    check_rule(rule)
    cutoff = find_threshold(influence[kind != "logit"], node_threshold)
    always = ("embedding", "logit") if rule == "circuit-tracer" else ("embedding", "logit", "error")
    return np.isin(kind, always) | (influence >= cutoff)


def prune_graph_edges(
    pruned: Graph,
    edge_threshold: float = 0.98,
    progress: bool = False,
    node_threshold: float = 1.0,
    rule: str = DEFAULT_RULE,
) -> Graph:
    """Steps 4-5 on the node-pruned graph `pruned` (step 3 already applied by `rule`,
    `node_threshold` recorded in the result's meta); influence on its nodes is filled in, the
    `unpruned_*` node fields are those of `pruned`."""
    check_rule(rule)
    check_thresholds(node_threshold, edge_threshold)
    keep, adjacency, kept_influence = _prune_edges(
        pruned.nodes.kind, pruned.logit_weights(), pruned.adjacency, edge_threshold, progress, rule
    )
    return _pruned(pruned, keep, adjacency, kept_influence, node_threshold, edge_threshold, rule)


def _prune_edges(
    kind: np.ndarray,
    w: Float[np.ndarray, " n_nodes"],
    adjacency: sp.csr_array,
    edge_threshold: float,
    progress: bool,
    rule: str = DEFAULT_RULE,
) -> tuple[np.ndarray, sp.csr_array, Float[np.ndarray, " n_kept"]]:
    """Steps 4-5 on the node-pruned graph's node kinds, logit weights and adjacency: the nodes kept
    (mask), their adjacency and their influence (computed on the node-pruned graph)."""
    n = len(kind)
    raw = sp.csr_array(adjacency, copy=True)
    raw.sum_duplicates()  # sorts too; duplicates would break "entry for entry" below
    raw.eliminate_zeros()
    A = normalize_matrix(raw)  # same pattern as raw, entry for entry
    node_influence = logit_influence(raw, w, progress=progress).influence
    edge_score = A.data * np.repeat(node_influence + w, np.diff(A.indptr))
    had_out = np.bincount(raw.indices, minlength=n) > 0
    raw.data[edge_score < find_threshold(edge_score, edge_threshold)] = 0.0
    raw.eliminate_zeros()

    keep = np.ones(n, bool)
    is_feature = kind == "feature"
    if rule == "circuit-tracer":  # every feature and error needs an output, every feature an input
        needs_out, needs_in = is_feature | (kind == "error"), is_feature
    else:  # a feature that had outputs needs one still
        needs_out, needs_in = is_feature & had_out, np.zeros(n, bool)
    targets = np.repeat(np.arange(n), np.diff(raw.indptr))  # raw: no zeros, no duplicates
    while True:
        kept = keep[targets] & keep[raw.indices]
        has_out = np.bincount(raw.indices[kept], minlength=n) > 0
        has_in = np.bincount(targets[kept], minlength=n) > 0
        drop = keep & (needs_out & ~has_out | needs_in & ~has_in)
        if not drop.any():
            break
        keep &= ~drop
    return keep, raw[keep][:, keep], node_influence[keep]


def _pruned(
    graph: Graph,
    keep: np.ndarray,
    adjacency: sp.csr_array,
    influence: Float[np.ndarray, " n_kept"],
    node_threshold: float,
    edge_threshold: float,
    rule: str,
) -> Graph:
    """`graph` on the nodes `keep` with their pruned `adjacency` and `influence`, thresholds and
    rule in meta."""
    out = graph.subgraph(keep, adjacency=adjacency)
    out.nodes.influence = influence
    out.meta.update(pruned_meta(node_threshold, edge_threshold, rule))
    return out


def pruned_meta(node_threshold: float, edge_threshold: float, rule: str) -> dict:
    """What a pruned graph's meta records of its pruning (module docstring)."""
    return dict(
        pruned=True,
        node_threshold=float(node_threshold),
        edge_threshold=float(edge_threshold),
        prune_rule=rule,
    )

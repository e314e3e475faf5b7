"""Hierarchical attribution: detach weak nodes during the backward pass, not after it.

Seed: linear-computation-graphs.md, section 3 ("Automatic Circuit Discovery with Hierarchical
Attribution", Definition 3.2, Theorem 3.1) and Algorithm 1 in appendix C. Notation: an edge
`A[u, v]` of our graphs is the direct effect of source v on target u (it already includes the
source's activation a_v, attribute.py step 5), so the seed's `k_{v,u} = A[u, v] / a_v`.

1. Root t: a logit node (its demeaned logit), a logit difference or any direction (a custom
   target), or any active feature (its pre-activation, equal to its activation). `grad_t = 1`,
   `attr_t = value_t`.
2. Visit the feature nodes in reverse topological order, one layer at a time from the top (nodes of
   one layer never feed each other). A node's attribution comes from its kept successors only:
   `attr_v = a_v grad_v = sum_{u kept} A[u, v] grad_u` (Definition 3.2).
3. Detach at once: a feature with `attr_v < tau` (or `|attr_v| < tau` with `absolute=True`), or
   with `attr_v == 0` (not reached), is dropped: `grad_v = 0`, so none of its ancestors gets credit
   through it. A kept node gets `grad_v = attr_v / a_v`, and only now are its incoming edges
   computed (one backward per kept node; the full graph is never built).
4. Leaves and Theorem 3.1. The leaves of the kept subgraph are (a) the embedding nodes, (b) the
   error nodes, with `attr_s = sum_{u kept} A[u, s] grad_u`, and (c) the constant term of the root
   and of every kept feature, `bias_u = value_u - sum_s A[u, s]` (encoder bias and every bias of
   the frozen model), with `attr = grad_u bias_u`; their total is `bias_attribution`. Because
   every kept node's value is the sum of its inputs plus its bias (the exactness contract),
       `root_value = sum_{embeddings, errors} attr + bias_attribution + detached_attribution`
   where `detached_attribution` is the total attribution the detached nodes had when they were
   detached (it is 0 when nothing is detached, e.g. `tau = -inf`: the seed's theorem). The kept
   subgraph's share of the root ("logit recovered", seed Figure 2b) is `root_value -
   detached_attribution`.

`hierarchical_attribution` runs steps 1-4 on a graph already built (a pure function, also the
"standard attribution, then threshold" baseline); `attribute_hierarchical` runs them on a model,
computing rows only for kept nodes, and returns a `Graph` whose `meta` carries `root_value`,
`bias_attribution`, `detached_attribution`, `tau` and `attribution` (one value per node).
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import scipy.sparse as sp
import torch
from jaxtyping import Float

from attrgraph.engine.linear_backward import rows_engine
from attrgraph.engine.replacement import ReplacementModel
from attrgraph.engine.sources import (
    Injection,
    build_sources,
    graph_provenance,
    node_table,
    prompt_strings,
    resolve_exclude_bos,
    target_values,
    to_tokens,
)
from attrgraph.engine.targets import Target, check_targets, select_logit_targets
from attrgraph.errors import GraphError, TargetError
from attrgraph.graph.graph import Graph, Nodes
from attrgraph.graph.prune import compute_influence, normalize_matrix

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from transcoders.base import SparseCoder


class HierarchicalResult(NamedTuple):
    """What hierarchical attribution finds on a graph (module docstring)."""

    attribution: Float[np.ndarray, " n_nodes"]
    """`a_v grad_v` of every node from its kept successors (detached nodes: the value they were
    dropped with; nodes never reached: 0; the root: its value)."""
    kept: np.ndarray
    """[n_nodes] bool: the root, the kept features, and every embedding and error node."""
    root_value: float
    """The root's value (demeaned logit, target value, or feature pre-activation)."""
    bias_attribution: float
    """Sum over the root and the kept features of `grad_u * bias_u` (leaves of kind (c))."""
    detached_attribution: float
    """Sum of the detached features' attributions at the time they were detached."""

    def leaf_sum(self, kinds: np.ndarray) -> float:
        """Attribution of the embedding and error leaves plus the bias terms (the kept subgraph's
        share of the root; equals `root_value - detached_attribution` by Theorem 3.1)."""
        leaves = (kinds == "embedding") | (kinds == "error")
        return float(self.attribution[leaves].sum() + self.bias_attribution)


def _detach(attr: np.ndarray, tau: float, absolute: bool) -> np.ndarray:
    """Step 3: which of these attributions are kept."""
    score = np.abs(attr) if absolute else attr
    return (score >= tau) & (attr != 0)


def hierarchical_attribution(
    graph: Graph,
    tau: float = -math.inf,
    root: int | None = None,
    absolute: bool = False,
    keep: np.ndarray | None = None,
) -> HierarchicalResult:
    """Steps 1-4 on a built graph, rooted at node `root` (default: the first logit node).

    `keep` (bool per node) replaces the threshold by a fixed set of features to keep: with the
    set chosen by a plain `attribution >= tau` after one pass, it is standard attribution."""
    n = graph.nodes
    kinds = n.kind
    if root is None:
        logits = np.flatnonzero(kinds == "logit")
        if not len(logits):
            raise GraphError("the graph has no logit node; pass root= the index of the node to attribute.")
        root = int(logits[0])
    if kinds[root] not in ("logit", "feature"):
        raise GraphError(f"node {root} is a {kinds[root]} node; the root must be a logit or feature node.")
    A = sp.csr_array(graph.adjacency, dtype=np.float64)
    N = graph.n_nodes
    value = n.activation.astype(np.float64)
    attribution = np.zeros(N)
    kept = (kinds == "embedding") | (kinds == "error")
    kept[root] = True
    attribution[root] = value[root]
    row = A[[root]].toarray()[0]
    acc = row.copy()
    bias = value[root] - row.sum()
    detached = 0.0
    feats = np.flatnonzero((kinds == "feature") & (np.arange(N) < root))
    for layer in sorted(set(n.layer[feats].tolist()), reverse=True):
        idx = feats[n.layer[feats] == layer]
        attr = acc[idx]
        attribution[idx] = attr
        ok = _detach(attr, tau, absolute) if keep is None else (np.asarray(keep)[idx] & (attr != 0))
        detached += float(attr[~ok].sum())
        idx, attr = idx[ok], attr[ok]
        kept[idx] = True
        if len(idx):
            grad = attr / value[idx]
            rows = A[idx]
            acc += rows.T @ grad
            bias += float(grad @ (value[idx] - np.asarray(rows.sum(axis=1)).ravel()))
    leaves = (kinds == "embedding") | (kinds == "error")
    attribution[leaves] = acc[leaves]
    return HierarchicalResult(attribution, kept, float(value[root]), float(bias), detached)


def attribute_hierarchical(
    model: HookedTransformer,
    transcoders: SparseCoder | ReplacementModel,
    prompt,
    *,
    tau: float = 0.0,
    root=None,
    absolute: bool = False,
    exclude_bos: bool | None = None,
    embedding: str = "token+position",
    batch_size: int = 256,
    backend: str = "auto",
) -> Graph:
    """Hierarchical attribution on a model (steps 1-4): only kept nodes get a backward pass.

    `root`: None (the most probable token's demeaned logit), a `Target` (e.g.
    `logit_difference(model, " Mary", " John")`), or a feature `(layer, position, feature)` that is
    active on the prompt. `backend` picks the rows engine as in `attribute` ("auto", "linear",
    "autograd")."""

    t0 = time.perf_counter()
    rm = transcoders if isinstance(transcoders, ReplacementModel) else ReplacementModel(model, transcoders)
    tokens = to_tokens(model, prompt)
    tokenizer = getattr(model, "tokenizer", None)
    exclude_bos = resolve_exclude_bos(model, tokens, exclude_bos)
    if isinstance(root, Target):
        check_targets([root], model, len(tokens))
    state = rm.run(tokens, exclude_bos=bool(exclude_bos), embedding=embedding)
    n_pos, L = len(tokens), model.cfg.n_layers
    sources = build_sources(rm, state)
    feats = sources.features.cpu().numpy().reshape(-1, 3)
    n_src = n_pos + sources.n_errors
    targets, root_layer = [], L
    if root is None or isinstance(root, Target):
        targets = [root] if root is not None else select_logit_targets(state.logits[-1], 1, 1.0, tokenizer)
        pos = targets[0].position % n_pos
        root_inj = Injection(targets[0].vector, pos, hook=targets[0].hook, logits=targets[0].hook is None)
        root_value = target_values(rm, state, targets, [pos])[0]
        root_col = None  # a target at a hook may read features of any layer: walk them all (root_layer = L)
    else:
        l, p, f = (int(x) for x in root)
        match = np.flatnonzero((feats[:, 0] == l) & (feats[:, 1] == p) & (feats[:, 2] == f))
        if not len(match):
            raise TargetError(
                f"feature {(l, p, f)} is not active on this prompt; pick an active (layer, position, feature)."
            )
        root_col = n_src + int(match[0])
        root_inj = Injection(rm.tc.encoder_vectors(l, torch.tensor([f]))[0].detach(), p, layer=l)
        root_value = float(state.pre_acts[l, p, f])
        root_layer = l
    engine = rows_engine(backend, rm, [root_inj])

    def rows_for(injections):
        return sp.csr_array(engine(rm, state, sources, injections, batch_size=batch_size), dtype=np.float64)

    root_row = rows_for([root_inj])
    acc = root_row.toarray()[0]
    bias = root_value - acc.sum()
    n_cols = sources.n_columns
    attribution = np.zeros(n_cols)
    kept_rows, kept_cols, detached, n_detached = [], [], 0.0, 0
    acts = state.acts[tuple(sources.features.T)].double().cpu().numpy() if len(feats) else np.zeros(0)
    for layer in range(root_layer - 1, -1, -1):
        sel = np.flatnonzero(feats[:, 0] == layer)
        cols = n_src + sel
        attr = acc[cols]
        attribution[cols] = attr
        ok = _detach(attr, tau, absolute)
        detached += float(attr[~ok].sum())
        n_detached += int((~ok & (attr != 0)).sum())
        sel, cols, attr = sel[ok], cols[ok], attr[ok]
        if not len(sel):
            continue
        inj = [
            Injection(rm.tc.encoder_vectors(int(l), torch.tensor([int(f)]))[0].detach(), int(p), layer=int(l))
            for l, p, f in feats[sel].tolist()
        ]
        rows = rows_for(inj)
        grad = attr / acts[sel]
        acc += rows.T @ grad
        pre = state.pre_acts[feats[sel, 0], feats[sel, 1], feats[sel, 2]].double().cpu().numpy()
        bias += float(grad @ (pre - np.asarray(rows.sum(axis=1)).ravel()))
        kept_rows.append(rows)
        kept_cols.append(cols)
    attribution[:n_src] = acc[:n_src]

    # the kept graph: embeddings, errors, kept features (node order), and the root
    if root_col is not None:
        kept_rows.append(root_row)
        kept_cols.append(np.array([root_col]))
        attribution[root_col] = root_value
    fcols = np.concatenate(kept_cols) if kept_cols else np.zeros(0, np.int64)
    order = np.argsort(fcols, kind="stable")
    fcols = fcols[order]
    R = sp.vstack(kept_rows, format="csr")[order] if kept_rows else sp.csr_array((0, n_cols))
    columns = np.concatenate([np.arange(n_src), fcols]).astype(np.int64)
    n_t = 0 if root_col is not None else 1
    if n_t:
        R = sp.vstack([R, root_row], format="csr")
    N = len(columns) + n_t
    body = sp.csr_array(R)[:, columns]
    adjacency = sp.vstack([sp.csr_array((n_src, len(columns))), body], format="csr")
    adjacency = sp.csr_array(sp.hstack([adjacency, sp.csr_array((N, n_t))], format="csr"), dtype=np.float32)

    positions = [root_inj.position] if n_t else []
    full = node_table(state, sources, targets, positions, [root_value] if n_t else [], L)
    index = np.concatenate([columns, np.arange(n_cols, n_cols + n_t)])
    nodes: Nodes = full.select(index)
    node_attr = np.concatenate([attribution[columns], [root_value] * n_t])
    graph = Graph(
        nodes=nodes,
        adjacency=adjacency,
        prompt_ids=tokens.cpu().numpy(),
        prompt_tokens=prompt_strings(model, tokens),
        logit_tokens=np.array([t.token for t in targets][:n_t], np.int64),
        logit_probs=np.ones(n_t),
        logit_strings=[t.name for t in targets][:n_t],
        meta=dict(
            method="hierarchical",
            tau=float(tau),
            absolute=bool(absolute),
            root=str(root if root is not None else "top logit")
            if not isinstance(root, Target)
            else root.name,
            root_index=int(np.searchsorted(columns, root_col)) if root_col is not None else N - 1,
            root_value=float(root_value),
            bias_attribution=float(bias),
            detached_attribution=float(detached),
            n_detached=int(n_detached),
            attribution=[float(x) for x in node_attr],
            **graph_provenance(model, rm, state, exclude_bos, embedding),
            attribution_seconds=round(time.perf_counter() - t0, 4),
        ),
    )

    graph.nodes.influence = compute_influence(
        normalize_matrix(graph.adjacency), graph.logit_weights()
    ).astype(np.float32)
    return graph


def result_from_graph(graph: Graph) -> HierarchicalResult:
    """The `HierarchicalResult` stored in the meta of a graph from `attribute_hierarchical`."""
    m = graph.meta
    if m.get("method") != "hierarchical":
        raise GraphError(
            "this graph was not built by attribute_hierarchical; run hierarchical_attribution(graph, tau) on it instead."
        )
    kept = np.ones(graph.n_nodes, bool)
    return HierarchicalResult(
        np.asarray(m["attribution"], np.float64),
        kept,
        m["root_value"],
        m["bias_attribution"],
        m["detached_attribution"],
    )

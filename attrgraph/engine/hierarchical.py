"""Hierarchical attribution: detach weak nodes during the backward pass, not after it.

Seed: linear-computation-graphs.md, section 3 ("Automatic Circuit Discovery with Hierarchical
Attribution", Definition 3.2, Theorem 3.1) and Algorithm 1 in appendix C. Notation: an edge
`A[u, v]` of our graphs is the direct effect of source v on target u (it already includes the
source's activation a_v, attribute.py step 5), so the seed's `k_{v,u} = A[u, v] / a_v`.

1. Root t: a logit node (its demeaned logit), a logit difference or any direction (a custom
   target), or any active feature (its pre-activation, equal to its activation). `grad_t = 1`,
   `attr_t = value_t`.
2. Visit the feature nodes in reverse topological order, one layer at a time from the top (nodes of
   one layer never feed each other); with attention features (site "attn"), a layer's MLP features
   are visited before its attention features, which feed them. A node's attribution comes from its kept successors only:
   `attr_v = a_v grad_v = sum_{u kept} A[u, v] grad_u` (Definition 3.2).
3. Detach at once: a feature with `attr_v < tau` (or `|attr_v| < tau` with `absolute=True`), or
   with `attr_v == 0` (not reached), is dropped: `grad_v = 0`, so none of its ancestors gets credit
   through it. A kept node gets `grad_v = attr_v / a_v`, and only now are its incoming edges
   computed (one backward per kept node; the full graph is never built).
4. Leaves and Theorem 3.1. The leaves of the kept subgraph are (a) the embedding nodes, (b) the
   error nodes, with `attr_s = sum_{u kept} A[u, s] grad_u`, and (c) the constant term `bias_u` of
   the root and of every kept feature (encoder bias and every bias of the frozen model), with
   `attr = grad_u bias_u`; their total is `bias_attribution`. The constant terms are measured, not
   inferred from the edges: the frozen replacement model is affine in its sources, so running it
   with every source (embeddings, feature activations, errors) at zero leaves exactly each node's
   constant term (`node_biases`). Because every kept node's value is the sum of its inputs plus
   its bias (the exactness contract),
       `root_value = sum_{embeddings, errors} attr + bias_attribution + detached_attribution`
   where `detached_attribution` is the total attribution the detached nodes had when they were
   detached (it is 0 when nothing is detached, e.g. `tau = -inf`: the seed's theorem). The
   difference of the two sides is reported as `theorem_residual`: it is rounding error when every
   edge is right, and shows a wrong edge or traversal instead of absorbing it. The kept
   subgraph's share of the root ("logit recovered", seed Figure 2b) is `root_value -
   detached_attribution`.

`hierarchical_attribution` runs steps 1-4 on a graph already built (a pure function, also the
"standard attribution, then threshold" baseline); `attribute_hierarchical` runs them on a model,
computing rows only for kept nodes, and returns a `Graph` whose `meta` carries `root_value`,
`bias_attribution`, `detached_attribution`, `theorem_residual`, `tau`, and per node `attribution`
and `bias`. On a graph the constant terms come from `bias=` (e.g. `node_biases`); without it they
are inferred as `value_u - sum_s A[u, s]`, and then the identity holds by construction.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import scipy.sparse as sp
import torch
from jaxtyping import Float

from attrgraph.engine.batch_plan import check_batch_size
from attrgraph.engine.linear_backward import rows_engine
from attrgraph.engine.prompt_run import PromptRun, run_prompt
from attrgraph.engine.replacement import ReplacementModel
from attrgraph.engine.sources import (
    Injection,
    feature_injection,
    feature_injections,
    node_table,
    target_values,
)
from attrgraph.engine.targets import Target, select_logit_targets
from attrgraph.errors import GraphError, OptionError, TargetError
from attrgraph.graph.graph import Graph, Nodes, check_graph
from attrgraph.graph.provenance import provenance_mismatch
from attrgraph.graph.streamed_influence import logit_influence
from attrgraph.graph.supernodes import NodeKey
from transcoders.arguments import is_numbers, shown
from transcoders.config import is_real, is_whole

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from attrgraph.engine.replacement import ReplacementState
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

    def theorem_residual(self, kinds: np.ndarray) -> float:
        """`root_value - leaf_sum - detached_attribution`: rounding error when the biases were
        measured and every edge is right (exactly 0 with biases inferred from the edges)."""
        return self.root_value - self.leaf_sum(kinds) - self.detached_attribution


class _ConstantTerms(NamedTuple):
    """The frozen replacement model with every source at zero (`_constant_terms`)."""

    logits: torch.Tensor
    pre_acts: torch.Tensor
    captured: dict[str, torch.Tensor]
    attn_pre_acts: torch.Tensor | None = None

    def features(self, feats: np.ndarray, sites: np.ndarray | None = None) -> np.ndarray:
        """Constant terms of features given as rows `(layer, position, feature)` (of site
        `sites[i]`, "attn" or "mlp"; default all "mlp")."""
        feats = np.asarray(feats, np.int64).reshape(-1, 3)
        out = np.zeros(len(feats))
        attn = np.zeros(len(feats), bool) if sites is None else np.asarray(sites) == "attn"
        for mine, table in ((attn, self.attn_pre_acts), (~attn, self.pre_acts)):
            if mine.any():
                f = feats[mine]
                out[mine] = table[f[:, 0], f[:, 1], f[:, 2]].double().cpu().numpy()
        return out

    def target(self, target: Target, position: int) -> float:
        """Constant term of a target read at `position` (its value on the zero-source forward)."""
        value = self.logits[position] if target.hook is None else self.captured[target.hook][position]
        return float(value.double() @ target.vector.to(value.device).double())


@torch.no_grad()
def _constant_terms(
    rm: ReplacementModel, state: ReplacementState, hooks: tuple[str, ...] = ()
) -> _ConstantTerms:
    """Run the frozen replacement model with every source (embedding outputs, feature activations,
    errors) set to zero. It is affine in the sources, so what every node reads is its constant term:
    the biases of the model and the transcoders, and the fixed MLP outputs of excluded positions."""
    acts, errors, embed = (
        torch.zeros_like(state.acts),
        torch.zeros_like(state.errors),
        torch.zeros_like(state.embed),
    )
    attn = {}
    if rm.attn is not None:
        attn = dict(
            attn_acts=torch.zeros_like(state.attn_acts), attn_errors=torch.zeros_like(state.attn_errors)
        )
    out = rm.forward(state, acts, errors, embed, **attn)
    captured = {}
    if hooks:
        attn_constant = rm.attn_constant(state, attn.get("attn_acts"), attn.get("attn_errors"))
        with rm.frozen(
            state,
            rm.constant(state, acts, errors),
            embed=embed,
            capture=tuple(hooks),
            attn_constant=attn_constant,
        ) as run:
            rm.model(state.tokens[None])
            captured = {k: v[0] for k, v in run.captured.items()}
    return _ConstantTerms(out.logits, out.pre_acts, captured, out.attn_pre_acts)


def node_biases(
    rm: ReplacementModel, graph: Graph, targets: Sequence[Target] = ()
) -> Float[np.ndarray, " n_nodes"]:
    """Each node's constant term, measured on the frozen replacement model with every source at
    zero (module docstring, step 4): a feature's encoder pre-activation there, a logit node's
    `target.vector . value` there, and 0 for embeddings and errors (sources have no bias). `rm`
    is the `ReplacementModel` the graph was built with; the i-th logit node reads `targets[i]`
    (default: the demeaned logit of its token; a graph with custom targets needs them)."""
    m, nodes = graph.meta, graph.nodes
    if "exclude_bos" not in m or "embedding" not in m:
        raise GraphError(
            "the graph's meta does not say how it was built (exclude_bos, embedding); "
            "pass a graph from attribute or attribute_hierarchical."
        )
    why = provenance_mismatch(graph, rm.model, rm.tc, rm.attn)
    if why is not None:
        raise GraphError(f"{why}; pass the ReplacementModel of the model and the sets it was built with.")
    state = rm.run(
        torch.as_tensor(graph.prompt_ids, device=rm.cfg.device),
        exclude_bos=m["exclude_bos"],
        embedding=m["embedding"],
    )
    logit_idx = np.flatnonzero(nodes.kind == "logit")
    targets = list(targets)
    if not targets:
        if m.get("custom_targets") or m.get("method") == "hierarchical":
            raise GraphError(
                "the graph's root or logit nodes are custom targets; pass targets= the targets it was built with."
            )
        d_vocab = state.logits.shape[-1]
        for tok in nodes.token[logit_idx].tolist():
            vec = torch.full((d_vocab,), -1.0 / d_vocab, dtype=torch.float64, device=state.logits.device)
            vec[tok] += 1.0
            targets.append(Target(name=str(tok), vector=vec, token=tok))
    if len(targets) != len(logit_idx):
        raise GraphError(
            f"the graph has {len(logit_idx)} logit nodes but {len(targets)} targets were given; pass one target per logit node."
        )
    hooks = tuple(sorted({t.hook for t in targets if t.hook is not None}))
    const = _constant_terms(rm, state, hooks)
    bias = np.zeros(len(nodes))
    f = np.flatnonzero(nodes.kind == "feature")
    bias[f] = const.features(
        np.stack([nodes.layer[f], nodes.position[f], nodes.feature[f]], axis=1), nodes.site[f]
    )
    for i, t in zip(logit_idx, targets):
        bias[i] = const.target(t, int(nodes.position[i]))
    return bias


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
    bias: np.ndarray | None = None,
) -> HierarchicalResult:
    """Steps 1-4 on a built graph, rooted at node `root` (default: the first logit node).

    `keep` (bool per node) replaces the threshold by a fixed set of features to keep: with the
    set chosen by a plain `attribution >= tau` after one pass, it is standard attribution.
    `bias` (one constant term per node, e.g. `node_biases`) gives the bias leaves; without it they
    are inferred as `value_u - sum_s A[u, s]`, so that `theorem_residual` is 0 by construction."""
    check_graph(graph, "hierarchical_attribution")
    if not is_real(tau) or math.isnan(tau):
        raise GraphError(f"tau is {shown(tau)}; pass a number (the attribution a node needs to be kept).")
    n = graph.nodes
    kinds = n.kind
    if root is None:
        logits = np.flatnonzero(kinds == "logit")
        if not len(logits):
            raise GraphError("the graph has no logit node; pass root= the index of the node to attribute.")
        root = int(logits[0])
    if not (is_whole(root) and 0 <= root < len(kinds)):
        raise GraphError(
            f"root is {root!r}; pass a node index in 0..{len(kinds) - 1} (a logit or feature node)."
        )
    if kinds[root] not in ("logit", "feature"):
        raise GraphError(f"node {root} is a {kinds[root]} node; the root must be a logit or feature node.")
    A = sp.csr_array(graph.adjacency, dtype=np.float64)
    N = graph.n_nodes
    value = n.activation.astype(np.float64)
    if bias is not None:
        bias = np.asarray(bias, np.float64) if is_numbers(bias) else None
        if bias is None or bias.shape != (N,):
            raise GraphError(
                f"bias is {'not numbers' if bias is None else f'of shape {bias.shape}'}; pass one constant "
                f"term per node, shape ({N},)."
            )
    if keep is not None:
        keep = np.asarray(keep)
        if keep.shape != (N,) or keep.dtype != bool:
            raise GraphError(
                f"keep is a {keep.dtype} array of shape {keep.shape}; pass one bool per node, shape ({N},)."
            )
    attribution = np.zeros(N)
    kept = (kinds == "embedding") | (kinds == "error")
    kept[root] = True
    attribution[root] = value[root]
    row = A[[root]].toarray()[0]
    acc = row.copy()
    bias_attr = value[root] - row.sum() if bias is None else bias[root]
    detached = 0.0
    feats = np.flatnonzero((kinds == "feature") & (np.arange(N) < root))
    rank = 2 * n.layer[feats] + (n.site[feats] != "attn")  # step 2: a layer's MLP before its attention
    for r in sorted(set(rank.tolist()), reverse=True):
        idx = feats[rank == r]
        attr = acc[idx]
        attribution[idx] = attr
        ok = _detach(attr, tau, absolute) if keep is None else (keep[idx] & (attr != 0))
        detached += float(attr[~ok].sum())
        idx, attr = idx[ok], attr[ok]
        kept[idx] = True
        if len(idx):
            grad = attr / value[idx]
            rows = A[idx]
            acc += rows.T @ grad
            b = value[idx] - np.asarray(rows.sum(axis=1)).ravel() if bias is None else bias[idx]
            bias_attr += float(grad @ b)
    leaves = (kinds == "embedding") | (kinds == "error")
    attribution[leaves] = acc[leaves]
    return HierarchicalResult(attribution, kept, float(value[root]), float(bias_attr), detached)


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
    active on the prompt (an attention feature as `NodeKey("feature", layer, position, feature,
    "attn")`; `transcoders` may be `[mlp_set, attn_set]`). `backend` picks the rows engine as in `attribute` ("auto", "linear",
    "autograd")."""
    if isinstance(tau, bool) or not isinstance(tau, numbers.Real) or math.isnan(tau):
        raise OptionError(
            f"tau is {tau!r}; pass a number (0 detaches what pushes the root down, -inf nothing)."
        )
    _check_root(root)
    check_batch_size(batch_size)
    checked = [root] if isinstance(root, Target) else None
    run = run_prompt(
        model, transcoders, prompt, exclude_bos=exclude_bos, embedding=embedding, targets=checked
    )
    start = _root(run, root)  # step 1
    engine = rows_engine(backend, run.rm, [start.inj])

    def rows_for(injections):
        return sp.csr_array(
            engine(run.rm, run.state, run.sources, injections, batch_size=batch_size), dtype=np.float64
        )

    walk = _walk(run, start, rows_for, tau, absolute)  # steps 2-3
    graph = _kept_graph(run, start, walk)  # step 4
    graph.meta.update(tau=float(tau), absolute=bool(absolute))
    # prune_graph's own pass: pruning with this influence equals pruning without it, bit for bit
    graph.nodes.influence = logit_influence(graph.adjacency, graph.logit_weights()).influence
    return graph


class _Root(NamedTuple):
    """Step 1: the root node of a hierarchical graph."""

    inj: Injection
    value: float
    bias: float
    rank: int
    """The walk visits the feature blocks below this one (`PromptRun.layer_rank`; 2 L: all)."""
    col: int | None
    """The root feature's column; None for a target (a logit, a difference, a direction)."""
    targets: list[Target]
    name: str
    const: _ConstantTerms


def _check_root(root) -> None:
    """`TargetError` unless `root` is None, a `Target`, a `NodeKey` or (layer, position, feature)
    integers: before the prompt runs."""
    if root is None or isinstance(root, Target | NodeKey):
        return
    triple = isinstance(root, tuple | list) and len(root) == 3
    if not (triple and all(map(is_whole, root))):
        raise TargetError(
            f"root is {root!r}; pass None (the top logit), a Target, or an active feature (layer, position, feature)."
        )


def _root(run: PromptRun, root) -> _Root:
    """Step 1: the root's injection, value and constant term, from a target (None: the top logit)
    or an active feature."""
    state, feats, sites = run.state, run.feats, run.sites
    if root is None or isinstance(root, Target):
        targets = (
            [root] if root is not None else select_logit_targets(state.logits[-1], 1, 1.0, run.tokenizer)
        )
        t = targets[0]
        pos = t.position % run.n_pos
        inj = Injection(t.vector, pos, hook=t.hook, logits=t.hook is None)
        const = _constant_terms(run.rm, state, (t.hook,) if t.hook is not None else ())
        value = target_values(run.rm, state, targets, [pos])[0]
        name = "top logit" if root is None else root.name
        # a target at a hook may read features of any layer: walk them all
        return _Root(inj, value, const.target(t, pos), 2 * run.n_layers, None, targets, name, const)
    site = root.site if isinstance(root, NodeKey) else "mlp"
    l, p, f = (
        int(x) for x in ((root.layer, root.position, root.feature) if isinstance(root, NodeKey) else root)
    )
    match = np.flatnonzero((feats[:, 0] == l) & (feats[:, 1] == p) & (feats[:, 2] == f) & (sites == site))
    if not len(match):
        raise TargetError(
            f"{site} feature {(l, p, f)} is not active on this prompt; pick an active (layer, position, feature)."
        )
    const = _constant_terms(run.rm, state)
    value = float((state.attn_pre_acts if site == "attn" else state.pre_acts)[l, p, f])
    bias = float(const.features(feats[match[0]], sites[match[:1]])[0])
    rank = int(run.layer_rank()[match[0]])
    inj = feature_injection(run.rm, l, p, f, site)
    return _Root(inj, value, bias, rank, run.n_src + int(match[0]), [], str(root), const)


class _Walk(NamedTuple):
    """Steps 2-3: what the walk from the root found."""

    root_row: sp.csr_array
    acc: np.ndarray
    """[n_columns] `sum_{u kept} A[u, s] grad_u` for every source s."""
    attribution: np.ndarray
    node_bias: np.ndarray
    kept_rows: list
    kept_cols: list
    bias: float
    detached: float
    n_detached: int


def _feature_acts(run: PromptRun) -> np.ndarray:
    """[n_features] the activation of every active feature (float64), in node order."""
    acts = np.zeros(len(run.feats))
    features = run.sources.features
    for site, table in (("mlp", run.state.acts), ("attn", run.state.attn_acts)):
        mine = run.sites == site
        if mine.any():
            picked = features[torch.as_tensor(mine, device=features.device)]
            acts[mine] = table[tuple(picked.T)].double().cpu().numpy()
    return acts


def _walk(run: PromptRun, root: _Root, rows_for, tau: float, absolute: bool) -> _Walk:
    """Steps 2-3: visit the feature blocks below the root from the top, detach the weak ones at
    once, and compute rows for the kept ones only."""
    feats, sites, rank, n_src = run.feats, run.sites, run.layer_rank(), run.n_src
    root_row = rows_for([root.inj])
    acc = root_row.toarray()[0]
    bias = root.bias
    n_cols = run.sources.n_columns
    attribution, node_bias = np.zeros(n_cols), np.zeros(n_cols)
    kept_rows, kept_cols, detached, n_detached = [], [], 0.0, 0
    acts = _feature_acts(run)
    for r in range(root.rank - 1, -1, -1):
        sel = np.flatnonzero(rank == r)
        cols = n_src + sel
        attr = acc[cols]
        attribution[cols] = attr
        ok = _detach(attr, tau, absolute)
        detached += float(attr[~ok].sum())
        n_detached += int((~ok & (attr != 0)).sum())
        sel, cols, attr = sel[ok], cols[ok], attr[ok]
        if not len(sel):
            continue
        rows = rows_for(
            feature_injections(run.rm, torch.from_numpy(feats[sel]), torch.from_numpy(sites[sel] == "attn"))
        )
        grad = attr / acts[sel]
        acc += rows.T @ grad
        node_bias[cols] = root.const.features(feats[sel], sites[sel])
        bias += float(grad @ node_bias[cols])
        kept_rows.append(rows)
        kept_cols.append(cols)
    attribution[:n_src] = acc[:n_src]
    return _Walk(root_row, acc, attribution, node_bias, kept_rows, kept_cols, bias, detached, n_detached)


def _kept_graph(run: PromptRun, root: _Root, walk: _Walk) -> Graph:
    """Step 4: the kept graph (embeddings, errors, kept features in node order, and the root), its
    per-node attribution and bias, and Theorem 3.1's terms in its meta."""
    n_src, n_cols = run.n_src, run.sources.n_columns
    kept_rows, kept_cols = list(walk.kept_rows), list(walk.kept_cols)
    attribution, node_bias = walk.attribution, walk.node_bias
    residual = root.value - (float(walk.acc[:n_src].sum()) + walk.bias + walk.detached)
    if root.col is not None:
        kept_rows.append(walk.root_row)
        kept_cols.append(np.array([root.col]))
        attribution[root.col] = root.value
        node_bias[root.col] = root.bias
    fcols = np.concatenate(kept_cols) if kept_cols else np.zeros(0, np.int64)
    order = np.argsort(fcols, kind="stable")
    fcols = fcols[order]
    R = sp.vstack(kept_rows, format="csr")[order] if kept_rows else sp.csr_array((0, n_cols))
    columns = np.concatenate([np.arange(n_src), fcols]).astype(np.int64)
    n_t = 0 if root.col is not None else 1
    if n_t:
        R = sp.vstack([R, walk.root_row], format="csr")
    N = len(columns) + n_t
    body = sp.csr_array(R)[:, columns]
    adjacency = sp.vstack([sp.csr_array((n_src, len(columns))), body], format="csr")
    adjacency = sp.csr_array(sp.hstack([adjacency, sp.csr_array((N, n_t))], format="csr"), dtype=np.float32)

    targets = root.targets[:n_t]
    positions = [root.inj.position] if n_t else []
    full = node_table(run.state, run.sources, targets, positions, [root.value] * n_t, run.n_layers)
    nodes: Nodes = full.select(np.concatenate([columns, np.arange(n_cols, n_cols + n_t)]))
    meta = dict(
        method="hierarchical",
        root=root.name,
        root_index=int(np.searchsorted(columns, root.col)) if root.col is not None else N - 1,
        root_value=float(root.value),
        bias_attribution=float(walk.bias),
        detached_attribution=float(walk.detached),
        theorem_residual=float(residual),
        n_detached=int(walk.n_detached),
        attribution=[float(x) for x in np.concatenate([attribution[columns], [root.value] * n_t])],
        bias=[float(x) for x in np.concatenate([node_bias[columns], [root.bias] * n_t])],
    )
    return run.graph(nodes, adjacency, targets, np.ones(n_t), meta)


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

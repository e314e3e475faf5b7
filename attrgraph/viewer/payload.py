"""What the page draws: a graph (or a view of it) as plain JSON.

1. The view. Pruned graphs are what people look at: a stored graph above `MAX_NODES` nodes or
   `MAX_EDGES` edges that was never pruned is shown pruned with `VIEW_THRESHOLDS` (prune.py);
   if a view still has more than `MAX_EDGES` edges, the strongest `MAX_EDGES` (by |weight|) are
   kept. Either way `notes` says so, with the stored sizes.
2. Nodes: index in the view, kind, layer, position, feature, token, activation, logit
   influence, label (feature: its dashboard label, else `L{layer}/F{feature}`), `key` (the
   supernode key [kind, layer, position, feature], supernodes.py), `name` (features:
   `L{layer}/F{feature}`, `A{layer}/F{feature}` for attention features), `slider_influence`
   (the page's threshold sliders rank by it: each node's influence in the unpruned graph when
   the graph stores it, `unpruned_influence`, else the stored influence), and for a graph of
   `attribute_hierarchical` its per-node `attribution`. `row` and `col` place it: rows bottom
   to top are embeddings, layers 0..n_layers-1, logits; columns are prompt positions.
3. Edges: `[source, target, weight]`, the signed direct effect (rows = targets in the Graph).
   Edge weights, `slider_influence` and logit nodes' `prob` keep full float64 precision: the
   page's sliders prune the view as `prune_graph` would (viewer.js step 1), from the same numbers.
4. Graph-level: `prune_rule`, the pruning rule (prune.py step 5) the page's sliders start with:
   the one the view records (meta `prune_rule`; "appendix" for a graph pruned before rules were
   recorded, the only rule then), else prune.py's default, "circuit-tracer"; prompt tokens,
   logits with probabilities, replacement and completeness scores (scores.py, of the view drawn;
   the page recomputes them as its sliders hide nodes and edges), the hierarchical root identity
   where present, the plain meta, the stored supernodes (as keys), and each feature's dashboard
   (dashboards.py: an attention feature's from the attention set's file; a note in `notes` when
   it has none).
NaN becomes null, so the result is strict JSON.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import scipy.sparse as sp

from attrgraph.graph.graph import Graph
from attrgraph.graph.prune import DEFAULT_RULE, RULES, prune_graph
from attrgraph.graph.scores import compute_graph_scores
from attrgraph.graph.supernodes import Supernode, node_key
from attrgraph.viewer.dashboards import DashboardSource, feature_dashboard, find_dashboards

MAX_NODES = 2000
"""Above this many nodes an unpruned graph is shown pruned (step 1)."""
MAX_EDGES = 10_000
"""Above this many edges an unpruned graph is shown pruned, and any view keeps its strongest this many."""
VIEW_THRESHOLDS = (0.8, 0.98)
"""(node, edge) thresholds of the pruned view, `attrgraph build`'s defaults."""
HIERARCHICAL_KEYS = (
    "tau",
    "root",
    "root_value",
    "bias_attribution",
    "detached_attribution",
    "theorem_residual",
)


def json_number(x) -> float | None:
    """`x` as a float of 6 significant digits, or None for NaN and infinities (strict JSON)."""
    x = float(x)
    return None if math.isnan(x) or math.isinf(x) else float(f"{x:.6g}")


def json_exact(x) -> float | None:
    """`x` as a float at full precision, or None for NaN and infinities (strict JSON)."""
    x = float(x)
    return None if math.isnan(x) or math.isinf(x) else x


def recorded_rule(graph: Graph) -> str:
    """The pruning rule `graph` was pruned by (module docstring, step 4)."""
    rule = graph.meta.get("prune_rule")
    if rule in RULES:
        return rule
    return "appendix" if graph.meta.get("pruned") and rule is None else DEFAULT_RULE


def view_keys(graph: Graph) -> list[tuple]:
    """A key per node that survives pruning: the supernode key, with the rank for logits (several
    logits share a position)."""
    n = graph.nodes
    rank = np.cumsum(n.kind == "logit") - 1
    return [
        tuple(node_key(graph, i)) + ((int(rank[i]),) if n.kind[i] == "logit" else ())
        for i in range(graph.n_nodes)
    ]


def graph_view(graph: Graph) -> tuple[Graph, np.ndarray, list[str]]:
    """(the view, for each of its nodes the index of that node in `graph`, notes) (step 1)."""
    notes = []
    view, index = graph, np.arange(graph.n_nodes)
    if (graph.n_nodes > MAX_NODES or graph.n_edges > MAX_EDGES) and not graph.meta.get("pruned"):
        nt, et = VIEW_THRESHOLDS
        view = prune_graph(graph, nt, et)
        where = {k: i for i, k in enumerate(view_keys(graph))}
        index = np.array([where[k] for k in view_keys(view)], np.int64)
        notes.append(
            f"This graph is stored unpruned ({graph.n_nodes} nodes, {graph.n_edges} edges); shown pruned "
            f"at node threshold {nt}, edge threshold {et}: {view.n_nodes} nodes, {view.n_edges} edges."
        )
    if view.n_edges > MAX_EDGES:
        A = sp.coo_array(view.adjacency)
        keep = np.argsort(-np.abs(A.data), kind="stable")[:MAX_EDGES]
        n_before = view.n_edges
        adj = sp.csr_array((A.data[keep], (A.row[keep], A.col[keep])), shape=A.shape)
        view = view.subgraph(np.ones(view.n_nodes, bool), adjacency=adj)
        notes.append(f"Showing the {MAX_EDGES} strongest of this view's {n_before} edges (by |weight|).")
    return view, index, notes


def _node_label(graph: Graph, i: int, kind: str, labels: dict) -> str:
    n = graph.nodes
    layer, pos = int(n.layer[i]), int(n.position[i])
    attn = n.site[i] == "attn"
    if kind == "feature":
        return labels.get((attn, layer, int(n.feature[i]))) or feature_name(attn, layer, int(n.feature[i]))
    if kind == "embedding":
        return f"emb {graph.prompt_tokens[pos]!r}@{pos}"
    if kind == "error":
        return f"{'attn ' if attn else ''}err L{layer}@{pos}"
    return ""  # logits: filled by the caller, which knows their rank


def has_attention_features(graph: Graph) -> bool:
    return bool(((graph.nodes.kind == "feature") & (graph.nodes.site == "attn")).any())


def _attention_source(graph: Graph, view: Graph) -> DashboardSource | None:
    """The dashboards of the graph's attention-output SAE set, when it has attention features
    (found like the MLP set's, graph/dashboard_lookup.py, from the `attn_transcoder*` provenance)."""
    if not has_attention_features(view):
        return None
    return find_dashboards(graph.meta, site="attn")


def feature_name(attn: bool, layer: int, feature: int) -> str:
    """`A{layer}/F{feature}` for an attention feature, `L{layer}/F{feature}` for an MLP-site one."""
    return f"{'A' if attn else 'L'}{layer}/F{feature}"


UNPRUNED_NAMES = ("unpruned_influence", "influence_unpruned", "full_influence")
"""Where a pruned graph may keep each node's influence in the unpruned graph (issue 21):
a node field or a meta entry of one of these names."""


def unpruned_influence(graph: Graph) -> np.ndarray | None:
    """Each node's logit influence in the unpruned graph, when the graph stores it (read
    defensively: a node array or a meta list of the right length, finite), else None."""
    # graphs pruned before prune_graph kept it hold NaN in the node field: look on
    for value in [getattr(graph.nodes, key, None) for key in UNPRUNED_NAMES] + [
        graph.meta.get(key) for key in UNPRUNED_NAMES
    ]:
        if value is None:
            continue
        try:
            arr = np.asarray(value, np.float64).reshape(-1)
        except (TypeError, ValueError):
            continue
        if arr.shape == (graph.n_nodes,) and np.isfinite(arr).all():
            return arr
    return None


def graph_payload(
    graph: Graph,
    name: str,
    supernodes: Sequence[Supernode] = (),
    source: DashboardSource | None = None,
    attn_source: DashboardSource | None = None,
) -> dict:
    """The page's JSON for `graph` stored as `name` (module docstring). `source`: the dashboards of
    its MLP-site features; `attn_source`: its attention features' (default: found, dashboards.py)."""
    view, index, notes = graph_view(graph)
    meta = graph.meta
    n_layers = int(meta.get("n_layers", max(int(graph.nodes.layer.max(initial=0)), 0)))
    n = view.nodes
    boards: dict[str, dict] = {}
    labels: dict[tuple[bool, int, int], str] = {}
    if attn_source is None:
        attn_source = _attention_source(graph, view)
    elif not ((n.kind == "feature") & (n.site == "attn")).any():
        attn_source = None
    if attn_source is not None and attn_source.dashboards is None:
        notes = notes + [attn_source.note]
    for attn, src in ((False, source), (True, attn_source)):
        dashboards = src.dashboards if src is not None else None
        if dashboards is None:
            continue
        mine = (n.kind == "feature") & ((n.site == "attn") == attn)
        for layer, feat in sorted({(int(n.layer[i]), int(n.feature[i])) for i in np.flatnonzero(mine)}):
            board = feature_dashboard(dashboards, layer, feat)
            if board is not None:
                boards[f"{'A' if attn else ''}{layer}/{feat}"] = board
                labels[(attn, layer, feat)] = board["label"]
    attribution = meta.get("attribution") if meta.get("method") == "hierarchical" else None
    if attribution is not None and len(attribution) != graph.n_nodes:
        attribution = None  # a stored graph pruned after attribute_hierarchical: no per-node values
    logit_rank = np.cumsum(n.kind == "logit") - 1
    full = unpruned_influence(graph)
    slider = full[index] if full is not None else np.asarray(n.influence, np.float64)
    nodes = []
    for i in range(view.n_nodes):
        kind = str(n.kind[i])
        layer, pos = int(n.layer[i]), int(n.position[i])
        node = {
            "id": i,
            "kind": kind,
            "layer": layer,
            "position": pos,
            "feature": int(n.feature[i]),
            "token": view.prompt_tokens[pos] if 0 <= pos < view.n_pos else "",
            "activation": json_number(n.activation[i]),
            "influence": json_number(n.influence[i]),
            "key": list(node_key(view, i)),
            "site": str(n.site[i]),
            "row": {"embedding": 0, "logit": n_layers + 1}.get(kind, layer + 1),
            "col": pos,
            "label": _node_label(view, i, kind, labels),
            "slider_influence": json_exact(slider[i]),
        }
        if kind == "feature":
            node["name"] = feature_name(node["site"] == "attn", layer, node["feature"])
            node["labelled"] = (node["site"] == "attn", layer, node["feature"]) in labels
        if kind == "logit":
            k = int(logit_rank[i])
            node["label"] = f"logit {view.logit_strings[k]!r} p={float(view.logit_probs[k]):.3f}"
            node["token"] = view.logit_strings[k]
            node["prob"] = json_exact(view.logit_probs[k])
        if attribution is not None:
            node["attribution"] = json_number(attribution[int(index[i])])
        nodes.append(node)
    A = sp.coo_array(view.adjacency)
    keep = A.data != 0
    edges = [
        [int(s), int(t), json_exact(w)]
        for t, s, w in zip(A.row[keep], A.col[keep], A.data[keep].astype(np.float64))
    ]
    scores = compute_graph_scores(view)  # of the graph drawn, not of the stored full graph
    return {
        "kind": "graph",
        "name": name,
        "n_layers": n_layers,
        "stored": {"n_nodes": graph.n_nodes, "n_edges": graph.n_edges},
        "slider_influence": "unpruned" if full is not None else "stored",
        "prune_rule": recorded_rule(view),
        "notes": notes,
        "prompt_tokens": list(graph.prompt_tokens),
        "row_labels": ["emb"] + [f"L{layer}" for layer in range(n_layers)] + ["logit"],
        "col_labels": list(graph.prompt_tokens),
        "logits": [
            {"token": s, "prob": json_number(p)}
            for s, p in zip(graph.logit_strings, graph.logit_probs.tolist())
        ],
        "scores": {
            "replacement": json_number(scores.replacement),
            "completeness": json_number(scores.completeness),
        },
        "hierarchical": (
            {k: meta[k] for k in HIERARCHICAL_KEYS if k in meta}
            if meta.get("method") == "hierarchical"
            else None
        ),
        "meta": {
            k: v
            for k, v in meta.items()
            if isinstance(v, (str, int, bool)) or (isinstance(v, float) and math.isfinite(v))
        },
        "nodes": nodes,
        "edges": edges,
        "supernodes": [{"name": s.name, "members": [list(m) for m in s.members]} for s in supernodes],
        "dashboards": boards,
        "dashboards_note": source.note if source is not None else "no feature dashboards given.",
    }

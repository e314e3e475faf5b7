"""GET /api/heads?graph=NAME&source=ID&target=ID: the attention heads that carried an edge.

Asked of circuit-tracer in its issue 53 (analysis/head_loadings.py computes the split). Checked
first; a request that breaks a rule raises `ViewRequestError` (a 400), nothing computed:

1. Exactly one `graph`, `source` and `target`: the page's node ids (indices into the graph's
   view, payload.py) of an edge of the graph (a nonzero adjacency entry), its target a feature
   or logit node.
2. The model and sets: the graph's (model_hub.py); the graph must have been built with them
   (head_loadings checks the fingerprints it records).
3. The answer (`heads_json`): `HeadLoadings.to_json` of that edge (the edge from the frozen
   forward sweep, per layer every head's loading and the bypass term, which sum to the edge; the
   strongest heads), plus `adjacency`, the graph's stored edge.
   `head_loadings` holds `model_lock(model)` while it sweeps (frozen_forward swaps `block.mlp`
   on the shared model), so concurrent requests run one after the other.
"""

from __future__ import annotations

from attrgraph.errors import ViewRequestError
from attrgraph.viewer.global_request import MAX_INT, article, query_int, query_value

N_TOP = 8
"""Strongest heads listed first."""


def parse_heads(query: dict[str, list[str]]) -> tuple[str, int, int]:
    """Step 1 but membership: (graph name, source id, target id)."""
    return (
        query_value(query, "graph"),
        query_int(query, "source", 0, MAX_INT),
        query_int(query, "target", 0, MAX_INT),
    )


def check_edge(view, source: int, target: int) -> float:
    """Step 1: the edge source -> target of the view; its stored weight."""
    n = view.nodes
    for name, i in (("source", source), ("target", target)):
        if not 0 <= i < view.n_nodes:
            raise ViewRequestError(f"{name} {i} is not a node of this graph; it has {view.n_nodes}.")
    if str(n.kind[target]) not in ("feature", "logit"):
        raise ViewRequestError(
            f"target {target} is {article(str(n.kind[target]))} node; pick an edge into a feature or logit."
        )
    weight = float(view.adjacency[target, source])
    if weight == 0.0:
        raise ViewRequestError(f"there is no edge from node {source} to node {target} in this graph.")
    return weight


def heads_json(loaded, graph, source: int, target: int) -> dict:
    """Steps 2-3: the head loadings of the edge source -> target of `graph` (node indices of
    `graph`) with the loaded model and sets `loaded` (model_hub.Loaded)."""
    from attrgraph.analysis.head_loadings import head_loadings

    hl = head_loadings(loaded.model, loaded.replacement, graph, [(target, source)])
    out = hl.to_json(0, N_TOP)
    out.update(
        adjacency=float(graph.adjacency[target, source]),
        n_layers=int(hl.heads.shape[1]),
        n_heads=int(hl.heads.shape[2]),
        model=loaded.spec.to_json(),
    )
    return out

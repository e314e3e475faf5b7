"""A graph's summary, as a dict (for `--json`) and as text (for the terminal).

1. Sizes: nodes, edges, features, and nodes per kind.
2. The logit targets with their probabilities, most probable first.
3. The top features by logit influence (prune.compute_influence, stored on the nodes), with
   layer, position, the token at that position, activation and influence.
4. The metadata the graph carries (model, transcoders, options, thresholds).
5. The graph's replacement and completeness scores (scores.py), and for hierarchical and adaptive
   graphs their root / budget figures.
6. NaN or inf (a graph stored by a version that did not refuse them): `non_finite` counts them,
   the scores are undefined (None, "not defined"), never a number, and such values show as None.
   NaN as the activation of an embedding, error or logit node is not counted: it is a value the
   graph's file did not record (circuit-tracer's JSON and .pt files hold only features').
"""

from __future__ import annotations

import numpy as np

from attrgraph.graph.graph import NODE_ORDER, Graph
from attrgraph.graph.scores import GraphScores, compute_graph_scores


def _number(x) -> float | None:
    """`x` rounded for the summary, or None when it is NaN or inf (plain JSON has no NaN)."""
    x = float(x)
    return round(x, 6) if np.isfinite(x) else None


def _non_finite(graph: Graph) -> dict:
    """Step 6: NaN or inf values per array that holds any (influence is NaN until computed, so not
    counted; its scores are undefined all the same)."""
    act, feature = graph.nodes.activation, graph.nodes.kind == "feature"
    # a non-feature node's NaN activation is a value its file did not record (load_json, load_pt)
    unrecorded = ~feature & np.isnan(act)
    arrays = {
        "edges": graph.adjacency.data,
        "activations": act[~unrecorded],
        "logit_probs": graph.logit_probs,
    }
    counts = {k: int(np.size(v) - np.isfinite(v).sum()) for k, v in arrays.items()}
    return {k: v for k, v in counts.items() if v}


def summarize(graph: Graph, n_top: int = 10, scores: GraphScores | None = None) -> dict:
    """Plain-JSON summary: at least n_nodes, n_edges, n_features, logit_tokens, logit_probs.
    `scores`: the graph's scores when already computed (a graph fresh from `attribute` carries
    them as `meta["unpruned_*_score"]`); by default one streamed pass over its edges computes them."""
    if scores is None:
        scores = compute_graph_scores(graph)
    n = graph.nodes
    feats = np.flatnonzero(n.kind == "feature")
    influence = np.nan_to_num(n.influence[feats], nan=-1.0)
    top = feats[np.argsort(-influence, kind="stable")[:n_top]]
    return {
        "n_nodes": graph.n_nodes,
        "n_edges": graph.n_edges,
        "n_features": graph.n_features,
        "nodes_by_kind": {k: int((n.kind == k).sum()) for k in NODE_ORDER},
        **(
            {"attention_nodes": {k: int(n.mask(k, "attn").sum()) for k in ("error", "feature")}}
            if (n.site == "attn").any()
            else {}
        ),
        "prompt_tokens": list(graph.prompt_tokens),
        "logit_tokens": graph.logit_tokens.tolist(),
        "logit_strings": list(graph.logit_strings),
        "logit_probs": [_number(p) for p in graph.logit_probs],
        "top_features": [
            {
                "layer": int(n.layer[i]),
                "position": int(n.position[i]),
                "feature": int(n.feature[i]),
                "token": graph.prompt_tokens[int(n.position[i])],
                "activation": _number(n.activation[i]),
                "influence": _number(n.influence[i]),
                "site": str(n.site[i]),
            }
            for i in top
        ],
        **dict(zip(("replacement_score", "completeness_score"), (_number(x) for x in scores))),
        **({"non_finite": bad} if (bad := _non_finite(graph)) else {}),
        "meta": {k: v for k, v in graph.meta.items() if isinstance(v, (str, int, float, bool))},
    }


def _fmt(x: float | None, spec: str) -> str:
    return "nan" if x is None else format(x, spec)


def format_summary(summary: dict, title: str = "graph") -> str:
    """The summary as a few aligned lines of text."""
    kinds = ", ".join(f"{v} {k}" for k, v in summary["nodes_by_kind"].items())
    lines = [f"{title}: {summary['n_nodes']} nodes ({kinds}), {summary['n_edges']} edges"]
    if "attention_nodes" in summary:
        a = summary["attention_nodes"]
        lines.append(f"  attention: {a['feature']} features, {a['error']} error nodes (site attn)")
    logits = "  ".join(
        f"{s!r} {_fmt(p, '.3f')}" for s, p in zip(summary["logit_strings"], summary["logit_probs"])
    )
    lines.append(f"  logits: {logits}")
    if summary.get("non_finite"):
        bad = ", ".join(f"{v} {k}" for k, v in summary["non_finite"].items())
        lines.append(f"  NaN or inf values: {bad}; rebuild the graph with finite transcoders")
    if "replacement_score" in summary:
        r, c = summary["replacement_score"], summary["completeness_score"]
        lines.append(
            "  scores: not defined (the graph holds NaN or inf)"
            if r is None or c is None
            else f"  scores: replacement {r:.3f}, completeness {c:.3f}"
        )
    meta = summary.get("meta", {})
    if meta.get("method") == "hierarchical":
        lines.append(
            f"  hierarchical (tau {meta['tau']:.4g}): root {meta['root_value']:.4f} = leaves + bias "
            f"{meta['bias_attribution']:.4f} + detached {meta['detached_attribution']:.4f}"
            + (f" (mismatch {meta['theorem_residual']:.1e})" if "theorem_residual" in meta else "")
        )
    if meta.get("method") == "adaptive":
        lines.append(
            f"  adaptive: {meta['n_explored']} of {meta['n_active_features']} active features explored (rest counted as error)"
        )
    if meta.get("source") == "circuit-tracer":  # circuit_tracer_pt.py step 5
        explored = meta.get("circuit_tracer_explored_features")
        lines.append(
            f"  built by circuit-tracer (model {meta.get('model') or '?'}, transcoders {meta.get('transcoders') or '?'})"
            + (
                f": {explored} of {meta['circuit_tracer_active_features']} active features explored "
                "(the rest's edges dropped, not counted as error)"
                if explored
                else ""
            )
        )
    if summary["top_features"]:
        lines.append("  top features by logit influence:")
        for f in summary["top_features"]:
            lines.append(
                f"    {'A' if f.get('site') == 'attn' else 'L'}{f['layer']}/F{f['feature']:<6} @{f['position']:<3} {f['token']!r:<12} "
                f"act {_fmt(f['activation'], '8.3f')}  influence {_fmt(f['influence'], '.4f')}"
            )
    return "\n".join(lines)

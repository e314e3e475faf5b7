"""What the page draws for a component circuit stored by `attrgraph circuit --out` (circuits/store.py).

1. Nodes are those of circuits/construct.py's `edge_table` named by store.py's `node_names`
   ("input@t0", "a1.h2@t5", "a1.h2.k@t3", "m0", "logits") that touch a kept edge.
2. Rows bottom to top: input, then per layer the heads' q/k/v inputs (positional circuits
   only), the heads, the MLP; the logits on top. Columns are positions (or schema spans); a
   non-positional circuit has one column.
3. Edges: `[source, target, score]` of every kept edge, the stored edge score (null when the
   circuit was stored without scores), and `edge_labels` their names (EdgeLayout.edge_names): a
   non-positional circuit may hold a head's q, k and v edges from one node, drawn as one pair.
"""

from __future__ import annotations

import os
import re

import numpy as np

from attrgraph.viewer.payload import json_number

_NAME = re.compile(r"^a(\d+)\.h(\d+)(?:\.([qkv]))?$|^m(\d+)$")


def _row(base: str, n_layers: int, positional: bool) -> int:
    per_layer = 3 if positional else 2  # q/k/v inputs get their own row when they are nodes
    if base == "input":
        return 0
    if base == "logits":
        return per_layer * n_layers + 1
    m = _NAME.match(base)
    if m is None:
        return 0
    if m.group(4) is not None:  # MLP
        return per_layer * int(m.group(4)) + per_layer
    layer = int(m.group(1))
    return per_layer * layer + (1 if m.group(3) else per_layer - 1)


def circuit_payload(path: str | os.PathLike, name: str) -> dict:
    """The page's JSON for circuit `name` of the file `path` (module docstring)."""
    from attrgraph.circuits.construct import edge_table
    from attrgraph.circuits.store import load_circuit, node_names

    circuit, scores = load_circuit(path, name)
    layout = circuit.layout
    g, positional = layout.graph, layout.positional
    parent, child, _, _, _ = edge_table(layout)
    names, edge_names = node_names(layout), layout.edge_names()
    kept = np.flatnonzero(circuit.flat().numpy())
    values = scores.flat().double().numpy() if scores is not None else np.full(len(parent), np.nan)
    used = sorted(set(parent[kept].tolist()) | set(child[kept].tolist()))
    index = {v: i for i, v in enumerate(used)}
    positions = list(layout.positions) if positional else []
    nodes = []
    for i, v in enumerate(used):
        base, _, at = names[v].partition("@")
        col = positions.index(at) if at in positions else (len(positions) - 1 if base == "logits" else 0)
        nodes.append(
            {
                "id": i,
                "kind": "logit" if base == "logits" else ("embedding" if base == "input" else "component"),
                "label": names[v],
                "row": _row(base, g.n_layers, positional),
                "col": max(col, 0),
                "position": max(col, 0),
                "key": [names[v]],
            }
        )
    rows = ["input"]
    for layer in range(g.n_layers):
        rows += ([f"L{layer} q/k/v"] if positional else []) + [f"L{layer} heads", f"L{layer} mlp"]
    rows.append("logits")
    return {
        "kind": "circuit",
        "name": name,
        "method": circuit.method,
        "meta": {k: v for k, v in circuit.meta.items() if isinstance(v, (str, int, float, bool))},
        "n_edges": int(len(kept)),
        "notes": [] if scores is not None else ["This circuit was stored without edge scores."],
        "row_labels": rows,
        "col_labels": positions or ["all positions"],
        "nodes": nodes,
        "edges": [[index[int(parent[e])], index[int(child[e])], json_number(values[e])] for e in kept],
        "edge_labels": [edge_names[e] for e in kept],
    }

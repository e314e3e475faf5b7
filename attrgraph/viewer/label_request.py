"""The page's request to set feature labels, checked before anything is written.

Body (JSON): `{"graph": NAME, "labels": [{"site": "mlp" | "attn", "layer": L, "feature": F,
"label": STR}, ...]}`. The labels go where `transcoders.set_labels` keeps them: the user labels of
the dashboards file that labels that site's features in the view (dashboards.py), written through
the one atomic writer; an empty label removes the user label (the automatic one shows again).
Every rule is checked first; a request that breaks one raises `LabelError`, nothing written:

1. At most `supernode_request.MAX_BODY` bytes of UTF-8 JSON, an object with exactly those keys
   (`supernode_request.read_json`).
2. `graph` names a graph of the file; at most `MAX_LABELS` labels.
3. Each names a feature node of that graph (site, layer, feature) and a string of at most
   `MAX_LABEL` characters (`supernode_request.plain_text`); the site has a dashboards file to hold it.
"""

from __future__ import annotations

import numpy as np

from attrgraph.errors import LabelError
from attrgraph.graph.graph import Graph
from attrgraph.viewer.supernode_request import plain_text, read_json

MAX_LABELS = 1000
MAX_LABEL = 200
KEYS = {"site", "layer", "feature", "label"}


def parse_labels(body: bytes, graph_names: list[str]) -> tuple[str, list[tuple[str, int, int, str]]]:
    """(graph name, [(site, layer, feature, label)]) of a request body (steps 1-2, 3 but membership)."""
    data = read_json(body, LabelError, "{'graph': ..., 'labels': [...]}")
    if not isinstance(data, dict) or set(data) != {"graph", "labels"}:
        raise LabelError("the request must be a JSON object with exactly the keys 'graph' and 'labels'.")
    name, items = data["graph"], data["labels"]
    if not isinstance(name, str) or name not in graph_names:
        raise LabelError(f"graph {name!r} is not in this file; it holds {graph_names}.")
    if not isinstance(items, list) or not 1 <= len(items) <= MAX_LABELS:
        raise LabelError(f"'labels' must be a list of 1 to {MAX_LABELS} objects.")
    out = []
    for k, item in enumerate(items):
        ok = (
            isinstance(item, dict)
            and set(item) == KEYS
            and item["site"] in ("mlp", "attn")
            and all(isinstance(item[v], int) and not isinstance(item[v], bool) for v in ("layer", "feature"))
            and isinstance(item["label"], str)
            and len(item["label"]) <= MAX_LABEL
        )
        if not ok:
            raise LabelError(
                f"label {k} must be {{'site': 'mlp' or 'attn', 'layer': int, 'feature': int, 'label': "
                f"a string of at most {MAX_LABEL} characters}}."
            )
        if not plain_text(item["label"]):
            raise LabelError(f"label {k} holds a NUL or a lone surrogate; send plain text.")
        out.append((item["site"], item["layer"], item["feature"], item["label"].strip()))
    return name, out


def check_features(graph: Graph, labels: list[tuple[str, int, int, str]]) -> None:
    """Step 3: every label names a feature node of `graph`."""
    n = graph.nodes
    feats = n.kind == "feature"
    have = set(
        zip(
            np.where(n.site[feats] == "attn", "attn", "mlp").tolist(),
            n.layer[feats].tolist(),
            n.feature[feats].tolist(),
        )
    )
    for site, layer, feature, _ in labels:
        if (site, layer, feature) not in have:
            letter = "A" if site == "attn" else "L"
            raise LabelError(
                f"{letter}{layer}/F{feature} is not a feature of this graph; label its features only."
            )

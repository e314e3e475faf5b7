"""The page's request for a Neuronpedia link of its supernodes and pins (POST /api/link), so that a
grouping made here opens on Neuronpedia's page of the same graph (graph/shared_view.py `view_link`,
whose links circuit-tracer's `decode_url_features` reads: tests/attrgraph/graph/test_shared_view.py).

Body (JSON): `{"graph": NAME, "supernodes": [{"name": STR, "members": [[kind, layer, position,
feature(, site)], ...]}, ...], "pinned": [[kind, layer, position, feature(, site)], ...], "model":
STR, "slug": STR}`. Checked first; a request that breaks a rule raises `ViewRequestError` (or
`SupernodeError`, `ViewError`), a 400, nothing computed, nothing written:

1. At most `supernode_request.MAX_BODY` bytes of UTF-8 JSON, an object with exactly those keys.
2. `graph` names a graph of the file; `supernodes` as supernode_request.py step 3 reads them (and
   step 4: a node in one supernode only); at most `MAX_PINS` pins, each a node key.
3. Every member and pin is a node of the stored graph (the page sends only those it shows).
4. `model` and `slug`: Neuronpedia's model id and the graph's slug there, non-empty strings of at
   most `MAX_ID` characters (the page's two fields; `view_link` checks them again).
The answer is `{"graph": NAME, "link": URL}`.
"""

from __future__ import annotations

from attrgraph.errors import ViewRequestError
from attrgraph.graph.graph import Graph
from attrgraph.graph.supernodes import NodeKey, Supernode, node_key
from attrgraph.viewer.supernode_request import check_members, member_key, parse_supernodes, read_json

KEYS = {"graph", "supernodes", "pinned", "model", "slug"}
MAX_PINS = 10_000
MAX_ID = 200
SHAPE = "{'graph', 'supernodes', 'pinned', 'model', 'slug'}"


def parse_link_request(
    body: bytes, graph_names: list[str]
) -> tuple[str, list[Supernode], list[NodeKey], str, str]:
    """(graph name, supernodes, pins, model, slug) of a request body (steps 1, 2 and 4)."""
    data = read_json(body, ViewRequestError, SHAPE)
    if not isinstance(data, dict) or set(data) != KEYS:
        raise ViewRequestError(f"the request must be a JSON object with exactly the keys {SHAPE}.")
    name = data["graph"]
    if not isinstance(name, str) or name not in graph_names:
        raise ViewRequestError(f"graph {name!r} is not in this file; it holds {graph_names}.")
    pins = data["pinned"]
    if not isinstance(pins, list) or len(pins) > MAX_PINS:
        raise ViewRequestError(f"'pinned' must be a list of at most {MAX_PINS} node keys.")
    for what in ("model", "slug"):
        value = data[what]
        if not isinstance(value, str) or not 1 <= len(value.strip()) <= MAX_ID:
            raise ViewRequestError(
                f"{what} must be Neuronpedia's {'model id' if what == 'model' else 'slug of the graph'} "
                f"(1 to {MAX_ID} characters); fill in the field."
            )
    supernodes = parse_supernodes(data["supernodes"])
    keys = [member_key(f"pin {k}", m) for k, m in enumerate(pins)]
    return name, supernodes, keys, data["model"].strip(), data["slug"].strip()


def make_link(graph: Graph, supernodes: list[Supernode], pins: list[NodeKey], model: str, slug: str) -> str:
    """Step 3, then the link (`view_link`)."""
    from attrgraph.graph.shared_view import view_link

    check_members(graph, supernodes)
    index = {node_key(graph, i): i for i in range(graph.n_nodes)}
    absent = [list(k) for k in pins if k not in index]
    if absent:
        raise ViewRequestError(f"pinned node {absent[0]} is not a node of this graph; unpin it.")
    return view_link(graph, supernodes, [index[k] for k in pins], model=model, slug=slug)

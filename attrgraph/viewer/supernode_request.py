"""The page's request to store supernodes, checked before anything is written.

Body (JSON): `{"graph": NAME, "supernodes": [{"name": STR, "members": [[kind, layer, position,
feature], ...]}, ...]}`, the whole list for that graph (it replaces what the file held, as
supernode_store.save_supernodes does). Every rule below is checked first; a request that breaks
one raises `SupernodeError` with one sentence, and the file is not touched:

1. At most `MAX_BODY` bytes of UTF-8 JSON holding an object with exactly those two keys
   (`read_json`: nesting too deep for the parser is refused like any malformed body).
2. `graph` names a graph of the file.
3. At most `MAX_SUPERNODES` supernodes; each has a name (1 to `MAX_NAME` characters, unique,
   `plain_text`: no NUL and no lone surrogate, which HDF5 cannot store)
   and at least one member; a member is `[kind, layer, position, feature]` with a node kind
   and three integers, and is a node of the stored graph.
4. No node belongs to two supernodes (supernodes.supernode_adjacency refuses that too).
5. Supernodes read from a shared link (graph/shared_view.py), for `attrgraph import-view` and the
   page's import: `storable` leaves out the members that are not nodes of the graph (and a
   supernode left without any), then applies steps 3 and 4, so that what is stored is what the
   page can save again.
"""

from __future__ import annotations

import json

from attrgraph.errors import SupernodeError
from attrgraph.graph.graph import NODE_ORDER, Graph
from attrgraph.graph.supernodes import NodeKey, Supernode, node_key

MAX_BODY = 1 << 20
"""Largest request body read, in bytes."""
MAX_SUPERNODES = 1000
MAX_NAME = 200


def read_json(body: bytes, error: type[Exception], shape: str):
    """Step 1: the JSON value of a body of at most `MAX_BODY` bytes, or `error` naming `shape`."""
    if len(body) > MAX_BODY:
        raise error(f"the request has {len(body)} bytes; send at most {MAX_BODY}.")
    try:
        return json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise error(f"the request body is not JSON ({e}); send {shape}.") from None
    except RecursionError:
        raise error(f"the request body nests too deeply to be read; send {shape}.") from None


def plain_text(text: str) -> bool:
    """Whether `text` can be stored as it is: valid UTF-8 (no lone surrogate such as a JSON
    `\\ud800` gives) and no NUL (HDF5 strings end at one)."""
    if "\0" in text:
        return False
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def parse_request(body: bytes, graph_names: list[str]) -> tuple[str, list[Supernode]]:
    """(graph name, supernodes) of a request body (steps 1-3, but for membership in the graph)."""
    data = read_json(body, SupernodeError, "{'graph': ..., 'supernodes': [...]}")
    if not isinstance(data, dict) or set(data) != {"graph", "supernodes"}:
        raise SupernodeError(
            "the request must be a JSON object with exactly the keys 'graph' and 'supernodes'."
        )
    name, items = data["graph"], data["supernodes"]
    if not isinstance(name, str) or name not in graph_names:
        raise SupernodeError(f"graph {name!r} is not in this file; it holds {graph_names}.")
    return name, parse_supernodes(items)


def parse_supernodes(items) -> list[Supernode]:
    """Step 3 (but for membership in the graph): the request's `supernodes` list."""
    if not isinstance(items, list) or len(items) > MAX_SUPERNODES:
        raise SupernodeError(f"'supernodes' must be a list of at most {MAX_SUPERNODES} objects.")
    out, seen = [], set()
    for k, item in enumerate(items):
        if not isinstance(item, dict) or set(item) != {"name", "members"}:
            raise SupernodeError(
                f"supernode {k} must be an object with exactly the keys 'name' and 'members'."
            )
        sn_name, members = item["name"], item["members"]
        if not isinstance(sn_name, str) or not 1 <= len(sn_name.strip()) <= MAX_NAME:
            raise SupernodeError(f"supernode {k} needs a name of 1 to {MAX_NAME} characters.")
        if not plain_text(sn_name):
            raise SupernodeError(f"supernode {k}'s name holds a NUL or a lone surrogate; send plain text.")
        if sn_name in seen:
            raise SupernodeError(f"two supernodes are named {sn_name!r}; give each its own name.")
        seen.add(sn_name)
        if not isinstance(members, list) or not members:
            raise SupernodeError(f"supernode {sn_name!r} needs a non-empty list of members.")
        out.append(Supernode(sn_name, tuple(member_key(f"supernode {sn_name!r}", m) for m in members)))
    return out


def member_key(owner: str, m) -> NodeKey:
    """A node key as the page sends it, `[kind, layer, position, feature(, site)]`, or
    `SupernodeError` naming `owner` ("supernode 'x'", "pin 3")."""
    ok = (
        isinstance(m, list)
        and len(m) in (4, 5)
        and m[0] in NODE_ORDER
        and all(isinstance(v, int) and not isinstance(v, bool) for v in m[1:4])
        and (len(m) == 4 or m[4] in ("mlp", "attn"))
    )
    if not ok:
        raise SupernodeError(
            f"{owner} has member {m!r}; a member is [kind, layer, position, feature(, site)] "
            f"with kind one of {list(NODE_ORDER)}, three integers and site 'mlp' or 'attn'."
        )
    return NodeKey(*m)


def check_members(graph: Graph, supernodes: list[Supernode]) -> None:
    """Steps 3 and 4 against the stored graph."""
    keys = {node_key(graph, i) for i in range(graph.n_nodes)}
    owner: dict[NodeKey, str] = {}
    for sn in supernodes:
        for m in sn.members:
            if m not in keys:
                raise SupernodeError(f"supernode {sn.name!r} member {list(m)} is not a node of this graph.")
            if m in owner and owner[m] != sn.name:
                raise SupernodeError(
                    f"node {list(m)} is in supernodes {owner[m]!r} and {sn.name!r}; a node may belong to one."
                )
            owner[m] = sn.name


def storable(graph: Graph, supernodes) -> tuple[list[Supernode], list[NodeKey], list[str]]:
    """Step 5: (the supernodes to store, the members left out, the names left without members)."""
    present = {node_key(graph, i) for i in range(graph.n_nodes)}
    kept, left_out, emptied = [], [], []
    for sn in supernodes:
        if len(sn.name.strip()) > MAX_NAME or not plain_text(sn.name):
            raise SupernodeError(
                f"the supernode name {sn.name[:40]!r}... is longer than {MAX_NAME} characters or holds a "
                "NUL or a lone surrogate; rename it."
            )
        members = tuple(m for m in sn.members if m in present)
        left_out += [m for m in sn.members if m not in present]
        if members:
            kept.append(Supernode(sn.name, members))
        else:
            emptied.append(sn.name)
    check_members(graph, kept)
    return kept, left_out, emptied

"""A view of a graph shared as a link: the supernodes, pinned nodes and labels of a Neuronpedia
graph URL (or of a graph JSON's `qParams`), read against a `Graph` so that they can be stored
beside it, drawn by `attrgraph serve`, exported again, and ablated or steered with `intervene`.

Seed: Neuronpedia's graph page, `apps/webapp/app/[modelId]/graph/page.tsx` (the query keys `slug`,
`pinnedIds`, `supernodes`, `clerps`, `pruningThreshold`, `densityThreshold`, `subgraph`) and
`utils.ts` (a clerp is keyed by the node's `featureId`, `{layer}_{feature}_{ctx_idx}`);
circuit-tracer's `utils/decode_url_features.py` (what its demos take from such a URL) and
`frontend/graph_models.py` (node ids).

1. Source: a URL (`https://www.neuronpedia.org/<model>/graph?slug=...&pinnedIds=...`), its query
   string, or a mapping of the same keys (a graph JSON's `qParams`, where `pinnedIds` is a list and
   `supernodes` a list of lists). The query is split as the page's `URLSearchParams` splits it
   (`parse_qs`: `+` is a space, percent escapes decoded once); a value that is still
   percent-encoded JSON (a link encoded twice) is decoded once more.
2. Node ids, as the page and circuit-tracer's frontend name nodes:
     feature    `{layer}_{feature}_{pos}`        attention SAE feature  `A{layer}_{feature}_{pos}`
     embedding  `E_{token}_{pos}`
     error      `{layer}_-1_{pos}` (attrgraph's export), `0_{layer}_{pos}` (circuit-tracer's)
     logit      `{n_layers + 1}_{token}_{pos}`
   Each id is looked up under every name the graph's nodes have (neuronpedia.py's ids, and
   circuit-tracer's error ids). `0_{a}_{p}` names both feature `a` of layer 0 and the error of
   layer `a`: it is the feature when the graph holds it, else the error when the graph holds that,
   else the feature (as `decode_url_features` reads every such id).
3. An id the graph lacks (a node pruned away here, or a graph built with other options) is kept as
   the key it names, since `intervene` acts on keys, not on a graph's nodes, and is listed in
   `SharedView.absent`. An embedding id whose token is not the graph's token at that position
   means the URL shows another prompt: refused, as is a URL none of whose ids is in the graph.
4. clerps, `[[featureId, label], ...]`: `featureId` is `{layer}_{feature}_{pos}` with the node's
   JSON `feature`: the Cantor pairing of (layer, index) in schema 1 (circuit-tracer and attrgraph,
   attention features offset by `ATTN_INDEX_OFFSET`), `{layer}{index:05d}` in Neuronpedia's
   schema-0 gemma-2-2b graphs; the reading whose layer agrees is taken. Clerps of embeddings,
   errors and logits (labels the page makes itself) are skipped.
5. Supernode names repeated in a URL get circuit-tracer's counter: `name`, `name (2)`, ...

Writing (`view_link`), the inverse, so that a grouping made here (by hand, or by
`suggest_supernodes`) opens on Neuronpedia's page of the same graph:
6. Members and pins named by step 2's ids: a node of the graph by its export id (errors in
   attrgraph's form, or circuit-tracer's `0_{layer}_{pos}` with `error_ids="circuit-tracer"` for a
   graph Neuronpedia built itself), a feature the graph lacks by `{layer}_{feature}_{pos}`; labels
   `{(layer, feature): text}` become one clerp per node of that feature, keyed by schema 1's
   `featureId`. The query holds `slug`, `pinnedIds` (the pins, then every supernode member, as our
   export pins them), `supernodes`, `clerps` and `pruningThreshold` when given.
"""

from __future__ import annotations

import json
import math
import re
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from attrgraph.errors import SupernodeError, ViewError
from attrgraph.graph.graph import Graph, check_graph
from attrgraph.graph.neuronpedia import node_ids
from attrgraph.graph.neuronpedia_features import ATTN_INDEX_OFFSET, feature_index
from attrgraph.graph.supernodes import NodeKey, Supernode, node_key, supernode_list
from transcoders.arguments import check_real, shown

_ID = re.compile(r"(A?)(-?\d+)_(-?\d+)_(\d+)|E_(\d+)_(\d+)")
_SCHEMA0 = 10**5  # Neuronpedia's schema-0 gemma-2-2b feature number: layer, then a 5-digit index


@dataclass(frozen=True, eq=False)
class SharedView:
    """What `read_view` found: keys of the graph's nodes (`supernodes.NodeKey`)."""

    supernodes: tuple[Supernode, ...]
    """The URL's supernodes, in its order (names made unique, step 5)."""
    pinned: tuple[NodeKey, ...]
    """Keys of the pinned nodes (`pinnedIds`), in the URL's order."""
    pinned_nodes: np.ndarray
    """Indices, into the graph read against, of the pinned nodes it holds."""
    labels: dict[NodeKey, str] = field(default_factory=dict)
    """The URL's feature labels (`clerps`), by the key of the feature they label."""
    absent: tuple[str, ...] = ()
    """Ids the URL names that the graph lacks (kept as keys, step 3)."""
    model: str | None = None
    """The page's model id (`gemma-2-2b` in `.../gemma-2-2b/graph?...`), if a URL was read."""
    slug: str | None = None
    node_threshold: float | None = None
    """The page's pruning slider (`pruningThreshold`), a node threshold."""
    density_threshold: float | None = None
    """The page's `densityThreshold`, as given."""


def _query(source) -> tuple[dict, str | None]:
    """The source's keys (step 1) and the model id of a URL's path."""
    if isinstance(source, Mapping):
        return dict(source), None
    if not isinstance(source, str):
        raise ViewError(
            f"read_view takes a graph URL, its query string or a qParams mapping, got a {type(source).__name__}."
        )
    text = source.strip()
    try:
        parts = urllib.parse.urlsplit(text)
    except ValueError as e:  # "Invalid IPv6 URL": a '[' or ']' in the host
        raise ViewError(f"the link is not a URL ({e}: {text[:80]!r}); copy the whole link again.") from None
    query = parts.query if parts.scheme or parts.netloc or "?" in text else text.lstrip("?")
    if not query and "#" in text:  # a local frontend keeps its state after the '#'
        query = parts.fragment
    values = {k: v[-1] for k, v in urllib.parse.parse_qs(query, keep_blank_values=True).items()}
    path = [p for p in parts.path.split("/") if p]
    model = path[-2] if len(path) >= 2 and path[-1] == "graph" else None
    return values, model


def _json_list(values: dict, key: str) -> list:
    raw = values.get(key)
    if raw is None or raw == "":
        return []
    if isinstance(raw, str):
        text = raw.strip()
        if text.startswith("%5B") or text.startswith("%5b"):  # encoded twice
            text = urllib.parse.unquote(text)
        try:
            raw = json.loads(text)
        except ValueError:
            raise ViewError(f"{key} is not JSON ({raw[:80]!r}); copy the whole link again.") from None
    if not isinstance(raw, list) or not all(
        isinstance(x, list) and x and all(isinstance(s, str) for s in x) for x in raw
    ):
        raise ViewError(
            f"{key} must be a list of lists of strings (Neuronpedia's form), got {str(raw)[:80]}."
        )
    return raw


def _pinned_ids(values: dict) -> list[str]:
    raw = values.get("pinnedIds")
    if raw is None or raw == "":
        return []
    if isinstance(raw, str):
        if "%" in raw:  # encoded twice: node ids hold no '%'
            raw = urllib.parse.unquote(raw)
        return [p for p in (s.strip() for s in raw.split(",")) if p]
    if isinstance(raw, list) and all(isinstance(p, str) for p in raw):
        return list(raw)
    raise ViewError(f"pinnedIds must be a comma-separated string or a list of node ids, got {str(raw)[:80]}.")


def _number(values: dict, key: str) -> float | None:
    raw = values.get(key)
    if raw is None or raw == "":
        return None
    try:
        x = float(raw)
    except (TypeError, ValueError):
        x = math.nan
    if not math.isfinite(x):
        raise ViewError(f"{key} is {raw!r}; the link's slider values are numbers.")
    return x


class _Resolver:
    """Node ids -> keys of one graph's nodes (steps 2 and 3)."""

    def __init__(self, graph: Graph):
        n = graph.nodes
        self.graph = graph
        logit_layers = n.layer[n.kind == "logit"]  # n_layers, or a hook's layer for a direction target
        recorded = graph.meta.get("n_layers")
        self.n_layers = int(recorded) if recorded else int(logit_layers.max(initial=0))
        self.n_pos = len(graph.prompt_tokens)
        self.index: dict[str, int] = {}
        for i, node_id in enumerate(node_ids(graph)):
            self.index[node_id] = i
            # custom targets that share a token get a suffix there; the bare id names the first
            if n.kind[i] == "logit":
                self.index.setdefault(f"{int(n.layer[i]) + 1}_{int(n.token[i])}_{int(n.position[i])}", i)
        for i in np.flatnonzero((n.kind == "error") & (n.site != "attn")):
            self.index.setdefault(f"0_{int(n.layer[i])}_{int(n.position[i])}", i)  # circuit-tracer's id
        self.absent: list[str] = []

    def key(self, node_id: str) -> tuple[NodeKey, int | None]:
        """The key `node_id` names and its node index (None when the graph lacks it)."""
        if not isinstance(node_id, str):
            raise ViewError(
                f"node id {node_id!r} is not a string; the link names nodes as '{{layer}}_{{feature}}_{{pos}}'."
            )
        if node_id in self.index:
            i = self.index[node_id]
            return node_key(self.graph, i), i
        m = _ID.fullmatch(node_id)
        if m is None:
            raise ViewError(
                f"node id {node_id!r} is none of Neuronpedia's forms ('{{layer}}_{{feature}}_{{pos}}', "
                "'E_{token}_{pos}', '{n_layers + 1}_{token}_{pos}'); copy the link again."
            )
        if m.group(5) is not None:
            token, pos = int(m.group(5)), self._position(int(m.group(6)), node_id)
            if int(self.graph.prompt_ids[pos]) in (token, -1):  # pruned away (or a JSON without it)
                self.absent.append(node_id)
                return NodeKey("embedding", -1, pos, -1), None
            raise ViewError(
                f"the link's node {node_id} is token {token} at position {pos}, but the graph's prompt has "
                f"token {int(self.graph.prompt_ids[pos])} there: the link shows another prompt; read it "
                "against the graph of that prompt."
            )
        attn, a, b = bool(m.group(1)), int(m.group(2)), int(m.group(3))
        pos = self._position(int(m.group(4)), node_id)
        site = "attn" if attn else "mlp"
        if not attn and a == self.n_layers + 1:
            key = NodeKey("logit", self.n_layers, pos, -1)
        elif b == -1:
            key = NodeKey("error", self._layer(a, node_id), pos, -1, site)
        else:
            if b < 0:
                raise ViewError(f"node id {node_id!r} names feature {b}; feature indices are 0 or more.")
            key = NodeKey("feature", self._layer(a, node_id), pos, b, site)
        self.absent.append(node_id)
        return key, None

    def _layer(self, layer: int, node_id: str) -> int:
        if not 0 <= layer < self.n_layers:
            raise ViewError(
                f"node id {node_id!r} names layer {layer}, but the graph's model has {self.n_layers} layers "
                f"(its logits are layer {self.n_layers + 1} in the link): the link shows another model."
            )
        return layer

    def _position(self, pos: int, node_id: str) -> int:
        if not pos < self.n_pos:
            raise ViewError(
                f"node id {node_id!r} sits at position {pos}, past the graph's {self.n_pos} prompt tokens: "
                "the link shows another prompt."
            )
        return pos


def _feature_of_clerp(feature_id: str, resolver: _Resolver) -> NodeKey | None:
    """The feature a clerp's `featureId` labels (step 4); None for a clerp of another node."""
    parts = feature_id.split("_")
    if len(parts) != 3 or not all(re.fullmatch(r"-?\d+", p) for p in parts):
        return None  # embeddings ('E_...'), errors ('..._mlp__err_idx_N')
    layer, value, pos = (int(p) for p in parts)
    if value < 0 or layer == resolver.n_layers + 1:
        return None  # an error's or a logit's
    site = "mlp"
    if value >= ATTN_INDEX_OFFSET:
        site, value = "attn", value - ATTN_INDEX_OFFSET
    w = (math.isqrt(8 * value + 1) - 1) // 2
    index = value - w * (w + 1) // 2
    if w - index != layer:
        if value // _SCHEMA0 != layer:
            raise ViewError(
                f"clerp {feature_id!r} names feature number {value}, which is no feature of layer {layer} "
                "(neither the Cantor pairing of schema 1 nor schema 0's layer-and-index); copy the link again."
            )
        index = value % _SCHEMA0
    return NodeKey(
        "feature", resolver._layer(layer, feature_id), resolver._position(pos, feature_id), index, site
    )


def _unique_names(names: list[str]) -> list[str]:
    """Step 5 (a counted name that is also given, 'a (2)' beside two 'a', counts on past it)."""
    count: dict[str, int] = {}
    used: set[str] = set()
    out = []
    for name in names:
        k = count.get(name, 0) + 1
        unique = name if k == 1 else f"{name} ({k})"
        while unique in used:
            k += 1
            unique = f"{name} ({k})"
        count[name] = k
        used.add(unique)
        out.append(unique)
    return out


def read_view(source: str | Mapping, graph: Graph) -> SharedView:
    """The supernodes, pinned nodes and labels of a shared link (a Neuronpedia graph URL, its query
    string, or a graph JSON's `qParams`), as keys of `graph`'s nodes (module docstring).

    Store the supernodes beside the graph with `save_supernodes(path, view.supernodes, name)` (the
    viewer and `attrgraph export` then show them), or intervene on them:
    `intervene(model, tc, prompt, {sn: 0.0 for sn in view.supernodes})`."""
    check_graph(graph, "read_view")
    values, model = _query(source)
    if values.get("subgraph") and not any(values.get(k) for k in ("pinnedIds", "supernodes")):
        raise ViewError(
            f"the link names a subgraph saved on Neuronpedia (subgraph={values['subgraph']}), whose nodes "
            "are kept on its server, not in the link; pass a link that holds pinnedIds or supernodes."
        )
    pinned_ids = _pinned_ids(values)
    groups = _json_list(values, "supernodes")
    clerps = _json_list(values, "clerps")
    node_threshold = _number(values, "pruningThreshold")
    density_threshold = _number(values, "densityThreshold")
    if not (pinned_ids or groups or clerps):
        raise ViewError(
            "the link holds no pinnedIds, supernodes or clerps, so there is nothing to read; copy it from "
            "the graph page after pinning or grouping nodes."
        )
    resolver = _Resolver(graph)
    pinned, pinned_nodes = [], []
    for node_id in pinned_ids:
        key, i = resolver.key(node_id)
        pinned.append(key)
        if i is not None:
            pinned_nodes.append(i)
    supernodes = []
    for name, group in zip(_unique_names([g[0] for g in groups]), groups):
        members = [resolver.key(node_id)[0] for node_id in group[1:]]
        try:
            supernodes.append(Supernode(name, tuple(dict.fromkeys(members))))
        except SupernodeError as e:
            raise ViewError(f"the link's supernode {name!r}: {e}") from None
    labels = {}
    for pair in clerps:
        if len(pair) != 2:
            raise ViewError(f"a clerp is [featureId, label], got {pair!r}.")
        key = _feature_of_clerp(pair[0], resolver)
        if key is not None:
            labels[key] = pair[1]
    n_ids = len(pinned_ids) + sum(len(g) - 1 for g in groups)
    if n_ids and len(resolver.absent) == n_ids:
        raise ViewError(
            f"none of the {n_ids} nodes the link names is in this graph: it shows another prompt or "
            "transcoder set, or a graph pruned further; read it against the graph it was made from."
        )
    return SharedView(
        supernodes=tuple(supernodes),
        pinned=tuple(pinned),
        pinned_nodes=np.array(pinned_nodes, np.int64),
        labels=labels,
        absent=tuple(dict.fromkeys(resolver.absent)),
        model=model,
        slug=values.get("slug") or None,
        node_threshold=node_threshold,
        density_threshold=density_threshold,
    )


# ------------------------------------------------------------------------------------ write
ERROR_IDS = ("attrgraph", "circuit-tracer")
"""The two ways of naming an error node in a link (step 6)."""


def _link_id(ids: list[str], index: dict, key: NodeKey, error_ids: str) -> str:
    i = index.get(tuple(key))
    if key.kind == "error" and key.site != "attn" and error_ids == "circuit-tracer":
        return f"0_{key.layer}_{key.position}"
    if i is not None:
        return ids[i]
    if key.kind == "feature" and key.position is not None:
        return f"{'A' if key.site == 'attn' else ''}{key.layer}_{key.feature}_{key.position}"
    raise ViewError(
        f"node {tuple(key)} is not in the graph, and only a feature can be named without it; "
        "drop it or pass the graph that holds it."
    )


def view_link(
    graph: Graph,
    supernodes=(),
    pinned=(),
    labels: Mapping | None = None,
    *,
    model: str,
    slug: str,
    error_ids: str = "attrgraph",
    node_threshold: float | None = None,
    base: str = "https://www.neuronpedia.org",
) -> str:
    """A Neuronpedia graph link showing `supernodes` (a sequence of `Supernode`), `pinned` (node
    indices of `graph`) and `labels` (`{(layer, feature): text}`) on the page of graph `slug` of
    `model` there (step 6; `read_view` reads it back)."""
    check_graph(graph, "view_link")
    if error_ids not in ERROR_IDS:
        raise ViewError(f"error_ids is {error_ids!r}; pass one of {ERROR_IDS}.")
    for what, value in (("model", model), ("slug", slug)):
        if not isinstance(value, str) or not value.strip():
            raise ViewError(
                f"{what} is {shown(value)}; pass the Neuronpedia {what} of the graph the link opens."
            )
    supernodes = supernode_list(supernodes)
    ids = node_ids(graph)
    index = {tuple(node_key(graph, i)): i for i in range(graph.n_nodes)}
    n = graph.nodes
    pinned = () if pinned is None else pinned
    if isinstance(pinned, str | bytes | Mapping) or not hasattr(pinned, "__iter__"):
        raise ViewError(
            f"pinned is a {type(pinned).__name__} ({shown(pinned)}); pass a list of node indices."
        )
    if not isinstance(base, str) or not base.startswith(("http://", "https://")):
        raise ViewError(
            f"base is {shown(base)}; pass Neuronpedia's address, such as 'https://www.neuronpedia.org'."
        )
    if node_threshold is not None:
        check_real(node_threshold, "node_threshold", ViewError, 0.0, 1.0)
    if labels is not None and not isinstance(labels, Mapping):
        raise ViewError(
            f"labels is a {type(labels).__name__} ({shown(labels)}); pass a dict from (layer, feature) to a label."
        )
    pins = []
    for i in pinned:
        if isinstance(i, bool) or not isinstance(i, int | np.integer) or not 0 <= int(i) < graph.n_nodes:
            raise ViewError(f"pinned node {i!r} is not a node index of this graph (0..{graph.n_nodes - 1}).")
        pins.append(_link_id(ids, index, node_key(graph, int(i)), error_ids))
    groups = [[sn.name, *(_link_id(ids, index, m, error_ids) for m in sn.members)] for sn in supernodes]
    clerps = []
    for where, text in (labels or {}).items():
        if not (
            isinstance(where, tuple)
            and len(where) == 2
            and all(isinstance(x, int | np.integer) for x in where)
        ):
            raise ViewError(f"label key {where!r} is not a (layer, feature) pair.")
        layer, feature = (int(x) for x in where)
        at = np.flatnonzero(
            (n.kind == "feature") & (n.layer == layer) & (n.feature == feature) & (n.site != "attn")
        )
        clerps += [[f"{layer}_{feature_index(layer, feature)}_{int(n.position[i])}", str(text)] for i in at]
    query = {"slug": slug}
    if pins or groups:
        query["pinnedIds"] = ",".join(dict.fromkeys(pins + [m for g in groups for m in g[1:]]))
    if groups:
        query["supernodes"] = json.dumps(groups, separators=(",", ":"))
    if clerps:
        query["clerps"] = json.dumps(clerps, separators=(",", ":"))
    if node_threshold is not None:
        query["pruningThreshold"] = repr(float(node_threshold))
    path = f"{base.rstrip('/')}/{urllib.parse.quote(model, safe='')}/graph"
    return path + "?" + urllib.parse.urlencode(query, quote_via=urllib.parse.quote)

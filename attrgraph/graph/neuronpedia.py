"""The graph JSON of circuit-tracer's local frontend and Neuronpedia: export, and load back.

Seed: circuit-tracer's `frontend/graph_models.py` (the graph file), `frontend/feature_models.py`
(one file per feature), `utils/create_graph_files.py` and `frontend/local_server.py` (what it
writes and serves); Neuronpedia's graph schema (the same file, extra keys allowed).

1. Nodes, one per graph node, with circuit-tracer's ids (`ctx_idx` = position):
     embedding  node_id `E_{token}_{pos}`, layer "E", feature = pos, jsNodeId `E_{token}-{pos}`
     error      node_id `{layer}_-1_{pos}`, feature -1, "mlp reconstruction error"
     feature    node_id `{layer}_{feature}_{pos}`, feature = cantor(layer, feature),
                "cross layer transcoder" (circuit-tracer's name for every transcoder feature)
     logit      node_id `{layer + 1}_{token}_{pos}` (layer "n_layers + 1"), feature = token,
                token_prob, is_target_logit on the most probable, clerp `Output "tok" (p=0.123)`
   attention-output SAE features and attention errors (site "attn", linear-computation-graphs
   section 2) have their own feature_types, "attention sae" and "attention reconstruction
   error", ids `A{layer}_{feature}_{pos}` and `A{layer}_-1_{pos}`, and feature index
   `ATTN_INDEX_OFFSET + cantor(layer, feature)` (so their feature files never collide with MLP
   features'); clerp default `A{layer}/F{feature}`, label key `("attn", layer, feature)`.
   `activation` is the Graph's. `influence` is circuit-tracer's cumulative share
   (prune.influence_shares): nodes sorted by logit influence (the numbers prune_graph prunes by),
   descending; a node's value is the running sum up to it over the total, so the frontend's
   slider at `t` keeps the nodes that make up `t`. For a pruned graph these are the shares in
   the unpruned graph, as circuit-tracer writes them: those prune_graph stored
   (`nodes.unpruned_share`), or, for a graph pruned here, those of the graph pruned.
   A feature or error node without a link is not exported (circuit-tracer's
   `create_used_nodes_and_edges`); embeddings and logits always are.
2. Links: one per nonzero `adjacency[t, s]`: `{"source": id(s), "target": id(t), "weight":
   adjacency[t, s]}`, the signed direct effect of source on target (float32, shortest repr).
3. `clerp` of a feature, the first there is of: `labels[(layer, feature)]` (passed in), the
   user's label in the dashboards, the name of its supernode, the dashboards' automatic label,
   `L{layer}/F{feature}` (for attention features: the attention set's dashboards, keys
   `("attn", layer, feature)`, `A{layer}/F{feature}`). Supernodes go to `qParams.supernodes` as `[name, *member node_ids]`
   (members the graph lacks are dropped); their members and the logits are pinned.
4. metadata: slug, scan, prompt_tokens, prompt, node_threshold (the frontend's slider default:
   the node threshold the graph was pruned with), pruning_settings (`node_threshold`,
   `edge_threshold`, `prune_rule`, and `influence`: "unpruned graph", or "pruned graph" for a graph
   pruned before the unpruned shares were stored),
   generation_settings (the Graph's plain `meta`), info.generator; with `feature_url` (the URL
   the folder will be served from), `feature_details.feature_json_base_url` =
   `{feature_url}/features/<set>`, where Neuronpedia fetches `{base}/{index}.json` (Neuronpedia's
   graph schema; circuit-tracer's own frontend reads the scan instead and ignores the key).
5. Folder, as circuit-tracer's `local_server.serve(data_dir=DIR)` reads it (both `/data/X` and
   `/graph_data/X` are `DIR/X`):
     DIR/graph-metadata.json          `{"graphs": [metadata, ...]}`, entries replaced by slug
     DIR/<slug>.json                  the graph
     DIR/features/<set>/<index>.json  one per feature, index = cantor(layer, feature); the
                                      default scan `./data/features/<set>` makes the frontend
                                      read them from DIR instead of the internet.
   Feature files are filled from the dashboards of the graph's transcoder set, attention
   features' from its attention set's (examples with per-token activations, logits, histogram,
   percentiles, frequency: neuronpedia_features.py, found by dashboard_lookup.py); without
   dashboards they carry what the graph knows, and one ExportWarning line per set says so.
6. `load_json` reads nodes by feature_type, layer, ctx_idx and ids (old `0_{layer}_{pos}` error
   ids too), sorts them into `NODE_ORDER` (and the graph.py order of sites) and rebuilds the
   adjacency from the links; influence is recomputed (logit_influence), since the file holds
   only cumulative shares. A feature whose node_id is not `{layer}_{feature}_{pos}` (Neuronpedia
   ids of other generators) takes its index from `feature` (inverse Cantor pairing). A file with
   `pruning_settings` (our export of a pruned graph) reads as that pruned graph: meta `pruned`,
   thresholds, rule, and the file's shares as `unpruned_share`, so exporting it again writes the
   same nodes, influence and slider and pruning it again is refused.
"""

from __future__ import annotations

import contextlib
import gzip
import importlib.metadata
import json
import math
import os
import re
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import scipy.sparse as sp

from attrgraph.errors import ExportError, GraphError, GraphFileError
from attrgraph.graph.graph import NODE_ORDER, Graph, Nodes, check_graph
from attrgraph.graph.neuronpedia_features import (
    ATTN_INDEX_OFFSET,
    dashboard_labels,
    export_dashboards,
    feature_files,
    feature_index,
)
from attrgraph.graph.prune import DEFAULT_RULE, check_rule, influence_shares, prune_graph
from attrgraph.graph.streamed_influence import logit_influence
from attrgraph.graph.supernodes import Supernode, node_key, supernode_list
from transcoders import h5file
from transcoders.arguments import as_path, check_real, is_numbers, shown
from transcoders.output_folder import check_output_folder

if TYPE_CHECKING:
    from transcoders.dashboard_file import Dashboards

SCHEMA_VERSION = 1
"""circuit-tracer's `Metadata.schema_version` for this file layout."""
FEATURE_TYPES = {
    "embedding": "embedding",
    "error": "mlp reconstruction error",
    "feature": "cross layer transcoder",
    "logit": "logit",
}
"""Our node kind -> circuit-tracer's `feature_type`."""
ATTN_FEATURE_TYPES = {"error": "attention reconstruction error", "feature": "attention sae"}
"""Our node kind -> `feature_type` of attention (site "attn") nodes (step 1)."""
_SLUG = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_LOGIT_CLERP = re.compile(r'^Output "(.*)" \(p=[^)]*\)$', re.S)


class JsonExport(NamedTuple):
    """What `export_json` wrote."""

    path: Path
    """The graph file, `DIR/<slug>.json`."""
    n_nodes: int
    n_links: int
    n_feature_files: int
    n_dropped_members: int
    """Supernode members the exported graph lacks (pruned away), left out of `qParams`."""
    dashboards: Path | None = None
    """The dashboards file the feature files were filled from (None: no examples in them)."""
    attn_dashboards: Path | None = None
    """The same for the attention features' files."""


def _uncantor(z: int) -> tuple[int, int]:
    w = (math.isqrt(8 * z + 1) - 1) // 2
    y = z - w * (w + 1) // 2
    return w - y, y


def cumulative_influence(graph: Graph) -> np.ndarray:
    """[n_nodes] circuit-tracer's node `influence` computed on `graph` itself: running share of the
    sorted logit influence (step 1)."""
    return influence_shares(logit_influence(graph.adjacency, graph.logit_weights()).influence)


def linked(graph: Graph, share: np.ndarray | None = None) -> tuple[Graph, np.ndarray | None]:
    """`graph` without its feature and error nodes that have no link (step 1), and `share` on the
    nodes left."""
    A = graph.adjacency
    nz = A.data != 0
    has = np.zeros(graph.n_nodes, bool)
    has[A.indices[nz]] = True
    has[np.repeat(np.arange(graph.n_nodes), np.diff(A.indptr))[nz]] = True
    keep = has | np.isin(graph.nodes.kind, ("embedding", "logit"))
    if keep.all():
        return graph, share
    return graph.subgraph(keep), None if share is None else np.asarray(share)[keep]


def node_ids(graph: Graph) -> list[str]:
    """Each node's `node_id` in the export (step 1; a repeated id gets its index as a suffix)."""
    n, used, ids = graph.nodes, set(), []
    for i in range(graph.n_nodes):
        kind, layer, pos = n.kind[i], int(n.layer[i]), int(n.position[i])
        prefix = "A" if n.site[i] == "attn" else ""
        node_id = (
            prefix
            + {
                "embedding": f"E_{int(n.token[i])}_{pos}",
                "error": f"{layer}_-1_{pos}",
                "feature": f"{layer}_{int(n.feature[i])}_{pos}",
                "logit": f"{layer + 1}_{int(n.token[i])}_{pos}",
            }[kind]
        )
        if node_id in used:  # custom targets may share a token; ids must stay unique
            node_id = f"{node_id}_{i}"
        used.add(node_id)
        ids.append(node_id)
    return ids


def _short(x: np.ndarray) -> list[float]:
    """float32 values as the shortest decimals that read back to the same float32."""
    return [float(s) for s in np.asarray(x, np.float32).astype(str)]


def _prompt(graph: Graph) -> str:
    if isinstance(graph.meta.get("prompt"), str):
        return graph.meta["prompt"]
    tokens = list(graph.prompt_tokens)
    if tokens and re.fullmatch(r"<[^<>\s]+>", tokens[0]):  # a BOS such as <bos> is not prompt text
        tokens = tokens[1:]
    spaced = any(t[:1].isspace() for t in tokens[1:])  # BPE tokens carry their spaces, words do not
    return ("" if spaced else " ").join(tokens)


def _transcoder_set(graph: Graph) -> str:
    name = Path(str(graph.meta.get("transcoders", "transcoders")).rstrip("/\\")).name
    return re.sub(r"[^A-Za-z0-9._-]+", "-", name).strip("-.") or "transcoders"


def _plain(meta: dict) -> dict:
    return {k: v for k, v in meta.items() if isinstance(v, (str, int, float, bool)) and v == v}


def graph_to_json(
    graph: Graph,
    slug: str = "graph",
    scan: str | None = None,
    supernodes: Sequence[Supernode] = (),
    labels: Mapping[tuple[int, int], str] | None = None,
    influence: np.ndarray | None = None,
    node_threshold: float | None = None,
    auto_labels: Mapping[tuple[int, int], str] | None = None,
    feature_url: str | None = None,
) -> tuple[dict, int]:
    """The graph JSON (steps 1-4) and the number of supernode members left out.

    `influence`: cumulative shares per node (default: `cumulative_influence(graph)`);
    `node_threshold`: the viewer's pruning default (metadata.node_threshold); `auto_labels`:
    clerps below supernode names (step 3); `feature_url`: where the export folder will be served
    (metadata.feature_details, step 4)."""
    check_graph(graph, "graph_to_json")
    _check_slug(slug)
    supernodes = _check_options(scan, supernodes, labels, feature_url, node_threshold, auto_labels)
    if influence is not None:
        influence = np.asarray(influence, np.float64) if is_numbers(influence) else None
        if influence is None or influence.shape != (graph.n_nodes,):
            raise ExportError(
                f"influence must be {graph.n_nodes} numbers, one per node (cumulative_influence(graph)); pass "
                "those of this graph or None."
            )
    share = cumulative_influence(graph) if influence is None else influence
    graph, share = linked(graph, share)
    n = graph.nodes
    ids = node_ids(graph)
    activation = _short(n.activation)
    group = {}
    for sn in supernodes:
        for m in sn.members:
            group.setdefault(tuple(m), sn.name)
    labels, auto_labels = labels or {}, auto_labels or {}
    logit_rank = np.cumsum(n.kind == "logit") - 1
    nodes = []
    for i in range(graph.n_nodes):
        kind, layer, pos, feat = str(n.kind[i]), int(n.layer[i]), int(n.position[i]), int(n.feature[i])
        attn = n.site[i] == "attn"
        node = {
            "node_id": ids[i],
            "feature": {"embedding": pos, "error": -1, "feature": feature_index(layer, feat, attn)}.get(
                kind, int(n.token[i])
            ),
            "layer": "E" if kind == "embedding" else str(layer + 1 if kind == "logit" else layer),
            "ctx_idx": pos,
            "feature_type": (ATTN_FEATURE_TYPES if attn else FEATURE_TYPES)[kind],
            "token_prob": 0.0,
            "is_target_logit": False,
            "run_idx": 0,
            "reverse_ctx_idx": 0,
            "jsNodeId": ("A" if attn else "")
            + {
                "embedding": f"E_{int(n.token[i])}-{pos}",
                "error": f"{layer}_-1-{pos}",
                "feature": f"{layer}_{feat}-0",
            }.get(kind, f"L_{int(n.token[i])}-{pos}"),
            "clerp": "",
            "influence": float(share[i]),
            "activation": None if np.isnan(activation[i]) else activation[i],
        }
        if kind == "feature" and attn:
            node["clerp"] = (
                labels.get(("attn", layer, feat))
                or group.get(tuple(node_key(graph, i)))
                or auto_labels.get(("attn", layer, feat))
                or f"A{layer}/F{feat}"
            )
        elif kind == "feature":
            node["clerp"] = (
                labels.get((layer, feat))
                or group.get(tuple(node_key(graph, i)))
                or auto_labels.get((layer, feat))
                or f"L{layer}/F{feat}"
            )
        elif kind == "logit":
            k = int(logit_rank[i])
            p = float(graph.logit_probs[k])
            node.update(
                token_prob=p, is_target_logit=k == 0, clerp=f'Output "{graph.logit_strings[k]}" (p={p:.3f})'
            )
        nodes.append(node)
    adj = sp.coo_array(graph.adjacency)
    keep = adj.data != 0
    links = [
        {"source": ids[s], "target": ids[t], "weight": w}
        for t, s, w in zip(adj.row[keep].tolist(), adj.col[keep].tolist(), _short(adj.data[keep]))
    ]
    index = {tuple(node_key(graph, i)): ids[i] for i in range(graph.n_nodes)}
    sn_json, dropped = [], 0
    for sn in supernodes:
        members = [index[tuple(m)] for m in sn.members if tuple(m) in index]
        dropped += len(sn.members) - len(members)
        if members:
            sn_json.append([sn.name, *members])
    pinned = [m for s in sn_json for m in s[1:]]
    if pinned:
        pinned += [ids[i] for i in np.flatnonzero(n.kind == "logit")]
    meta = graph.meta
    scan = scan or f"./data/features/{_transcoder_set(graph)}"
    metadata = {
        "slug": slug,
        "scan": scan,
        "transcoder_list": [],
        "prompt_tokens": list(graph.prompt_tokens),
        "prompt": _prompt(graph),
        "node_threshold": node_threshold,
        "schema_version": SCHEMA_VERSION,
        "info": {
            "generator": {"name": "attrgraph", "version": _version()},
            "create_time_ms": int(time.time() * 1000),
        },
        "generation_settings": _plain(meta),
    }
    if feature_url:
        base = f"{feature_url.rstrip('/')}/{_feature_dir(scan).as_posix()}"
        metadata["feature_details"] = {"feature_json_base_url": base}
    if meta.get("pruned") or node_threshold is not None:
        metadata["pruning_settings"] = {
            k: float(meta[k]) for k in ("node_threshold", "edge_threshold") if k in meta
        } | {
            "prune_rule": str(meta.get("prune_rule", "appendix")),
            "influence": "pruned graph" if influence is None else "unpruned graph",
        }
    q = {
        "pinnedIds": list(dict.fromkeys(pinned)),
        "supernodes": sn_json,
        "linkType": "both",
        "clickedId": "",
        "sg_pos": "",
    }
    return {"metadata": metadata, "qParams": q, "nodes": nodes, "links": links}, dropped


def _version() -> str:
    try:
        return importlib.metadata.version("attrgraph")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _check_slug(slug: str) -> None:
    if not isinstance(slug, str) or not _SLUG.fullmatch(slug):
        raise ExportError(
            f"slug {slug!r} is not a plain name; use letters, digits, '.', '_' and '-' (it names the file <slug>.json)."
        )


@contextlib.contextmanager
def _atomic(path: Path):
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            yield f
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _write_export(out: Path, graph_path: Path, data: dict, slug: str, files: dict) -> None:
    """Step 5's files: the graph JSON, its entry in the folder's index, and the feature files."""
    out.mkdir(parents=True, exist_ok=True)
    index_path = out / "graph-metadata.json"
    index = _read_index(index_path)
    with _atomic(graph_path) as f:
        json.dump(data, f, separators=(",", ":"))
    keys = ("slug", "scan", "transcoder_list", "prompt_tokens", "prompt", "node_threshold", "schema_version")
    entry = {k: data["metadata"][k] for k in keys}
    index["graphs"] = [g for g in index["graphs"] if g.get("slug") != slug] + [entry]
    with _atomic(index_path) as f:
        json.dump(index, f, indent=2)
    fdir = out / _feature_dir(data["metadata"]["scan"])
    fdir.mkdir(parents=True, exist_ok=True)
    for idx, feature in files.items():
        with _atomic(fdir / f"{idx}.json") as f:
            f.write(json.dumps(feature))


def export_json(
    graph: Graph,
    out_dir: str | os.PathLike,
    slug: str = "graph",
    scan: str | None = None,
    supernodes: Sequence[Supernode] = (),
    labels: Mapping[tuple[int, int], str] | None = None,
    node_threshold: float | None = None,
    edge_threshold: float | None = None,
    dashboards: str | os.PathLike | Dashboards | None = None,
    feature_url: str | None = None,
    attn_dashboards: str | os.PathLike | Dashboards | None = None,
    prune_rule: str | None = None,
) -> JsonExport:
    """Write `graph` into the folder `out_dir` as circuit-tracer's local frontend reads it (step 5).

    An unpruned graph with `node_threshold` / `edge_threshold` is pruned first (prune.prune_graph,
    1.0 for the one not given) by `prune_rule`, circuit-tracer's by default (what its
    `create_graph_files` does); without them it is exported as it is. A pruned graph (what
    `attrgraph build` stores) is exported as it is, with the thresholds, rule and unpruned
    influence it stored: the same file as exporting its unpruned graph with those thresholds;
    asking it for other thresholds or another rule raises `ExportError` (it is never pruned twice).
    `dashboards` (a path or a loaded `transcoders.Dashboards`; default: those of the graph's
    transcoder set, when there are some) fill the feature files and the clerps
    (neuronpedia_features.py), `attn_dashboards` (default: those of its attention set) its
    attention features'; `feature_url` is the URL the folder will be served from, for Neuronpedia
    (metadata.feature_details)."""
    check_graph(graph, "export_json")
    out = as_path(out_dir, "out_dir", ExportError)
    check_output_folder(out, ExportError)
    _check_slug(slug)
    supernodes = _check_options(scan, supernodes, labels, feature_url, None, None)
    graph, share, node_threshold = _pruned_for_export(graph, node_threshold, edge_threshold, prune_rule)
    graph, share = linked(graph, share)
    found = export_dashboards(graph, dashboards, attn_dashboards)
    user, auto = {}, {}
    for site, d in found.items():
        if d is not None:
            u, a = dashboard_labels(d, site)
            user.update(u)
            auto.update(a)
    labels = {**user, **(labels or {})}  # labels passed here first, then the user's in the dashboards
    data, dropped = graph_to_json(
        graph, slug, scan, supernodes, labels, share, node_threshold, auto, feature_url
    )
    graph_path = out / f"{slug}.json"
    files = feature_files(graph, _transcoder_set(graph), found["mlp"], found["attn"])
    try:  # each file written whole or not at all (`_atomic`); a full disk is one line
        _write_export(out, graph_path, data, slug, files)
    except OSError as e:
        raise h5file.write_error(Path(e.filename) if e.filename else out, e, ExportError) from None
    return JsonExport(
        graph_path,
        len(data["nodes"]),
        len(data["links"]),
        len(files),
        dropped,
        *(None if found[site] is None else found[site].path for site in ("mlp", "attn")),
    )


def _check_options(scan, supernodes, labels, feature_url, node_threshold, auto_labels) -> list[Supernode]:
    """`ExportError` (or `SupernodeError`) in one line for an option of graph_to_json / export_json
    of the wrong type; the supernodes as a list."""
    for what, value in (("scan", scan), ("feature_url", feature_url)):
        if value is not None and not isinstance(value, str):
            raise ExportError(f"{what} is a {type(value).__name__} ({shown(value)}); pass a str or None.")
    for what, value in (("labels", labels), ("auto_labels", auto_labels)):
        if value is not None and not isinstance(value, Mapping):
            raise ExportError(
                f"{what} is a {type(value).__name__} ({shown(value)}); pass a dict from (layer, feature) to "
                "a label, or None."
            )
    if node_threshold is not None:
        check_real(node_threshold, "node_threshold", ExportError, 0.0, 1.0)
    return supernode_list(supernodes)


def check_export_options(
    meta: dict, node_threshold: float | None, edge_threshold: float | None, prune_rule: str | None
) -> None:
    """Raise `ExportError` in one line when export_json would refuse these options for a graph
    with this `meta`: other thresholds or another rule for a pruned graph, a rule without
    thresholds for an unpruned one."""
    if prune_rule is not None:
        check_rule(prune_rule)
    if meta.get("pruned"):
        stored = {
            "node threshold": meta.get("node_threshold"),
            "edge threshold": meta.get("edge_threshold"),
            "rule": meta.get("prune_rule", "appendix"),  # graphs pruned before rules had names
        }
        asked = {"node threshold": node_threshold, "edge threshold": edge_threshold, "rule": prune_rule}
        differ = [k for k, v in asked.items() if v is not None and v != stored[k]]
        if differ:
            raise ExportError(
                f"this graph is already pruned ({stored['rule']} rule, node threshold {stored['node threshold']}, "
                f"edge threshold {stored['edge threshold']}), its {' and '.join(differ)} cannot change; "
                "export it without pruning options, or export the unpruned graph (`attrgraph build --full`)."
            )
    elif node_threshold is None and edge_threshold is None and prune_rule is not None:
        raise ExportError(f"prune rule {prune_rule} needs a node or edge threshold: this graph is unpruned.")


def _pruned_for_export(
    graph: Graph, node_threshold: float | None, edge_threshold: float | None, prune_rule: str | None
) -> tuple[Graph, np.ndarray | None, float | None]:
    """(the graph to export, its nodes' cumulative shares or None to compute them on it, the
    slider's node threshold): export_json's pruning rules."""
    meta = graph.meta
    check_export_options(meta, node_threshold, edge_threshold, prune_rule)
    if meta.get("pruned"):
        share = graph.nodes.unpruned_share
        nt = meta.get("node_threshold")
        return graph, None if np.isnan(share).any() else share, None if nt is None else float(nt)
    if node_threshold is None and edge_threshold is None:
        return graph, None, None
    nt = 1.0 if node_threshold is None else node_threshold
    et = 1.0 if edge_threshold is None else edge_threshold
    pruned = prune_graph(graph, nt, et, rule=prune_rule or DEFAULT_RULE)
    return pruned, pruned.nodes.unpruned_share, nt


def _feature_dir(scan: str) -> Path:
    """Where the frontend looks for a scan's feature files, relative to the served folder."""
    local = scan.startswith("./data/")  # a local scan: the frontend reads `{scan}/{index}.json` from DIR
    parts = [p for p in scan[len("./data/") :].split("/") if p not in ("", ".", "..")] if local else [scan]
    parts = [re.sub(r"[^A-Za-z0-9._-]+", "-", p) for p in parts]
    return Path(*parts) if local and parts else Path("features", *parts)


def _read_index(path: Path) -> dict:
    if not path.exists():
        return {"graphs": []}
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ExportError(
            f"{path} is not a readable graph index ({e}); remove it or export into another folder."
        ) from None
    if not isinstance(index, dict) or not isinstance(index.get("graphs"), list):
        raise ExportError(f"{path} has no 'graphs' list; remove it or export into another folder.")
    return index


# ------------------------------------------------------------------------------------ load
def read_json_file(path: Path):
    """The JSON value of a graph JSON file (`.json`, or `.json.gz`), or `GraphFileError`."""
    if not path.is_file():
        raise GraphFileError(
            f"{path} does not exist or is not a file; pass a graph JSON such as DIR/<slug>.json."
        )
    try:
        with (
            gzip.open(path, "rt", encoding="utf-8") if path.suffix == ".gz" else open(path, encoding="utf-8")
        ) as f:
            return json.load(f)
    except (OSError, ValueError, EOFError) as e:
        raise GraphFileError(
            f"{path} is not a JSON file ({e}); pass a graph JSON written by export_json or circuit-tracer."
        ) from None


def load_json(path: str | os.PathLike) -> Graph:
    """A `Graph` from a circuit-tracer / Neuronpedia graph JSON (`.json` or `.json.gz`), step 6."""
    path = as_path(path, "path", GraphFileError)
    data = read_json_file(path)
    missing = [k for k in ("metadata", "nodes", "links") if not isinstance(data, dict) or k not in data]
    if missing:
        raise GraphFileError(f"{path} lacks {missing}; it is not a circuit-tracer / Neuronpedia graph JSON.")
    try:
        return _graph_from_json(data)
    except GraphFileError as e:
        raise GraphFileError(f"{path}: {e}") from None
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise GraphFileError(
            f"{path} has a malformed node or link ({type(e).__name__}: {e}); it does not follow the graph schema."
        ) from None


def _graph_from_json(data: dict) -> Graph:
    meta_json = data["metadata"]
    prompt_tokens = [str(t) for t in meta_json["prompt_tokens"]]
    n_pos = len(prompt_tokens)
    kind_of = {v: k for k, v in FEATURE_TYPES.items()}
    attn_kind_of = {v: k for k, v in ATTN_FEATURE_TYPES.items()}
    rows, by_id, sites = [], {}, []
    for node in data["nodes"]:
        ftype, node_id, pos = node["feature_type"], str(node["node_id"]), int(node["ctx_idx"])
        attn = ftype in attn_kind_of
        kind = attn_kind_of[ftype] if attn else kind_of.get(ftype, "error" if "error" in ftype else None)
        if kind is None:
            raise GraphFileError(
                f"node {node_id} has feature_type {ftype!r}; attrgraph reads "
                f"{sorted([*FEATURE_TYPES.values(), *ATTN_FEATURE_TYPES.values()])}."
            )
        if attn:
            node_id_parts = node_id[1:] if node_id.startswith("A") else node_id
        if not 0 <= pos < n_pos:
            raise GraphFileError(f"node {node_id} sits at ctx_idx {pos}, outside the {n_pos} prompt tokens.")
        parts = (node_id_parts if attn else node_id).split("_")
        layer, feature, token = -1, -1, -1
        if kind == "embedding":
            token = int(parts[1]) if len(parts) == 3 and parts[0] == "E" else -1
        elif kind == "error":
            layer = int(node["layer"])
        elif kind == "feature":
            layer = int(node["layer"])
            feature = (
                int(parts[1])
                if len(parts) == 3 and parts[0] == str(layer)
                else _uncantor(int(node["feature"]) - (ATTN_INDEX_OFFSET if attn else 0))[1]
            )
        else:
            layer, token = int(node["layer"]) - 1, int(node["feature"])
        act = node.get("activation")
        if node_id in by_id:
            raise GraphFileError(f"node id {node_id} appears twice; every node needs its own id.")
        by_id[node_id] = len(rows)
        rows.append((kind, layer, pos, feature, token, np.nan if act is None else float(act), node))
        sites.append("attn" if attn else "mlp" if kind in ("feature", "error") else "")
    rank = {k: r for r, k in enumerate(NODE_ORDER)}
    logit_prob = [-float(r[6].get("token_prob", 0.0)) if r[0] == "logit" else 0.0 for r in rows]

    def place(i):  # graph.py's order: errors by (site, layer, position), features by (layer, site, ...)
        kind, layer, attn = rows[i][0], rows[i][1], sites[i] == "attn"
        a, b = (int(attn), layer) if kind == "error" else (layer, int(not attn) if kind == "feature" else 0)
        return (rank[kind], logit_prob[i], a, b, rows[i][2], rows[i][3])

    order = sorted(range(len(rows)), key=place)
    new = np.empty(len(rows), np.int64)
    new[order] = np.arange(len(rows))
    rows = [rows[i] for i in order]
    sites = [sites[i] for i in order]
    nodes = Nodes(
        kind=np.array([r[0] for r in rows], dtype=str) if rows else np.array([], dtype=str),
        layer=[r[1] for r in rows],
        position=[r[2] for r in rows],
        feature=[r[3] for r in rows],
        activation=[r[5] for r in rows],
        token=[r[4] for r in rows],
        site=np.array(sites, dtype=str) if rows else np.array([], dtype=str),
    )
    n = len(rows)
    src, dst, weight = [], [], []
    for link in data["links"]:
        s, t = link["source"], link["target"]
        if s not in by_id or t not in by_id:
            raise GraphFileError(
                f"link {s} -> {t} names a node the file lacks; every link must join two listed nodes."
            )
        src.append(new[by_id[s]])
        dst.append(new[by_id[t]])
        weight.append(float(link["weight"]))
    src, dst = np.asarray(src, np.int64), np.asarray(dst, np.int64)
    if np.any(src >= dst):
        k = int(np.argmax(src >= dst))
        raise GraphFileError(
            f"link {rows[src[k]][6]['node_id']} -> {rows[dst[k]][6]['node_id']} runs against the layer order; "
            "attrgraph reads graphs whose links go from embeddings and lower layers to higher layers and logits."
        )
    adjacency = sp.csr_array((np.asarray(weight, np.float32), (dst, src)), shape=(n, n))
    adjacency.sum_duplicates()
    logits = [r for r in rows if r[0] == "logit"]
    strings = []
    for r in logits:
        m = _LOGIT_CLERP.match(str(r[6].get("clerp", "")))
        strings.append(m.group(1) if m else str(r[4]))
    prompt_ids = np.full(n_pos, -1, np.int64)
    for r in rows:
        if r[0] == "embedding":
            prompt_ids[r[2]] = r[4]
    meta = dict(meta_json.get("generation_settings") or {})
    settings = meta_json.get("pruning_settings")
    if isinstance(settings, dict):  # attrgraph's export of a pruned graph: pruned once already
        meta.update(
            pruned=True,
            **{k: float(settings[k]) for k in ("node_threshold", "edge_threshold") if k in settings},
            prune_rule=str(settings.get("prune_rule", "appendix")),
        )
    meta.update(source="json", slug=str(meta_json.get("slug", "")), scan=str(meta_json.get("scan", "")))
    try:
        graph = Graph(
            nodes=nodes,
            adjacency=adjacency,
            prompt_ids=prompt_ids,
            prompt_tokens=prompt_tokens,
            logit_tokens=[r[4] for r in logits],
            logit_probs=[float(r[6].get("token_prob", 0.0)) for r in logits],
            logit_strings=strings,
            meta=meta,
        )
    except GraphError as e:
        raise GraphFileError(f"the nodes do not form a graph: {e}") from None
    influence = logit_influence(graph.adjacency, graph.logit_weights()).influence
    graph.nodes.influence = influence.astype(np.float32)
    shares = [r[6].get("influence") for r in rows]
    if isinstance(settings, dict) and settings.get("influence") == "unpruned graph":
        if all(isinstance(x, (int, float)) for x in shares):
            graph.nodes.unpruned_share = np.asarray(shares, np.float64)
    return graph

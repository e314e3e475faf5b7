"""HDF5 storage of attribution graphs: many graphs per file, one group each.

1. Layout: `/graphs/<name>/` holds the node table (`nodes/<field>`), the adjacency as CSR with
   rows = targets (`adjacency/{data,indices,indptr}`, attribute `shape`), the prompt
   (`prompt_ids`, `prompt_tokens`), the logits (`logit_tokens`, `logit_probs`, `logit_strings`)
   and attributes: `schema_version`, `library_version`, `created`, `replacement_score` and
   `completeness_score` (scores.py, of the graph as stored), and `meta` (JSON of plain
   values: model and transcoder identity, options, thresholds). Arrays are gzip-compressed.
   Named arrays and plain attributes only; nothing is pickled.
2. Writing is atomic: the new file (a copy of the old one plus the new group) is written to a
   temporary file in the same folder and renamed over the target, so a crash never leaves a
   half-written file under the final name.
3. Reading checks that the file is HDF5, that the graph exists, the schema version, and every
   array's presence and shape, and raises `GraphFileError` / `SchemaVersionError` saying what is wrong.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import shutil
import tempfile
import time
from dataclasses import fields
from pathlib import Path

import h5py
import numpy as np
import scipy.sparse as sp

from attrgraph.errors import GraphError, GraphFileError, SchemaVersionError
from attrgraph.graph.graph import NODE_FIELDS, Graph, Nodes
from attrgraph.graph.scores import compute_graph_scores

SCHEMA_VERSION = 1
"""Bumped whenever the layout above changes incompatibly."""
DEFAULT_NAME = "graph"
_STR = h5py.string_dtype("utf-8")
_COMPRESS = {"compression": "gzip", "compression_opts": 4, "shuffle": True}


def _write_array(group: h5py.Group, name: str, values, dtype=None) -> None:
    if dtype is _STR:
        group.create_dataset(name, data=np.array(list(values), dtype=object), dtype=_STR)
        return
    arr = np.asarray(values, dtype=dtype)
    group.create_dataset(name, data=arr, **(_COMPRESS if arr.size > 1024 else {}))


def _library_version() -> str:
    try:
        return importlib.metadata.version("attrgraph")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _write_group(group: h5py.Group, graph: Graph) -> None:
    group.attrs["schema_version"] = SCHEMA_VERSION
    group.attrs["library_version"] = _library_version()
    group.attrs["created"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    group.attrs["meta"] = json.dumps(graph.meta, default=str)
    scores = compute_graph_scores(graph)  # of this graph as stored (pruned or not); scores.py
    group.attrs["replacement_score"] = scores.replacement
    group.attrs["completeness_score"] = scores.completeness
    nodes = group.create_group("nodes")
    for f in fields(Nodes):
        values = getattr(graph.nodes, f.name)
        _write_array(nodes, f.name, values, _STR if f.name == "kind" else NODE_FIELDS[f.name])
    adj = graph.adjacency.tocsr()
    adj.sort_indices()
    a = group.create_group("adjacency")
    a.attrs["shape"] = np.asarray(adj.shape, np.int64)
    _write_array(a, "data", adj.data)
    _write_array(a, "indices", adj.indices, np.int64)
    _write_array(a, "indptr", adj.indptr, np.int64)
    _write_array(group, "prompt_ids", graph.prompt_ids, np.int64)
    _write_array(group, "prompt_tokens", graph.prompt_tokens, _STR)
    _write_array(group, "logit_tokens", graph.logit_tokens, np.int64)
    _write_array(group, "logit_probs", graph.logit_probs, np.float32)
    _write_array(group, "logit_strings", graph.logit_strings, _STR)


@contextlib.contextmanager
def edit_h5(path: str | os.PathLike):
    """Open a copy of the HDF5 file `path` (or a new file) for writing; on success the copy is
    renamed over `path` with the permissions a plain `open` would give, so a crash never leaves
    a half-written file under the final name. Every writer of graph files goes through here."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        if path.exists():
            shutil.copyfile(path, tmp)
        with h5py.File(tmp, "a") as f:
            yield f
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600 files
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def save_graph(graph: Graph, path: str | os.PathLike, name: str | None = None) -> str:
    """Store `graph` as `/graphs/<name>` in the HDF5 file `path` (created or extended; a graph of
    the same name is replaced). Returns the name used (`"graph"` by default)."""
    name = DEFAULT_NAME if name is None else str(name)
    if not name or "/" in name:
        raise GraphFileError(
            f"graph name {name!r} is empty or contains '/'; pass a plain name such as 'ioi_1'."
        )
    graph.validate()
    path = Path(path)
    if path.exists():
        _check_hdf5(path)
    with edit_h5(path) as f:
        f.attrs["format"] = "attrgraph"
        graphs = f.require_group("graphs")
        if name in graphs:
            del graphs[name]
        _write_group(graphs.create_group(name), graph)
    return name


def _check_hdf5(path: Path) -> None:
    if not path.is_file():
        raise GraphFileError(
            f"{path} does not exist or is not a file; pass the path of a graph file written by save_graph."
        )
    try:
        ok = h5py.is_hdf5(path)
    except OSError:
        ok = False
    if not ok:
        raise GraphFileError(f"{path} is not an HDF5 file; pass a file written by save_graph.")


def _open(path: Path) -> h5py.File:
    _check_hdf5(path)
    try:
        return h5py.File(path, "r")
    except OSError as e:
        raise GraphFileError(
            f"{path} is truncated or corrupt ({e}); write it again with save_graph."
        ) from None


def list_graphs(path: str | os.PathLike) -> list[str]:
    """Names of the graphs stored in `path`."""
    with _open(Path(path)) as f:
        return sorted(f["graphs"].keys()) if "graphs" in f else []


def _read(group: h5py.Group, key: str, where: str, dtype=None):
    if key not in group:
        raise GraphFileError(
            f"{where} lacks '{key}'; the file is incomplete, write it again with save_graph."
        )
    try:
        data = group[key][()]
    except (OSError, KeyError) as e:
        raise GraphFileError(
            f"{where}/{key} cannot be read ({e}); the file is truncated or corrupt."
        ) from None
    if dtype is _STR:
        return [v.decode() if isinstance(v, bytes) else str(v) for v in np.atleast_1d(data)]
    return np.asarray(data, dtype=dtype) if dtype is not None else np.asarray(data)


def load_graph(path: str | os.PathLike, name: str | None = None) -> Graph:
    """Read one graph; `name` may be omitted when the file holds exactly one."""
    path = Path(path)
    with _open(path) as f:
        names = sorted(f["graphs"].keys()) if "graphs" in f else []
        if not names:
            raise GraphFileError(f"{path} holds no graphs; write one with save_graph.")
        if name is None:
            if len(names) > 1:
                raise GraphFileError(f"{path} holds {len(names)} graphs {names}; pass name= to pick one.")
            name = names[0]
        if name not in names:
            raise GraphFileError(f"{path} has no graph named {name!r}; it holds {names}.")
        g = f["graphs"][name]
        where = f"{path}:/graphs/{name}"
        version = g.attrs.get("schema_version")
        if version is None:
            raise SchemaVersionError(f"{where} has no schema_version; it was not written by save_graph.")
        if int(version) != SCHEMA_VERSION:
            raise SchemaVersionError(
                f"{where} uses graph schema version {int(version)}, this attrgraph reads version "
                f"{SCHEMA_VERSION}; rebuild the graph or use the attrgraph version that wrote it."
            )
        if "nodes" not in g or "adjacency" not in g:
            raise GraphFileError(f"{where} lacks its node table or adjacency; the file is incomplete.")
        node_values = {
            fld.name: _read(g["nodes"], fld.name, f"{where}/nodes", _STR if fld.name == "kind" else None)
            for fld in fields(Nodes)
        }
        a = g["adjacency"]
        shape = tuple(int(s) for s in a.attrs.get("shape", ()))
        data = _read(a, "data", f"{where}/adjacency")
        indices = _read(a, "indices", f"{where}/adjacency", np.int64)
        indptr = _read(a, "indptr", f"{where}/adjacency", np.int64)
        n = len(node_values["kind"])
        if shape != (n, n) or len(indptr) != n + 1 or len(indices) != len(data) or indptr[-1] != len(data):
            raise GraphFileError(
                f"{where} adjacency (shape {shape}, {len(indptr)} row pointers, {len(data)} values) does "
                f"not fit its {n} nodes; the file is corrupt, write it again with save_graph."
            )
        if len(indices) and (indices.min() < 0 or indices.max() >= n):
            raise GraphFileError(
                f"{where} adjacency has column indices outside [0, {n}); the file is corrupt."
            )
        try:
            return Graph(
                nodes=Nodes(**node_values),
                adjacency=sp.csr_array((data, indices, indptr), shape=(n, n)),
                prompt_ids=_read(g, "prompt_ids", where, np.int64),
                prompt_tokens=_read(g, "prompt_tokens", where, _STR),
                logit_tokens=_read(g, "logit_tokens", where, np.int64),
                logit_probs=_read(g, "logit_probs", where, np.float32),
                logit_strings=_read(g, "logit_strings", where, _STR),
                meta=json.loads(g.attrs.get("meta", "{}")),
            )
        except GraphError as e:
            raise GraphFileError(f"{where} is inconsistent: {e}") from None

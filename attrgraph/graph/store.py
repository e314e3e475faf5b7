"""HDF5 storage of attribution graphs: many graphs per file, one group each.

1. Layout (schema version 3): `/graphs/<name>/` holds the node table (`nodes/<field>`; `kind` and
   `site` as fixed-length ASCII; `site` only in graphs with attention nodes, a missing one means
   site "mlp" on every feature and error node; `unpruned_influence` and `unpruned_share` only in
   pruned graphs that know them, missing means NaN), the adjacency as CSR with rows = targets
   (`adjacency/{data,indices,indptr}`, attribute `shape`; `indices` int32 while the node count fits
   in it, as in memory, else int64), `prompt_ids`, `logit_tokens`, `logit_probs`, and attributes:
   `schema_version`, `library_version`, `created`, `replacement_score` and `completeness_score`
   (scores.py, of the graph as stored), `meta` (JSON of plain values: model and transcoder
   identity, options, and for a pruned graph `pruned`, `node_threshold`, `edge_threshold`,
   `prune_rule`) and `prompt_tokens`, `logit_strings` (JSON lists of strings).
   Named arrays and plain attributes only; nothing is pickled.
2. Checksums: every dataset is chunked with the fletcher32 filter (after gzip, so the stored bytes
   are checked; the edge values are not gzipped: float32 values shrink by about 10% at a fifth
   of the write speed), and files are written with the HDF5 1.10 format (`libver=("v110", ...)`),
   whose superblock, object headers and chunk indexes carry checksums. Strings are fixed-length
   attributes inside the checksummed object headers (variable-length strings would live in the
   global heap, which HDF5 does not checksum). A damaged byte therefore fails a checksum instead
   of loading different data.
3. Writing is atomic: the new file (a copy of the old one plus the new group) is written to a
   temporary file `.NAME.PID@HOST.XXXXXXXX.tmp` in the same folder and renamed over the target,
   so a crash never leaves a half-written file under the final name (`save_graphs` writes several
   graphs, such as `build --full`'s pair, in one such write: all or none); temporaries left by writers
   that died (same host, no process with that PID) are removed by the next write. Writers of one
   file take turns (POSIX: an flock on the empty `.NAME.lock` beside it, removed by its holder when
   done, so no lock file is left behind), so that two processes adding graphs at once do not drop
   each other's.
   A full disk: before HDF5 writes a byte, the temporary is grown (`posix_fallocate`) by a bound on
   what the write adds, so a disk too full fails there, as one `GraphFileError` line with the old
   file intact and no temporary left; HDF5 itself then never meets a failed write (after one,
   h5py's close can crash the interpreter) and truncates the file to its end on close.
   Ctrl-C (SIGINT) during a write is held until the next slice of an array (h5py would swallow a
   `KeyboardInterrupt` raised inside its own calls and write on), then stops the write: the old
   file is left as it was, the temporary removed, and `KeyboardInterrupt` raised.
   (`edit_h5`, in transcoders/h5file.py: the transcoders' dashboards are written the same way.)
   `check_output` finds a folder that cannot be written, a directory, or a file that is not HDF5
   before any work, in one line, and `check_name` a name that HDF5 would read as a path.
4. Reading checks that the file is HDF5, that the graph exists, the schema version, every
   array's presence and shape, and that the JSON attributes decode to what they should; anything
   else that goes wrong inside h5py (a failed checksum, a damaged structure) becomes a
   `GraphFileError` / `SchemaVersionError` saying what is wrong. Files of schema version 2 (never
   a `nodes/site`) and 1 (also variable-length strings, no checksums) are still read.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import time
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path

import h5py
import numpy as np
import scipy.sparse as sp
from tqdm import tqdm

from attrgraph.errors import GraphError, GraphFileError, SchemaVersionError
from attrgraph.graph.graph import NODE_FIELDS, NODE_ORDER, Graph, Nodes, check_graph
from attrgraph.graph.scores import GraphScores, compute_graph_scores
from transcoders import h5file
from transcoders.arguments import as_path, shown
from transcoders.h5file import remove_stale_temporaries as remove_stale_temporaries
from transcoders.h5file import stop_if_interrupted

SCHEMA_VERSION = 3
"""Bumped whenever the layout above changes incompatibly (2: checksums, strings in attributes;
3: `nodes/site`, attention features and errors)."""
READABLE_VERSIONS = (1, 2, 3)
OPTIONAL_NODE_FIELDS = ("unpruned_influence", "unpruned_share")
"""Node fields stored only when some value is not NaN (step 1): a pruned graph's influence in
the graph it was pruned from (prune.py); files without them read as NaN, and readers that do not
know them skip them, so adding them changed no schema version."""
DEFAULT_NAME = "graph"
_STR = h5py.string_dtype("utf-8")
_GZIP = 4  # level of every dataset above 1024 entries, except the adjacency's (see _write_group)
_SLICE = 1 << 22  # entries per read or write of a large array (progress steps)
# what h5py, HDF5 and numpy raise on a damaged file (a failed checksum is an OSError)
_H5_ERRORS = (
    OSError,
    KeyError,
    RuntimeError,
    ValueError,
    TypeError,
    IndexError,
    OverflowError,
    AttributeError,
)


def _write_array(
    group: h5py.Group, name: str, values, dtype=None, bar=None, gzip: int | None = _GZIP
) -> None:
    """A chunked, checksummed (and above 1024 entries, unless `gzip=None`, gzipped at level
    `gzip`) dataset, written in slices that advance `bar` (a tqdm, or None) by their bytes."""
    arr = np.asarray(values)  # cast slice by slice below: no full-size copy of a large array
    dtype = arr.dtype if dtype is None else np.dtype(dtype)
    ds = group.create_dataset(
        name,
        shape=arr.shape,
        dtype=dtype,
        chunks=True,
        fletcher32=True,
        **(
            {"compression": "gzip", "compression_opts": gzip, "shuffle": True}
            if gzip is not None and arr.size > 1024
            else {}
        ),
    )
    for i in range(0, len(arr), _SLICE):
        stop_if_interrupted()  # step 3: a Ctrl-C held since the last slice stops the write here
        part = arr[i : i + _SLICE].astype(dtype, copy=False)
        ds[i : i + _SLICE] = part
        if bar is not None:
            bar.update(part.nbytes)


def _write_text(group: h5py.Group | h5py.AttributeManager, name: str, value) -> None:
    """A JSON (or plain) string as a fixed-length UTF-8 attribute: stored in the checksummed
    object header, unlike a variable-length string."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    data = text.encode("utf-8") or b" "
    attrs = group if isinstance(group, h5py.AttributeManager) else group.attrs
    attrs.create(name, data=data, dtype=h5py.string_dtype("utf-8", len(data)))


def _library_version() -> str:
    try:
        return importlib.metadata.version("attrgraph")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _write_group(
    group: h5py.Group, graph: Graph, progress: bool = False, scores: GraphScores | None = None
) -> None:
    group.attrs["schema_version"] = SCHEMA_VERSION
    _write_text(group, "library_version", _library_version())
    _write_text(group, "created", time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    _write_text(group, "meta", graph.meta)
    _write_text(group, "prompt_tokens", list(graph.prompt_tokens))
    _write_text(group, "logit_strings", list(graph.logit_strings))
    if scores is None:
        scores = compute_graph_scores(graph)  # of this graph as stored (pruned or not); scores.py
    stop_if_interrupted()
    group.attrs["replacement_score"] = scores.replacement
    group.attrs["completeness_score"] = scores.completeness
    nodes = group.create_group("nodes")
    for f in fields(Nodes):
        values = getattr(graph.nodes, f.name)
        if f.name == "site" and not (values == "attn").any():
            continue  # step 1: the default, as in files of version 2
        if f.name in OPTIONAL_NODE_FIELDS and np.isnan(values).all():
            continue  # step 1: only pruned graphs have them
        if f.name in ("kind", "site"):  # validated kinds (NODE_ORDER) and sites: plain ASCII
            _write_array(nodes, f.name, np.char.encode(values.astype(str), "ascii"))
        else:
            _write_array(nodes, f.name, values, NODE_FIELDS[f.name])
    adj = graph.adjacency.tocsr()
    adj.sort_indices()
    a = group.create_group("adjacency")
    a.attrs["shape"] = np.asarray(adj.shape, np.int64)
    index_dtype = np.int32 if adj.shape[0] <= np.iinfo(np.int32).max else np.int64
    with tqdm(
        total=adj.data.nbytes + np.dtype(index_dtype).itemsize * adj.nnz,
        desc="writing edges",
        unit="B",
        unit_scale=True,
        disable=not progress,
        delay=1,
    ) as bar:
        # level 1: 2.4x the write speed of level 4 on sorted indices, both ~1% of the raw size
        _write_array(a, "data", adj.data, bar=bar, gzip=None)
        _write_array(a, "indices", adj.indices, index_dtype, bar=bar, gzip=1)
    _write_array(a, "indptr", adj.indptr, np.int64)
    _write_array(group, "prompt_ids", graph.prompt_ids, np.int64)
    _write_array(group, "logit_tokens", graph.logit_tokens, np.int64)
    _write_array(group, "logit_probs", graph.logit_probs, np.float32)


def edit_h5(path: str | os.PathLike, fresh: bool = False, reserve: int = h5file.RESERVE):
    """`transcoders.h5file.edit_h5` with `GraphFileError` for what cannot be written (steps 3)."""
    return h5file.edit_h5(path, fresh, reserve, error=GraphFileError)


def check_output(path: str | os.PathLike, kind: str = "graph") -> None:
    """Step 3: refuse, before any work, an output `path` that `save_graph` (or, with kind
    "circuit", `save_circuit`) could not write: a directory, an existing file that is not HDF5, a
    missing folder under a file, or a folder this process cannot create files in (tried for real,
    with a temporary removed at once). A symbolic link is checked as the file it leads to, which
    the save writes (h5file step 6)."""
    path = h5file.followed(path)
    if path.is_dir():
        raise GraphFileError(
            f"{path} is a folder; pass a file name to write, such as {path / (kind + '.h5')}."
        )
    if path.exists():
        if not path.is_file() or not _is_hdf5(path):
            raise GraphFileError(
                f"{path} exists and is not an HDF5 file, so no {kind} can be added to it; pass a new file "
                f"name or a {kind} file written by attrgraph."
            )
        fmt = _format(path)
        if fmt not in (None, "attrgraph"):  # e.g. a dashboards file: writing would relabel it
            raise GraphFileError(
                f"{path} is not a graph file (its format is {fmt!r}), so no {kind} can be added to it without "
                f"relabelling it; pass a new file name or a {kind} file written by attrgraph."
            )
    folder = path.parent
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir():
        raise GraphFileError(f"{folder} is a file, so {path} cannot be created; pass another output path.")
    try:
        os.unlink(h5file.new_temporary(folder / path.name))
    except OSError as e:
        raise h5file.write_error(folder / path.name, e, GraphFileError) from None


def check_name(name, kind: str = "graph") -> None:
    """Step 3: refuse a group name that HDF5 reads as a path (empty, '.', or holding '/'), before
    any work: '.' names the group that holds it, and 'a/b' a group inside another."""
    if not isinstance(name, str) or not name or name == "." or "/" in name:
        raise GraphFileError(
            f"{kind} name {name!r} is empty, '.' or contains '/'; pass a plain name such as 'ioi_1'."
        )


def _format(path: Path) -> str | None:
    """The root `format` attribute of the HDF5 file `path` (None without one, or unreadable: the
    save then says what is wrong)."""
    try:
        with h5py.File(path, "r") as f:
            fmt = f.attrs.get("format")
    except _H5_ERRORS:
        return None
    if isinstance(fmt, bytes):
        fmt = fmt.decode()
    return None if fmt is None else str(fmt)


def _is_hdf5(path: Path) -> bool:
    try:
        return bool(h5py.is_hdf5(path))
    except _H5_ERRORS:
        return False


def save_graph(
    graph: Graph,
    path: str | os.PathLike,
    name: str | None = None,
    progress: bool = False,
    scores: GraphScores | None = None,
) -> str:
    """Store `graph` as `/graphs/<name>` in the HDF5 file `path` (created, with any missing parent
    folders, or extended; a graph of the same name is replaced). Returns the name used (`"graph"`
    by default). `progress=True` shows a bar for the edges. `scores`: the graph's scores when
    already computed (as `attribute` does); by default one streamed pass over its edges."""
    check_graph(graph, "save_graph")
    if scores is not None and not isinstance(scores, GraphScores):
        raise GraphError(
            f"scores is a {type(scores).__name__} ({shown(scores)}); pass compute_graph_scores(graph) or None."
        )
    name = DEFAULT_NAME if name is None else str(name)
    save_graphs({name: graph}, path, progress, {name: scores})
    return name


def save_graphs(
    graphs: dict[str, Graph],
    path: str | os.PathLike,
    progress: bool = False,
    scores: dict[str, GraphScores | None] | None = None,
) -> None:
    """Store every `{name: graph}` of `graphs` in `path` in one atomic write (step 3), so that the
    file holds all of them or, after any failure (a full disk, Ctrl-C), none: `build --full`'s
    pruned graph and its unpruned NAME_full. Graphs of those names are replaced. `scores`: the
    scores already computed for some of the graphs (see `save_graph`)."""
    if not isinstance(graphs, Mapping):
        hint = " (one graph: save_graph(graph, path, name))" if isinstance(graphs, Graph) else ""
        raise GraphError(f"save_graphs takes a {{name: Graph}} mapping, got a {type(graphs).__name__}{hint}.")
    for name in graphs:
        check_name(name)
    for graph in graphs.values():
        check_graph(graph, "save_graphs")
        graph.validate()
    path = as_path(path, "path", GraphFileError)
    check_output(path)
    reserve = sum(_size_bound(g) - h5file.RESERVE for g in graphs.values()) + h5file.RESERVE
    with edit_h5(path, reserve=reserve) as f:
        _write_text(f.attrs, "format", "attrgraph")
        group = f.require_group("graphs")
        for name, graph in graphs.items():
            if name in group:
                del group[name]
            _write_group(group.create_group(name), graph, progress, (scores or {}).get(name))


def _size_bound(graph: Graph) -> int:
    """More bytes than `_write_group` adds to a file for `graph` (step 3's reservation): every
    array at its stored width before compression (gzip and checksums add a few bytes per chunk),
    plus a MiB for the attributes and HDF5's object headers and chunk indexes."""
    adj = graph.adjacency
    nodes = sum(np.asarray(getattr(graph.nodes, f.name)).nbytes for f in fields(Nodes))
    edges = adj.nnz * (adj.data.dtype.itemsize + 8) + (adj.shape[0] + 1) * 8
    small = 8 * (len(graph.prompt_ids) + 2 * len(graph.logit_tokens))
    text = len(json.dumps(graph.meta, default=str)) + sum(
        len(t.encode()) for t in (*graph.prompt_tokens, *graph.logit_strings)
    )
    return int(1.05 * (nodes + edges + small + text)) + h5file.RESERVE


def remove_graphs(path: str | os.PathLike, names) -> None:
    """Delete the graphs `names` (those present) from `path`, atomically as `save_graph` writes."""
    path = as_path(path, "path", GraphFileError)
    _check_hdf5(path)
    with edit_h5(path) as f:
        graphs = f.require_group("graphs")
        for name in names:
            if name in graphs:
                del graphs[name]


def _check_hdf5(path: Path) -> None:
    if not path.is_file():
        raise GraphFileError(
            f"{path} does not exist or is not a file; pass the path of a graph file written by save_graph."
        )
    try:
        ok = h5py.is_hdf5(path)
    except _H5_ERRORS:
        ok = False
    if not ok:
        raise GraphFileError(f"{path} is not an HDF5 file; {_foreign_hint(path)}.")


def _foreign_hint(path: Path) -> str:
    """What to do with a graph file of another tool that was passed where ours goes."""
    name = path.name.lower()
    if name.endswith(".pt") or name.endswith(".pth"):
        reader = "a graph circuit-tracer saved (to_pt)"
        python = "load_pt"
    elif name.endswith((".json", ".json.gz")):
        reader = "a circuit-tracer / Neuronpedia graph JSON"
        python = "load_json"
    else:
        return "pass a file written by save_graph"
    return (
        f"if it is {reader}, store it as one with `attrgraph convert {path} -o graph.h5` "
        f"(from Python: attrgraph.{python}), else pass a file written by save_graph"
    )


def _corrupt(where, e: Exception) -> GraphFileError:
    reason = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
    return GraphFileError(f"{where} is damaged or truncated ({reason}); write it again with save_graph.")


def _open(path: Path) -> h5py.File:
    _check_hdf5(path)
    try:
        return h5py.File(path, "r")
    except _H5_ERRORS as e:
        raise _corrupt(path, e) from None


def _names(f: h5py.File) -> list[str]:
    return sorted(f["graphs"].keys()) if "graphs" in f else []


def list_graphs(path: str | os.PathLike) -> list[str]:
    """Names of the graphs stored in `path`."""
    path = as_path(path, "path", GraphFileError)
    with _open(path) as f:
        try:
            return _names(f)
        except _H5_ERRORS as e:
            raise _corrupt(path, e) from None


def load_metas(path: str | os.PathLike) -> dict[str, dict]:
    """`{name: meta}` of every graph in `path`, without reading nodes or edges."""
    path = as_path(path, "path", GraphFileError)
    with _open(path) as f:
        try:
            return {n: _read_meta(f["graphs"][n], f"{path}:/graphs/{n}") for n in _names(f)}
        except (*_H5_ERRORS, MemoryError) as e:
            raise _corrupt(path, e) from None


def _read_meta(g: h5py.Group, where: str) -> dict:
    if int(g.attrs.get("schema_version", 0)) == 1:
        return json.loads(g.attrs.get("meta", "{}"))
    return _read_text(g, "meta", where, dict)


def _read(group: h5py.Group, key: str, where: str, dtype=None, bar=None, below: int | None = None):
    """Dataset `key` as a 1-d array of `dtype`; with `below`, every value must lie in [0, below)
    (`below` must fit in `dtype`: a value that does not fit saturates, so it is still caught)."""
    if key not in group:
        raise GraphFileError(
            f"{where} lacks '{key}'; the file is incomplete, write it again with save_graph."
        )
    ds = group[key]
    if dtype is _STR:
        return [v.decode() if isinstance(v, bytes) else str(v) for v in np.atleast_1d(ds[()])]
    if ds.ndim != 1:
        raise GraphFileError(f"{where}/{key} has shape {ds.shape}, not one dimension; the file is damaged.")
    out = np.empty(ds.shape, ds.dtype if dtype is None else dtype)
    numeric = out.dtype.kind in "biuf" and ds.dtype.kind in "biuf"
    for i in range(0, len(out), _SLICE):  # in slices, for the progress bar
        part = np.s_[i : i + _SLICE]
        if numeric:  # HDF5 converts into place: no temporary (a narrowing cast saturates)
            ds.read_direct(out, part, part)
        else:
            out[part] = ds[part]
        if below is not None and (out[part].min() < 0 or out[part].max() >= below):
            raise GraphFileError(f"{where}/{key} has values outside [0, {below}); the file is corrupt.")
        if bar is not None:
            bar.update(ds.dtype.itemsize * len(out[part]))
    return out


def _read_text(group: h5py.Group, key: str, where: str, kind: type, n: int | None = None):
    """A JSON attribute (step 1) decoded and checked to be a `kind` (of `n` strings for a list)."""
    if key not in group.attrs:
        raise GraphFileError(f"{where} lacks the attribute '{key}'; the file is incomplete.")
    raw = group.attrs[key]
    try:
        value = json.loads(raw.decode("utf-8") if isinstance(raw, bytes) else str(raw))
    except ValueError as e:  # JSON and UTF-8 errors
        raise GraphFileError(
            f"{where} attribute '{key}' is not JSON text ({e}); the file is damaged, write it again "
            "with save_graph."
        ) from None
    ok = isinstance(value, kind) and (
        kind is not list or (len(value) == n and all(isinstance(v, str) for v in value))
    )
    if not ok:
        raise GraphFileError(
            f"{where} attribute '{key}' is not {'a JSON object' if kind is dict else f'a list of {n} strings'}; "
            "the file is damaged, write it again with save_graph."
        )
    return value


def load_graph(path: str | os.PathLike, name: str | None = None, progress: bool = False) -> Graph:
    """Read one graph; `name` may be omitted when the file holds exactly one. Raises
    `GraphFileError` (or `SchemaVersionError`) for a missing, foreign, damaged or incomplete file.
    `progress=True` shows a bar for the edges."""
    path = as_path(path, "path", GraphFileError)
    with _open(path) as f:
        try:
            return _load(f, path, name, progress)
        except GraphFileError:
            raise
        except GraphError as e:
            raise GraphFileError(f"{path}:/graphs/{name} is inconsistent: {e}") from None
        except (*_H5_ERRORS, MemoryError) as e:  # JSON and UTF-8 errors are ValueErrors
            raise _corrupt(f"{path}:/graphs/{name}" if name else path, e) from None


def _load(f: h5py.File, path: Path, name: str | None, progress: bool = False) -> Graph:
    names = _names(f)
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
    if int(version) not in READABLE_VERSIONS:
        raise SchemaVersionError(
            f"{where} uses graph schema version {int(version)}, this attrgraph reads versions "
            f"{list(READABLE_VERSIONS)}; rebuild the graph or use the attrgraph version that wrote it."
        )
    if "nodes" not in g or "adjacency" not in g:
        raise GraphFileError(f"{where} lacks its node table or adjacency; the file is incomplete.")
    node_values = {
        fld.name: _read(g["nodes"], fld.name, f"{where}/nodes")
        for fld in fields(Nodes)
        # step 1: a missing site means "mlp", missing unpruned_* NaN
        if fld.name not in ("site", *OPTIONAL_NODE_FIELDS) or fld.name in g["nodes"]
    }
    if "site" in node_values:
        site = node_values["site"]
        node_values["site"] = np.char.decode(site, "ascii") if site.dtype.kind == "S" else site.astype(str)
    kind = node_values["kind"]
    if kind.dtype.kind == "S":  # version 2: fixed-length ASCII
        kind = np.char.decode(kind, "ascii")
    elif kind.dtype.kind == "O":  # version 1: variable-length strings
        kind = np.array([k.decode() if isinstance(k, bytes) else str(k) for k in kind], dtype=str)
    unknown = set(np.unique(kind).tolist()) - set(NODE_ORDER)
    if unknown:
        raise GraphFileError(f"{where} has unknown node kinds {sorted(unknown)[:3]}; the file is damaged.")
    node_values["kind"] = kind
    a = g["adjacency"]
    shape = tuple(int(s) for s in np.atleast_1d(a.attrs.get("shape", ())))
    big = [a[k] for k in ("data", "indices") if k in a]
    with tqdm(
        total=sum(d.size * d.dtype.itemsize for d in big),
        desc="reading edges",
        unit="B",
        unit_scale=True,
        disable=not progress,
        delay=1,
    ) as bar:
        data = _read(a, "data", f"{where}/adjacency", bar=bar)
        n = len(kind)
        # int32 indices while they fit, as attribute makes them (half the memory of int64)
        index_dtype = np.int32 if max(n, len(data)) <= np.iinfo(np.int32).max else np.int64
        indices = _read(a, "indices", f"{where}/adjacency", index_dtype, bar=bar, below=n)
    indptr = _read(a, "indptr", f"{where}/adjacency", np.int64)
    if shape != (n, n) or len(indptr) != n + 1 or len(indices) != len(data) or indptr[-1] != len(data):
        raise GraphFileError(
            f"{where} adjacency (shape {shape}, {len(indptr)} row pointers, {len(data)} values) does "
            f"not fit its {n} nodes; the file is corrupt, write it again with save_graph."
        )
    if indptr[0] != 0 or np.any(np.diff(indptr) < 0):
        raise GraphFileError(f"{where} adjacency row pointers are not ascending from 0; the file is corrupt.")
    indptr = indptr.astype(index_dtype)  # values checked above: 0 ... len(data)
    prompt_ids = _read(g, "prompt_ids", where, np.int64)
    logit_tokens = _read(g, "logit_tokens", where, np.int64)
    if int(version) == 1:
        prompt_tokens = _read(g, "prompt_tokens", where, _STR)
        logit_strings = _read(g, "logit_strings", where, _STR)
        meta = json.loads(g.attrs.get("meta", "{}"))
    else:
        prompt_tokens = _read_text(g, "prompt_tokens", where, list, len(prompt_ids))
        logit_strings = _read_text(g, "logit_strings", where, list, len(logit_tokens))
        meta = _read_text(g, "meta", where, dict)
    return Graph(
        nodes=Nodes(**node_values),
        adjacency=sp.csr_array((data, indices, indptr), shape=(n, n)),
        prompt_ids=prompt_ids,
        prompt_tokens=prompt_tokens,
        logit_tokens=logit_tokens,
        logit_probs=_read(g, "logit_probs", where, np.float32),
        logit_strings=logit_strings,
        meta=meta,
    )


def load_meta(path: str | os.PathLike, name: str) -> dict:
    """The plain `meta` of graph `name` in `path` (thresholds, rule, identity) without its arrays;
    a file `load_graph` would refuse may still answer here, so load the graph to check it."""
    path = as_path(path, "path", GraphFileError)
    with _open(path) as f:
        try:
            if name not in _names(f):
                raise GraphFileError(f"{path} has no graph named {name!r}; it holds {_names(f)}.")
            return _read_meta(f["graphs"][name], f"{path}:/graphs/{name}")
        except GraphFileError:
            raise
        except _H5_ERRORS as e:
            raise _corrupt(f"{path}:/graphs/{name}", e) from None

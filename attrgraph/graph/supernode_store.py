"""HDF5 storage of supernodes (supernodes.py) beside their graph (store.py).

1. Layout: `/supernodes/<graph name>/` beside `/graphs/<graph name>/` in the graph's HDF5 file
   (names, member keys as CSR: `indptr`, `kind`, `layer`, `position`, `feature`; attribute
   `schema_version`), written atomically with `store.edit_h5`; `store.save_graph` copies the
   file, so they survive.
2. Strings (`names`, `kind`) are fixed-length UTF-8 and every dataset is chunked with a
   fletcher32 checksum, so damage reads as an error, not as other text; files written before
   that, with variable-length strings and plain arrays, read the same.
3. A missing, foreign, truncated or damaged file, or a group lacking a part or with parts that
   do not fit together, raises `GraphFileError` in one sentence (never an h5py error).
4. "None saved" (an empty list) only when no `/supernodes/<graph name>` link exists; a group
   whose link exists but that cannot be opened or read is damage, an error.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import h5py
import numpy as np

from attrgraph.errors import GraphFileError, SupernodeError
from attrgraph.graph.graph import NODE_ORDER
from attrgraph.graph.store import edit_h5
from attrgraph.graph.supernodes import NodeKey, Supernode
from transcoders.arguments import as_path

SCHEMA_VERSION = 1
"""Version of the `/supernodes` layout."""
# what h5py, HDF5 and numpy raise on a damaged file or group (a failed checksum is an OSError)
_H5_ERRORS = (OSError, KeyError, RuntimeError, ValueError, TypeError, IndexError, AttributeError)


def _check_file(path: Path, what: str) -> None:
    try:
        ok = path.is_file() and h5py.is_hdf5(path)
    except _H5_ERRORS:
        ok = False
    if not ok:
        missing = "does not exist" if not path.exists() else "is not an HDF5 graph file"
        raise GraphFileError(f"{path} {missing}; {what}.")


def _damaged(where: str, e: Exception) -> GraphFileError:
    reason = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
    return GraphFileError(
        f"{where} is damaged or incomplete ({type(e).__name__}: {reason}); store the supernodes again."
    )


def _array(group: h5py.Group, name: str, values: np.ndarray) -> None:
    group.create_dataset(
        name, data=values, chunks=True if values.size else None, fletcher32=bool(values.size)
    )


def _texts(values) -> np.ndarray:
    data = [str(v).encode("utf-8") for v in values]
    return np.array(data, dtype=h5py.string_dtype("utf-8", max([1, *map(len, data)])))


def save_supernodes(
    path: str | os.PathLike, supernodes: Sequence[Supernode], graph_name: str = "graph"
) -> None:
    """Store `supernodes` as `/supernodes/<graph_name>` in the graph file `path` (atomic)."""
    path = as_path(path, "path", GraphFileError)
    _check_file(path, "write the graph with save_graph first")
    try:
        with h5py.File(path, "r") as f:
            has_graph = "graphs" in f and graph_name in f["graphs"]
    except _H5_ERRORS as e:
        raise _damaged(str(path), e) from None
    if not has_graph:
        raise GraphFileError(
            f"{path} has no graph named {graph_name!r}; supernodes are stored beside their graph."
        )
    members = [m for sn in supernodes for m in sn.members]
    if any(m.position is None for m in members):
        raise SupernodeError(
            "a stored supernode member has position None; store members of a graph (supernode())."
        )
    with edit_h5(path) as f:
        root = f.require_group("supernodes")
        if graph_name in root:
            del root[graph_name]
        g = root.create_group(graph_name)
        g.attrs["schema_version"] = SCHEMA_VERSION
        _array(g, "names", _texts(s.name for s in supernodes))
        _array(g, "indptr", np.cumsum([0] + [len(s.members) for s in supernodes]).astype(np.int64))
        _array(g, "kind", _texts(m.kind for m in members))
        for name in ("layer", "position", "feature"):
            _array(g, name, np.array([getattr(m, name) for m in members], np.int64))
        if any(m.site != "mlp" for m in members):  # attention members; missing means "mlp"
            _array(g, "site", _texts(m.site for m in members))


def load_supernodes(path: str | os.PathLike, graph_name: str = "graph") -> list[Supernode]:
    """The supernodes stored beside graph `graph_name` in `path` (empty list when none)."""
    path = as_path(path, "path", GraphFileError)
    _check_file(path, "pass a file written by save_graph")
    where = f"{path}:/supernodes/{graph_name}"
    try:
        with h5py.File(path, "r") as f:
            # step 4: links are looked up without opening what they name, so a group that cannot
            # be opened raises below instead of reading as "none saved" (h5py's get() would)
            if "supernodes" not in f or graph_name not in f["supernodes"]:
                return []
            return _read(f["supernodes"][graph_name], where)
    except GraphFileError:
        raise
    except _H5_ERRORS as e:  # a missing dataset, a failed checksum, bytes that are no UTF-8
        raise _damaged(where, e) from None


def _strings(ds) -> list[str]:
    """Fixed-length (bytes) and variable-length (str or bytes) strings alike."""
    return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in np.atleast_1d(ds[()])]


def _read(g: h5py.Group, where: str) -> list[Supernode]:
    version = int(g.attrs.get("schema_version", -1))
    if version != SCHEMA_VERSION:
        raise GraphFileError(f"{where} has schema version {version}; this attrgraph reads {SCHEMA_VERSION}.")
    names, kind = _strings(g["names"]), _strings(g["kind"])
    indptr = np.atleast_1d(g["indptr"][()])
    layer, position, feature = (np.atleast_1d(g[k][()]) for k in ("layer", "position", "feature"))
    n = len(kind)
    site = _strings(g["site"]) if "site" in g else ["mlp"] * n
    ok = (
        len(indptr) == len(names) + 1
        and indptr.dtype.kind in "iu"
        and indptr[0] == 0
        and indptr[-1] == n
        and bool(np.all(np.diff(indptr) > 0))
        and len(layer) == len(position) == len(feature) == len(site) == n
    )
    if not ok:
        raise GraphFileError(
            f"{where} has {len(names)} names, {len(indptr)} pointers and {n} members that do not fit "
            "together; the file is corrupt."
        )
    unknown = sorted(set(kind) - set(NODE_ORDER))
    if unknown:
        raise GraphFileError(f"{where} has unknown node kinds {unknown[:3]}; the file is corrupt.")
    if set(site) - {"mlp", "attn"}:
        raise GraphFileError(
            f"{where} has unknown sites {sorted(set(site) - {'mlp', 'attn'})[:3]}; the file is corrupt."
        )
    keys = [
        NodeKey(k, int(l), int(p), int(ft), s) for k, l, p, ft, s in zip(kind, layer, position, feature, site)
    ]
    return [Supernode(n, tuple(keys[indptr[i] : indptr[i + 1]])) for i, n in enumerate(names)]

"""HDF5 storage of supernodes (supernodes.py) beside their graph (store.py).

Layout: `/supernodes/<graph name>/` beside `/graphs/<graph name>/` in the graph's HDF5 file
(names, member keys as CSR: `indptr`, `kind`, `layer`, `position`, `feature`; attribute
`schema_version`), written atomically with `store.edit_h5`; `store.save_graph` copies the file,
so they survive.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import h5py
import numpy as np

from attrgraph.errors import GraphFileError, SupernodeError
from attrgraph.graph.store import edit_h5
from attrgraph.graph.supernodes import NodeKey, Supernode

SCHEMA_VERSION = 1
"""Version of the `/supernodes` layout."""
_STR = h5py.string_dtype("utf-8")


def save_supernodes(
    path: str | os.PathLike, supernodes: Sequence[Supernode], graph_name: str = "graph"
) -> None:
    """Store `supernodes` as `/supernodes/<graph_name>` in the graph file `path` (atomic)."""
    path = Path(path)
    if not path.is_file() or not h5py.is_hdf5(path):
        raise GraphFileError(f"{path} is not an HDF5 graph file; write the graph with save_graph first.")
    with h5py.File(path, "r") as f:
        if graph_name not in f.get("graphs", {}):
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
        g.create_dataset("names", data=np.array([s.name for s in supernodes], dtype=object), dtype=_STR)
        g.create_dataset(
            "indptr", data=np.cumsum([0] + [len(s.members) for s in supernodes]).astype(np.int64)
        )
        g.create_dataset("kind", data=np.array([m.kind for m in members], dtype=object), dtype=_STR)
        for name in ("layer", "position", "feature"):
            g.create_dataset(name, data=np.array([getattr(m, name) for m in members], np.int64))
        if any(m.site != "mlp" for m in members):  # attention members; missing means "mlp"
            g.create_dataset("site", data=np.array([m.site for m in members], dtype=object), dtype=_STR)


def load_supernodes(path: str | os.PathLike, graph_name: str = "graph") -> list[Supernode]:
    """The supernodes stored beside graph `graph_name` in `path` (empty list when none)."""
    path = Path(path)
    if not path.is_file() or not h5py.is_hdf5(path):
        raise GraphFileError(f"{path} is not an HDF5 graph file; pass a file written by save_graph.")
    with h5py.File(path, "r") as f:
        if graph_name not in f.get("supernodes", {}):
            return []
        g = f["supernodes"][graph_name]
        version = int(g.attrs.get("schema_version", -1))
        if version != SCHEMA_VERSION:
            raise GraphFileError(
                f"{path}:/supernodes/{graph_name} has schema version {version}; this attrgraph reads {SCHEMA_VERSION}."
            )
        names = [v.decode() if isinstance(v, bytes) else str(v) for v in g["names"][()]]
        indptr = g["indptr"][()]
        kind = [v.decode() if isinstance(v, bytes) else str(v) for v in g["kind"][()]]
        layer, position, feature = (g[k][()] for k in ("layer", "position", "feature"))
        site = (
            [v.decode() if isinstance(v, bytes) else str(v) for v in g["site"][()]] if "site" in g else None
        )
        if len(indptr) != len(names) + 1 or indptr[-1] != len(kind):
            raise GraphFileError(
                f"{path}:/supernodes/{graph_name} has {len(names)} names but {len(indptr)} pointers; the file is corrupt."
            )
    site = site or ["mlp"] * len(kind)
    keys = [
        NodeKey(k, int(l), int(p), int(ft), s) for k, l, p, ft, s in zip(kind, layer, position, feature, site)
    ]
    return [Supernode(n, tuple(keys[indptr[i] : indptr[i + 1]])) for i, n in enumerate(names)]

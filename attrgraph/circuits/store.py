"""HDF5 storage of component circuits and their scores, beside attribution graphs.

1. Layout: `/circuits/<name>/` in the same kind of file as `/graphs/<name>/` (store.py):
   attributes `schema_version`, `method`, `n_layers`, `n_heads`, `has_mlp`, `parallel`, `meta` (JSON),
   `positions` (names; absent for non-positional circuits); datasets `resid` (bool),
   `attn` and `attn_valid` (positional only), and, when scores are given,
   `scores/resid` and `scores/attn`. Text is fixed-length UTF-8 (in the checksummed object
   header, as store.py writes it), arrays are chunked with fletcher32 checksums; files written
   before that, with variable-length strings and plain arrays, read the same.
2. Writing is atomic: a copy of the old file plus the new group goes to a temporary
   file in the same folder, renamed over the target. A file there that is not HDF5 is refused.
3. Reading: a missing, foreign, truncated or damaged file, or a circuit group lacking a part or
   of the wrong shapes, raises `GraphFileError` in one sentence (never an h5py error).
4. `to_networkx` gives a MultiDiGraph: nodes as in construct.edge_table, named
   ("a1.h2@t5", "a1.h2.k@t3", "logits"), one edge per circuit edge with its score.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import h5py
import numpy as np
import torch

from attrgraph.circuits.circuit import Circuit, EdgeLayout, EdgeScores
from attrgraph.circuits.construct import edge_table
from attrgraph.circuits.graph import QKV, ComponentGraph
from attrgraph.errors import GraphFileError
from attrgraph.graph.store import check_name, check_output, edit_h5

SCHEMA_VERSION = 1
# what h5py, HDF5, numpy and json raise on a damaged file or group (a failed checksum is an OSError)
_H5_ERRORS = (OSError, KeyError, RuntimeError, ValueError, TypeError, IndexError, AttributeError)


def _text(value: str) -> np.ndarray:
    """A string as fixed-length UTF-8 (store.py's `_write_text`: kept in the checksummed header)."""
    data = value.encode("utf-8") or b" "
    return np.array(data, dtype=h5py.string_dtype("utf-8", len(data)))


def _texts(values) -> np.ndarray:
    data = [str(v).encode("utf-8") for v in values]
    return np.array(data, dtype=h5py.string_dtype("utf-8", max([1, *map(len, data)])))


def _str(raw) -> str:
    """A stored string, fixed-length (bytes) or variable-length (str or bytes) alike."""
    if isinstance(raw, np.ndarray) and raw.ndim == 0:
        raw = raw[()]
    return raw.decode("utf-8") if isinstance(raw, bytes | np.bytes_) else str(raw)


def _array(group: h5py.Group, name: str, values: np.ndarray) -> None:
    group.create_dataset(
        name, data=values, chunks=True if values.size else None, fletcher32=bool(values.size)
    )


def _check_file(path: Path) -> None:
    if not path.is_file():
        raise GraphFileError(f"{path} does not exist or is not a file; pass a file written by save_circuit.")
    try:
        ok = h5py.is_hdf5(path)
    except _H5_ERRORS:
        ok = False
    if not ok:
        raise GraphFileError(f"{path} is not an HDF5 file; pass a file written by save_circuit.")


def _damaged(where: str, e: Exception) -> GraphFileError:
    reason = str(e).splitlines()[0][:200] if str(e) else type(e).__name__
    return GraphFileError(
        f"{where} is damaged or incomplete ({type(e).__name__}: {reason}); write it again with save_circuit."
    )


def save_circuit(
    circuit: Circuit, path: str | os.PathLike, name: str, scores: EdgeScores | None = None
) -> str:
    """Add (or replace) circuit `name` in the HDF5 file at `path`; returns the name."""
    check_name(name, kind="circuit")
    check_output(path, kind="circuit")
    with edit_h5(path) as f:
        f.attrs.setdefault("format", "attrgraph")
        root = f.require_group("circuits")
        if name in root:
            del root[name]
        grp = root.create_group(name)
        g = circuit.layout.graph
        grp.attrs.update(
            schema_version=SCHEMA_VERSION,
            method=_text(circuit.method),
            n_layers=g.n_layers,
            n_heads=g.n_heads,
            has_mlp=g.has_mlp,
            parallel=g.parallel,
            meta=_text(json.dumps(circuit.meta, default=str)),
        )
        _array(grp, "resid", circuit.resid.cpu().numpy())
        if circuit.layout.positional:
            grp.attrs["positions"] = _texts(circuit.layout.positions)
            _array(grp, "attn", circuit.attn.cpu().numpy())
            _array(grp, "attn_valid", circuit.layout.attn_valid.cpu().numpy())
        if scores is not None:
            _array(grp, "scores/resid", scores.resid.float().cpu().numpy())
            if scores.attn is not None:
                _array(grp, "scores/attn", scores.attn.float().cpu().numpy())
    return name


def _open(path: str | os.PathLike) -> h5py.File:
    path = Path(path)
    _check_file(path)
    try:
        return h5py.File(path, "r")
    except _H5_ERRORS as e:
        raise _damaged(str(path), e) from None


def list_circuits(path: str | os.PathLike) -> list[str]:
    """Names of the circuits stored in `path`."""
    with _open(path) as f:
        try:
            return sorted(f["circuits"]) if "circuits" in f else []
        except _H5_ERRORS as e:
            raise _damaged(str(path), e) from None


def load_circuit(path: str | os.PathLike, name: str) -> tuple[Circuit, EdgeScores | None]:
    """Read circuit `name` (and its scores, if stored) from `path` (step 3)."""
    with _open(path) as f:
        where = f"{path}:/circuits/{name}"
        try:
            if "circuits" not in f or name not in f["circuits"]:
                have = sorted(f["circuits"]) if "circuits" in f else []
                raise GraphFileError(f"{path} holds no circuit {name!r}; it holds {have or 'none'}.")
            return _read(f["circuits"][name], where)
        except GraphFileError:
            raise
        except _H5_ERRORS as e:  # a missing attribute or dataset, bad JSON, a failed checksum
            raise _damaged(where, e) from None


def _read(grp: h5py.Group, where: str) -> tuple[Circuit, EdgeScores | None]:
    version = int(grp.attrs.get("schema_version", -1))
    if version != SCHEMA_VERSION:
        raise GraphFileError(
            f"{where} has schema version {version}, this attrgraph reads {SCHEMA_VERSION}; write it again with save_circuit."
        )
    graph = ComponentGraph(
        int(grp.attrs["n_layers"]),
        int(grp.attrs["n_heads"]),
        bool(grp.attrs["has_mlp"]),
        bool(grp.attrs.get("parallel", False)),  # files before parallel blocks hold sequential ones
    )

    def read(key: str, shape: tuple, dtype=None) -> torch.Tensor:
        value = np.asarray(grp[key][()], dtype)
        if value.shape != tuple(shape):
            raise GraphFileError(
                f"{where}/{key} has shape {value.shape}, expected {tuple(shape)}; the file is damaged."
            )
        return torch.from_numpy(value)

    positions = (
        tuple(_str(s) for s in np.atleast_1d(grp.attrs["positions"])) if "positions" in grp.attrs else None
    )
    positional = positions is not None
    layout = EdgeLayout(
        graph, positions, read("attn_valid", (len(positions),) * 2, bool) if positional else None
    )
    rv, av = layout.resid_valid().shape, layout.attn_valid_full().shape if positional else None
    resid = read("resid", rv, bool)
    attn = read("attn", av, bool) if positional else None
    meta = json.loads(_str(grp.attrs["meta"]))
    if not isinstance(meta, dict):
        raise GraphFileError(f"{where} attribute 'meta' is not a JSON object; the file is damaged.")
    circuit = Circuit(layout, resid, attn, _str(grp.attrs["method"]), meta)
    scores = None
    if "scores" in grp:
        s_attn = read("scores/attn", av) if positional and "attn" in grp["scores"] else None
        scores = EdgeScores(layout, read("scores/resid", rv), s_attn, circuit.method)
    return circuit, scores


def node_names(layout: EdgeLayout) -> list[str]:
    """Names of the nodes of construct.edge_table's node graph."""
    g = layout.graph
    if not layout.positional:
        return [*g.up_names, "logits"]
    names = [f"{u}@{p}" for p in layout.positions for u in g.up_names]
    for p in layout.positions:
        names += [
            f"a{layer}.h{h}.{s}@{p}" for layer in range(g.n_layers) for h in range(g.n_heads) for s in QKV
        ]
    return [*names, "logits"]


def circuit_to_networkx(circuit: Circuit, scores: EdgeScores | None = None):
    """The circuit as a networkx MultiDiGraph (module docstring, step 3)."""
    import networkx as nx

    parent, child, _, _, _ = edge_table(circuit.layout)
    names = node_names(circuit.layout)
    kept = circuit.flat().cpu().numpy()
    values = scores.flat().cpu().numpy() if scores is not None else np.full(len(kept), np.nan)
    out = nx.MultiDiGraph(method=circuit.method)
    for e in np.flatnonzero(kept):
        out.add_edge(names[parent[e]], names[child[e]], score=float(values[e]))
    return out

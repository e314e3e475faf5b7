"""HDF5 storage of component circuits and their scores, beside attribution graphs.

1. Layout: `/circuits/<name>/` in the same kind of file as `/graphs/<name>/` (store.py):
   attributes `schema_version`, `method`, `n_layers`, `n_heads`, `has_mlp`, `meta` (JSON),
   `positions` (names; absent for non-positional circuits); datasets `resid` (bool),
   `attn` and `attn_valid` (positional only), and, when scores are given,
   `scores/resid` and `scores/attn`.
2. Writing is atomic: a copy of the old file plus the new group goes to a temporary
   file in the same folder, renamed over the target.
3. `to_networkx` gives a MultiDiGraph: nodes as in construct.edge_table, named
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
from attrgraph.graph.store import edit_h5

SCHEMA_VERSION = 1


def save_circuit(
    circuit: Circuit, path: str | os.PathLike, name: str, scores: EdgeScores | None = None
) -> str:
    """Add (or replace) circuit `name` in the HDF5 file at `path`; returns the name."""
    path = Path(path)
    with edit_h5(path) as f:
        f.attrs.setdefault("format", "attrgraph")
        root = f.require_group("circuits")
        if name in root:
            del root[name]
        grp = root.create_group(name)
        g = circuit.layout.graph
        grp.attrs.update(
            schema_version=SCHEMA_VERSION,
            method=circuit.method,
            n_layers=g.n_layers,
            n_heads=g.n_heads,
            has_mlp=g.has_mlp,
            meta=json.dumps(circuit.meta, default=str),
        )
        grp.create_dataset("resid", data=circuit.resid.cpu().numpy())
        if circuit.layout.positional:
            grp.attrs["positions"] = np.array(circuit.layout.positions, dtype=h5py.string_dtype())
            grp.create_dataset("attn", data=circuit.attn.cpu().numpy())
            grp.create_dataset("attn_valid", data=circuit.layout.attn_valid.cpu().numpy())
        if scores is not None:
            grp.create_dataset("scores/resid", data=scores.resid.float().cpu().numpy())
            if scores.attn is not None:
                grp.create_dataset("scores/attn", data=scores.attn.float().cpu().numpy())
    return name


def list_circuits(path: str | os.PathLike) -> list[str]:
    with h5py.File(path, "r") as f:
        return sorted(f["circuits"]) if "circuits" in f else []


def load_circuit(path: str | os.PathLike, name: str) -> tuple[Circuit, EdgeScores | None]:
    """Read circuit `name` (and its scores, if stored) from `path`."""
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise GraphFileError(
            f"{path} is not a readable HDF5 file ({e}); pass a file written by save_circuit."
        ) from e
    with f:
        if "circuits" not in f or name not in f["circuits"]:
            have = sorted(f["circuits"]) if "circuits" in f else []
            raise GraphFileError(f"{path} holds no circuit {name!r}; it holds {have or 'none'}.")
        grp = f["circuits"][name]
        if int(grp.attrs["schema_version"]) != SCHEMA_VERSION:
            raise GraphFileError(
                f"circuit {name!r} has schema version {grp.attrs['schema_version']}, expected {SCHEMA_VERSION}."
            )
        graph = ComponentGraph(
            int(grp.attrs["n_layers"]), int(grp.attrs["n_heads"]), bool(grp.attrs["has_mlp"])
        )
        positional = "positions" in grp.attrs
        layout = EdgeLayout(
            graph,
            tuple(s.decode() if isinstance(s, bytes) else str(s) for s in grp.attrs["positions"])
            if positional
            else None,
            torch.from_numpy(grp["attn_valid"][()]) if positional else None,
        )
        resid = torch.from_numpy(grp["resid"][()])
        if resid.shape != layout.resid_valid().shape:
            raise GraphFileError(
                f"circuit {name!r}: resid has shape {tuple(resid.shape)}, expected {tuple(layout.resid_valid().shape)}."
            )
        attn = torch.from_numpy(grp["attn"][()]) if positional else None
        circuit = Circuit(layout, resid, attn, str(grp.attrs["method"]), json.loads(grp.attrs["meta"]))
        scores = None
        if "scores" in grp:
            s_attn = torch.from_numpy(grp["scores/attn"][()]) if "attn" in grp["scores"] else None
            scores = EdgeScores(layout, torch.from_numpy(grp["scores/resid"][()]), s_attn, circuit.method)
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

"""Feature labels and dashboards for a graph, borrowed from its transcoder set at view time.

Graphs name features by (layer, feature); the dashboards (transcoders/dashboards.py) belong to
a transcoder set and live beside it as `dashboards.h5` (transcoders/dashboard_file.py, read
only here). Which set a graph was built with is found in this order:

1. `dashboards=` given by the caller: a dashboards file, a set folder holding one, or a bundled
   set's name ("default-plt").
2. The graph's `meta["transcoders"]` (what `attrgraph build --transcoders` records): a bundled
   name or a folder with a `dashboards.h5`.
3. Otherwise, the graph's `meta["transcoder_fingerprint"]` (every attribution method records it)
   equal to the fingerprint of a bundled set (engine/sources.py `fingerprint`), so a graph built from
   Python on a bundled set finds its dashboards without being told.
A file is used only when its layer count and width fit the graph's; otherwise, or when none is
found, features are labelled `L{layer}/F{feature}` and the view says why.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import NamedTuple

from attrgraph.errors import GraphFileError


class DashboardSource(NamedTuple):
    """The dashboards a view uses (or None) and one sentence saying where they came from."""

    dashboards: object | None
    """A `transcoders.dashboard_file.Dashboards`, or None."""
    note: str


def _resolve(spec: str | os.PathLike) -> Path:
    from transcoders.dashboard_file import FILE_NAME
    from transcoders.paths import BUNDLED

    path = BUNDLED.get(str(spec), Path(spec))
    return path / FILE_NAME if path.is_dir() else path


def load_cached(path: str | os.PathLike):
    """The dashboards file at `path`, read once per process and file version (size, mtime)."""
    path = Path(path).resolve()
    st = path.stat()
    return _load_version(path, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _load_version(path: Path, size: int, mtime_ns: int):
    from transcoders.dashboard_file import load_dashboards

    return load_dashboards(path)


@functools.cache
def _bundled_fingerprint(name: str) -> str:
    from attrgraph.engine.sources import fingerprint
    from transcoders.formats import load_transcoders

    return fingerprint(load_transcoders(name))


def _fits(dashboards, meta: dict) -> str | None:
    """Why `dashboards` cannot label this graph's features (None when they can)."""
    n_layers, d_sae = meta.get("n_layers"), meta.get("transcoder_d_sae")
    if n_layers is not None and int(n_layers) != dashboards.n_layers:
        return f"{dashboards.path} covers {dashboards.n_layers} layers, the graph {n_layers}"
    if d_sae is not None and int(d_sae) != dashboards.d_sae:
        return f"{dashboards.path} has {dashboards.d_sae} features per layer, the graph's set {d_sae}"
    return None


def find_dashboards(meta: dict, given: str | os.PathLike | None = None) -> DashboardSource:
    """The dashboards for a graph with this `meta` (module docstring, steps 1-3)."""
    from transcoders.paths import BUNDLED

    if given is not None:
        path = _resolve(given)
        if not path.is_file():
            raise GraphFileError(
                f"no dashboards file at {path}; pass a dashboards.h5, a transcoder folder holding one, "
                "or compute it with `python -m transcoders.dashboards --transcoders SET`."
            )
        candidates = [path]
    else:
        named = _resolve(str(meta["transcoders"])) if meta.get("transcoders") else None
        candidates = [named] if named is not None and named.is_file() else []
        fp = meta.get("transcoder_fingerprint")
        if not candidates and fp:  # step 3
            candidates = [
                _resolve(name)
                for name in BUNDLED
                if _resolve(name).is_file() and _bundled_fingerprint(name) == fp
            ]
    problems = []
    for path in candidates:
        dashboards = load_cached(path)
        problem = _fits(dashboards, meta)
        if problem is None:
            return DashboardSource(dashboards, f"labels and dashboards from {path}")
        problems.append(problem)
    reason = "; ".join(problems) if problems else "none found for this graph's transcoders"
    return DashboardSource(
        None,
        f"no feature dashboards ({reason}); features are labelled L{{layer}}/F{{feature}}. Compute them "
        "with `python -m transcoders.dashboards --transcoders SET` and pass --dashboards.",
    )


def feature_dashboard(dashboards, layer: int, feature: int) -> dict | None:
    """One feature's dashboard as JSON-ready values, trimmed to what the viewer shows."""
    if not (0 <= layer < dashboards.n_layers and 0 <= feature < dashboards.d_sae):
        return None
    d = dashboards.feature(layer, feature)
    d.pop("histogram", None)
    for example in d["top"] + [e for q in d["quantiles"] for e in q["examples"]]:
        example.pop("token_ids", None)
    return d

"""Which feature dashboards describe a graph's features: the one lookup of the viewer
(viewer/dashboards.py) and the Neuronpedia export (neuronpedia_features.py).

Dashboards (transcoders/dashboards.py) belong to a set and live beside it as `dashboards.h5`
(transcoders/dashboard_file.py). A graph has up to two sets, one per `SITES` entry: "mlp", its
transcoders, and "attn", its attention-output SAEs (when it was built with `[mlp_set, attn_set]`).
Per site, in this order:

1. `given` by the caller: a loaded `Dashboards`, a dashboards file, a set folder holding one, or a
   bundled set's name ("default-plt"). None there is an error (`GraphFileError`), and so is a file
   that cannot be read (`DashboardFileError`).
2. The set the graph names, `meta["transcoders"]` / `meta["attn_transcoders"]` (what `attrgraph
   build` records): a bundled name or a folder with a `dashboards.h5`.
3. Otherwise its fingerprint, `meta["transcoder_fingerprint"]` / `meta["attn_transcoder_fingerprint"]`
   (every attribution method records them, engine/sources.py `graph_provenance`), equal to that of
   a bundled set (fingerprint.py), so that a graph built from Python on bundled sets finds their
   dashboards without being told.
A file is used only when its layer count and width fit the graph's (`meta["n_layers"]`,
`meta["transcoder_d_sae"]` / `meta["attn_transcoder_d_sae"]`); a found file that does not fit,
cannot be read, or records the fingerprint of another set than the graph's (a stale file beside a
set retrained in its folder describes other features) is passed over. A given file of another set
is used, as asked, with a caveat saying so. The result says where the dashboards came from, or in one clause
why there are none. Files (and bundled sets' fingerprints) are read once per process and file
version (size, mtime).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from attrgraph.errors import GraphFileError
from transcoders.arguments import shown

if TYPE_CHECKING:
    from transcoders.dashboard_file import Dashboards

SITES = ("mlp", "attn")
"""The sites a graph's features sit at: its transcoder set's ("mlp") and its attention set's."""
_PREFIX = {"mlp": "", "attn": "attn_"}
SET_NAMES = {"mlp": "transcoder set", "attn": "attention set"}
"""What each site's set is called in messages."""


class FoundDashboards(NamedTuple):
    """The dashboards for one site of a graph (or None) and where they came from."""

    dashboards: Dashboards | None
    reason: str
    """Found: where from ("given", "named by the graph", "by fingerprint") with the file; none: why,
    one clause without a final period."""
    given: bool = False
    """Whether the caller passed them (step 1)."""
    caveat: str | None = None
    """Given dashboards that fit but were computed for another set (`other_set`): used, as asked,
    and this clause says so."""


def resolve_path(spec: str | os.PathLike) -> Path:
    """The dashboards file a spec names: a file, `dashboards.h5` in a set folder, or a bundled set's."""
    from transcoders.dashboard_file import FILE_NAME
    from transcoders.paths import BUNDLED

    if not isinstance(spec, str | os.PathLike) or isinstance(spec, bytes):
        raise GraphFileError(
            f"dashboards is a {type(spec).__name__} ({shown(spec)}); pass a dashboards.h5, a transcoder folder "
            "holding one, a bundled set's name or a loaded transcoders.Dashboards."
        )
    path = BUNDLED.get(str(spec), Path(spec))
    return path / FILE_NAME if path.is_dir() else path


def load_cached(path: str | os.PathLike) -> Dashboards:
    """The dashboards file at `path`, read once per process and file version (size, mtime)."""
    path = Path(path).resolve()
    st = path.stat()
    return _load_version(path, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _load_version(path: Path, size: int, mtime_ns: int) -> Dashboards:
    from transcoders.dashboard_file import load_dashboards

    return load_dashboards(path)


def bundled_fingerprint(name: str) -> str:
    """The fingerprint (fingerprint.py) of bundled set `name`, once per process and version of its files."""
    from transcoders.dashboard_file import FILE_NAME
    from transcoders.paths import BUNDLED

    files = sorted(p for p in BUNDLED[name].iterdir() if p.is_file() and p.name != FILE_NAME)
    version = tuple((p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in files)
    return _fingerprint_version(name, version)


@functools.lru_cache(maxsize=8)
def _fingerprint_version(name: str, version: tuple) -> str:
    from transcoders.fingerprint import fingerprint
    from transcoders.formats import load_transcoders

    return fingerprint(load_transcoders(name))


def site_meta(meta: dict, site: str) -> dict:
    """The provenance of one site's set: `transcoders`, `transcoder_fingerprint`, `transcoder_d_sae`
    (from the `attn_` keys for "attn") and `n_layers`, those the graph records."""
    if site not in SITES:
        raise ValueError(f"site {site!r} is none of {SITES}")
    p = _PREFIX[site]
    keys = {"transcoders": f"{p}transcoders", "transcoder_fingerprint": f"{p}transcoder_fingerprint"}
    keys.update(transcoder_d_sae=f"{p}transcoder_d_sae", n_layers="n_layers")
    return {k: meta[m] for k, m in keys.items() if meta.get(m) is not None}


def fits(dashboards: Dashboards, meta: dict, site: str = "mlp") -> str | None:
    """Why `dashboards` cannot describe the features of this site of a graph with `meta` (None when
    they can): another layer count or width."""
    m = site_meta(meta, site)
    n_layers, d_sae = m.get("n_layers"), m.get("transcoder_d_sae")
    if n_layers is not None and int(n_layers) != dashboards.n_layers:
        return f"{dashboards.path} covers {dashboards.n_layers} layers, the graph {n_layers}"
    if d_sae is not None and int(d_sae) != dashboards.d_sae:
        return f"{dashboards.path} has {dashboards.d_sae} features per layer, the graph's {SET_NAMES[site]} {d_sae}"
    return None


def other_set(dashboards: Dashboards, meta: dict, site: str = "mlp") -> str | None:
    """Where both record it, that `dashboards` were computed for a set of another fingerprint than
    this site's of the graph (a set retrained in its folder beside its old file); None otherwise."""
    theirs = dashboards.attrs.get("transcoder_fingerprint")
    ours = site_meta(meta, site).get("transcoder_fingerprint")
    if theirs and ours and str(theirs) != str(ours):
        return (
            f"{dashboards.path} was computed for another set (fingerprint {theirs}; the graph's "
            f"{SET_NAMES[site]} is {ours}: retrained, or loaded in another dtype)"
        )
    return None


def find_dashboards(
    meta: dict, site: str = "mlp", given: str | os.PathLike | Dashboards | None = None
) -> FoundDashboards:
    """The dashboards for the `site` features of a graph with this `meta` (module docstring, steps 1-3)."""
    from transcoders.dashboard_file import Dashboards
    from transcoders.errors import DashboardFileError
    from transcoders.paths import BUNDLED

    m = site_meta(meta, site)
    if given is not None and not isinstance(given, Dashboards):
        path = resolve_path(given)
        if not path.is_file():
            raise GraphFileError(
                f"no dashboards file at {path} ({path.name} does not exist); pass a dashboards.h5, a transcoder "
                "folder holding one, or compute it with `python -m transcoders.dashboards --transcoders SET`."
            )
        given = load_cached(path)  # asked for by name: an unreadable file is an error
    if given is not None:
        problem = fits(given, meta, site)
        if problem is not None:
            return FoundDashboards(None, problem, True)
        return FoundDashboards(given, f"given, {given.path}", True, other_set(given, meta, site))  # as asked
    problems, how = [], "named by the graph"
    name = m.get("transcoders")
    candidates = []
    if not name:
        problems.append(f"the graph names no {SET_NAMES[site]}")
    else:
        path = resolve_path(str(name))
        if path.is_file():
            candidates = [path]
        else:
            problems.append(f"no dashboards for {SET_NAMES[site]} {name!r} ({path} is missing)")
    fp = m.get("transcoder_fingerprint")
    if not candidates and fp:  # step 3
        how = "found by its fingerprint"
        candidates = [
            resolve_path(b) for b in BUNDLED if resolve_path(b).is_file() and bundled_fingerprint(b) == fp
        ]
        if not candidates:
            problems.append("no bundled set has its fingerprint")
    refused = []  # when there are candidates, why each was passed over is the reason
    for path in candidates:
        try:
            dashboards = load_cached(path)
        except DashboardFileError as e:
            refused.append(str(e).rstrip("."))
            continue
        problem = fits(dashboards, meta, site) or other_set(dashboards, meta, site)
        if problem is None:
            return FoundDashboards(dashboards, f"{how}, {path}")
        refused.append(problem)
    return FoundDashboards(None, "; ".join(refused or problems))


def find_site_dashboards(
    meta: dict, given: dict[str, str | os.PathLike | Dashboards | None] | None = None
) -> dict[str, FoundDashboards]:
    """`find_dashboards` for every site of `SITES`, each with its `given` entry, if any."""
    given = given or {}
    unknown = set(given) - set(SITES)
    if unknown:
        raise ValueError(f"sites {sorted(unknown)} are none of {SITES}")
    return {site: find_dashboards(meta, site, given.get(site)) for site in SITES}

"""Feature labels and dashboards for a graph, borrowed from its sets at view time.

Which dashboards file describes a graph's MLP-site features and which its attention features is
graph/dashboard_lookup.py's answer (the export uses the same lookup); here it becomes the
view's note: where the labels come from, or why features are labelled `L{layer}/F{feature}`
(`A{layer}/F{feature}` for attention features). A file that does not fit the graph is not used.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from attrgraph.graph.dashboard_lookup import find_dashboards as lookup


class DashboardSource(NamedTuple):
    """The dashboards a view uses (or None) and one sentence saying where they came from."""

    dashboards: object | None
    """A `transcoders.dashboard_file.Dashboards`, or None."""
    note: str


def find_dashboards(meta: dict, given: str | os.PathLike | None = None, site: str = "mlp") -> DashboardSource:
    """The dashboards for the `site` features of a graph with this `meta` (dashboard_lookup.py), with
    the view's note. `given`: a dashboards file, a set folder holding one, or a bundled set's name."""
    found = lookup(meta, site, given)
    if found.dashboards is not None:
        caveat = f"; careful: {found.caveat}" if found.caveat else ""
        return DashboardSource(
            found.dashboards, f"labels and dashboards from {found.dashboards.path}{caveat}"
        )
    letter, flag = ("A", "--attn-dashboards") if site == "attn" else ("L", "--dashboards")
    return DashboardSource(
        None,
        f"no {'attention ' if site == 'attn' else ''}feature dashboards ({found.reason}); features are "
        f"labelled {letter}{{layer}}/F{{feature}}. Compute them with `python -m transcoders.dashboards "
        f"--transcoders SET` and pass {flag}.",
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

"""`attrgraph.show(graph)`: the viewer's page for one graph, self-contained, inside Jupyter.

1. The payload is the server's (payload.graph_payload; labels and dashboards found as
   dashboards.py says, or from `dashboards=`).
2. One HTML document holds everything: static/index.html with viewer.css and viewer.js inlined
   and the payload as `window.ATTRGRAPH_DATA`, so it needs no server and no network, and an
   executed notebook keeps a working view. In the notebook it sits in an `<iframe srcdoc>`, so
   its script and styles do not touch the notebook's.
3. The view is read-only: supernodes grouped in it are not written back (use
   `attrgraph.save_supernodes`, or `attrgraph serve` on the stored file).
`show` returns a `GraphView`; Jupyter displays it through `_repr_html_` (no IPython import), and
`GraphView.save(path)` writes the standalone page.
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Sequence
from pathlib import Path

from attrgraph.errors import OptionError
from attrgraph.graph.graph import Graph, check_graph
from attrgraph.graph.supernodes import Supernode
from attrgraph.viewer.dashboards import find_dashboards
from attrgraph.viewer.payload import graph_payload
from attrgraph.viewer.server import STATIC

CSS_LINK = '<link rel="stylesheet" href="static/viewer.css">'
JS_TAG = '<script src="static/viewer.js"></script>'


def _script_safe(text: str) -> str:
    """Text that cannot end the `<script>` element holding it."""
    return text.replace("</", "<\\/").replace("<!--", "<\\!--")


def standalone_html(payload: dict) -> str:
    """The page of step 2 for one payload."""
    page = (STATIC / "index.html").read_text(encoding="utf-8")
    css = (STATIC / "viewer.css").read_text(encoding="utf-8")
    js = (STATIC / "viewer.js").read_text(encoding="utf-8")
    data = json.dumps(payload, allow_nan=False, separators=(",", ":"))
    page = page.replace(CSS_LINK, f"<style>\n{css}</style>")
    return page.replace(
        JS_TAG,
        f"<script>window.ATTRGRAPH_DATA = {_script_safe(data)};</script>\n<script>\n{_script_safe(js)}</script>",
    )


class GraphView:
    """A graph's viewer page; shown by Jupyter, or saved with `save`."""

    def __init__(self, payload: dict, height: int = 640):
        self.payload = payload
        self.height = int(height)
        self.html = standalone_html(payload)
        """The standalone page."""

    def __repr__(self) -> str:
        p = self.payload
        return f"GraphView({p['name']!r}: {len(p['nodes'])} nodes, {len(p['edges'])} edges)"

    def _repr_html_(self) -> str:
        return (
            f'<iframe srcdoc="{html.escape(self.html, quote=True)}" style="width:100%;height:{self.height}px;'
            'border:1px solid #ddd" title="attrgraph viewer"></iframe>'
        )

    def save(self, path: str | os.PathLike) -> Path:
        """Write the standalone page to `path` (opens in any browser, offline)."""
        path = Path(path)
        path.write_text(self.html, encoding="utf-8")
        return path


def show(
    graph: Graph,
    name: str = "graph",
    supernodes: Sequence[Supernode] = (),
    dashboards: str | os.PathLike | None = None,
    height: int = 640,
    attn_dashboards: str | os.PathLike | None = None,
) -> GraphView:
    """The viewer for `graph` in a notebook (module docstring). `dashboards`: a dashboards file,
    a transcoder folder or a bundled set name, when the graph's own cannot be found;
    `attn_dashboards`: the same for its attention features."""
    check_graph(graph, "show")
    if isinstance(height, bool) or not isinstance(height, int) or height < 1:
        raise OptionError(f"height is {height!r}; pass the view's height in pixels, such as 640.")
    source = find_dashboards(graph.meta, dashboards)
    attn = None if attn_dashboards is None else find_dashboards(graph.meta, attn_dashboards, "attn")
    payload = graph_payload(graph, name, supernodes, source, attn)
    payload["notes"] = payload["notes"] + [
        "A read-only view: supernodes grouped here are not saved (use attrgraph.save_supernodes, or "
        "`attrgraph serve FILE`)."
    ]
    return GraphView(dict(payload, editable=False), height)

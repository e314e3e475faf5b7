"""`attrgraph serve FILE`: a local HTTP server for the viewer page (stdlib `http.server`).

1. Access (access.py, DESIGN.md "The viewer's security model"): bound to 127.0.0.1 unless
   another host is asked for. Every request's `Host` is in an exact allowlist (DNS rebinding);
   beyond loopback a random token, printed once in the URL, is required on every API call.
   Writes (POST) are `application/json` only, with `Origin` absent or the served origin (never
   `null`): a cross-site form can send neither.
2. Connections: a refused request, whatever its body, gets its reply with `Connection: close`
   and the connection is closed, so an unread body is never parsed as a next request (request
   smuggling via a `text/plain` form whose body is a whole request); `Transfer-Encoding` is
   refused. A request's head is read by connection.py (at most `MAX_HEAD` bytes, within
   `HEAD_TIMEOUT` seconds of its first byte; 414 / 431 past it); an idle connection is closed
   after `SOCKET_TIMEOUT` seconds; at most `MAX_CONNECTIONS` are served at once, the next gets
   503 before a byte of it is read; the listen backlog is `BACKLOG`. An absolute-form target
   (`GET http://host/...`) is refused (400); a client that drops leaves no traceback.
   Every response refuses framing and carries the page's CSP (access.py step 5); API reads not
   from the page are refused before any work (access.py step 4).
3. Routes (GET unless said):
     /                        the page (static/index.html)
     /static/NAME             a file of static/; a path that leaves that folder, a symlink
                              out of it included, is refused (403)
     /api/graphs              {"file", "graphs": [...], "circuits": [...]}
     /api/graph?name=NAME     payload.graph_payload of a stored graph (dashboards.py finds labels)
     /api/circuit?name=NAME   circuit_payload.circuit_payload of a stored circuit
     POST /api/supernodes     supernode_request.py: checked, then stored with
                              supernode_store.save_supernodes (the one atomic writer)
     POST /api/labels         label_request.py: checked, then `transcoders.set_labels` on the
                              dashboards file that labels those features (the same writer)
     POST /api/view           `{"graph", "link"}`: a shared Neuronpedia link read against a stored
                              graph (graph/shared_view.py; supernode_request.storable), for the
                              page to show; nothing is written (a POST, under the writes' rules,
                              because a link can be longer than a request line may be)
     POST /api/link           link_request.py: the page's supernodes and pins as a Neuronpedia
                              link (`view_link`), the inverse of /api/view; nothing is written
     /api/global?graph=NAME&node=ID[&k=K]
                              global_request.py: a feature's strongest global connections
     /api/heads?graph=NAME&source=ID&target=ID
                              heads_request.py: the attention heads that carried an edge
   The last two need the graph's model and sets (model_hub.py: loaded once, shared; what the
   graph's meta records, or serve's --model / --transcoders / --attn-transcoders).
   Every error is JSON `{"error": sentence}`: 400 (a bad request; nothing written or computed), 403, 404,
   411, 413, 500 or 501, also for what http.server itself refuses and for a file removed while
   serving.
4. Payloads are cached per (kind, name) and file version (size, mtime), with their reply bytes
   (encoded.py: JSON and gzip made once, not per request); a write changes the
   version, so the next read sees it. One build per (kind, name) at a time: concurrent first
   requests wait for the one build. Writes take a lock (and edit_h5 its file lock). The model
   panels' answers are cached too (model_hub.MAX_CACHED each); head loadings run one at a time
   per model (`model_lock`, analysis/head_loadings.py).
"""

from __future__ import annotations

import errno
import http.client
import io
import json
import os
import re
import socket
import sys
import threading
import traceback
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from attrgraph.errors import (
    AttrgraphError,
    GraphError,
    GraphFileError,
    LabelError,
    OptionError,
    ServeError,
    SupernodeError,
    ViewError,
    ViewRequestError,
)
from attrgraph.viewer.access import (
    CSP,
    LOOPBACK_NAMES,
    PAGE_HEADER,
    TOKEN_HEADER,
    WILDCARDS,
    Access,
    is_loopback,
    read_from_page,
)
from attrgraph.viewer.connection import HEAD_TIMEOUT, MAX_HEAD, ConnectionReader, TooLarge
from attrgraph.viewer.encoded import Encoded, accepts_gzip, encode
from attrgraph.viewer.lru import LruCache

STATIC = Path(__file__).resolve().parent / "static"
"""The page's files (package data)."""
CONTENT_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".png": "image/png"}
LOOPBACK = LOOPBACK_NAMES
SOCKET_TIMEOUT = 20.0
"""Seconds a connection may sit idle (headers without their body, a kept-alive connection)."""
BACKLOG = 256
"""Listen backlog (socketserver's default of 5 resets a page's burst of requests)."""
MAX_CONNECTIONS = 256
"""Connections served at once; the next is answered 503 and closed before a byte of it is read.
Each holds at most `connection.MAX_HEAD` bytes of head and a thread, for `HEAD_TIMEOUT` seconds."""
WRITES = ("/api/supernodes", "/api/labels")
POST_READS = ("/api/view", "/api/link")
"""POSTs that write nothing (step 3), checked as the writes are."""
MODEL_READS = ("/api/global", "/api/heads")
"""The reads that need the graph's model (step 3)."""
SECURITY_HEADERS = (
    ("Cache-Control", "no-store"),
    ("X-Content-Type-Options", "nosniff"),
    ("Referrer-Policy", "no-referrer"),  # the token is in the page's URL
    ("X-Frame-Options", "DENY"),  # access.py step 5, for browsers without CSP frame-ancestors
    ("Content-Security-Policy", CSP),
)
"""Sent on every response, errors included."""
TOKEN_IN_URL = re.compile(r"(^|[?&\s])token=[^&\s\"]*")
"""A token in a logged request line (`--verbose`), shown as `token=<hidden>`."""
MAX_VIEWS = 4
"""Graphs (with their views) held for the model panels."""


def static_file(url_path: str, root: Path = STATIC) -> Path | None:
    """The file of `root` (static/) that a URL path under /static/ names, None when there is no
    such file. Raises `PermissionError` for a path that would leave `root` (`..`, absolute,
    backslashes, NUL; after percent-decoding, so `%2e%2e%2f` is caught too; and a symlink whose
    target lies outside, by the resolved path)."""
    rel = urllib.parse.unquote(url_path)
    parts = rel.replace("\\", "/").split("/")
    if "\0" in rel or "\\" in rel or rel.startswith("/") or any(p in ("..", ".") for p in parts):
        raise PermissionError(url_path)
    root = root.resolve()
    path = (root / rel).resolve()
    if not path.is_relative_to(root):
        raise PermissionError(url_path)
    return path if path.is_file() else None


class Viewer:
    """The state behind the routes: the graph file, the dashboards override, payload caches, and
    the model hub (`model`, `transcoders`, `attn_transcoders`: serve's overrides of what each
    graph's meta records, model_hub.py)."""

    def __init__(
        self,
        path: str | os.PathLike,
        dashboards: str | os.PathLike | None = None,
        attn_dashboards: str | os.PathLike | None = None,
        model: str | None = None,
        transcoders: str | None = None,
        attn_transcoders: str | None = None,
    ):
        from attrgraph.graph.store import list_graphs
        from attrgraph.viewer.model_hub import MAX_CACHED, ModelHub

        self.path = Path(path)
        self.dashboards, self.attn_dashboards = dashboards, attn_dashboards
        graphs = list_graphs(self.path)  # GraphFileError for a missing, foreign or damaged file
        if not graphs and not self.circuits():
            raise GraphFileError(
                f"{self.path} holds no graphs or circuits to view; write one with "
                f"`attrgraph build PROMPT -o {self.path}` (or `attrgraph circuit ... --out {self.path}`)."
            )
        from attrgraph.viewer.dashboards import find_dashboards

        for site, given in (("mlp", dashboards), ("attn", attn_dashboards)):
            if given is not None:  # a wrong --dashboards / --attn-dashboards is an error before serving
                find_dashboards({}, given, site)
        self.lock = threading.Lock()
        """Held by writes, and briefly around the caches."""
        self.cache: dict[tuple, tuple[dict, Encoded]] = {}
        """(payload, its reply bytes) per (kind, name, file version)."""
        self.index_lock = threading.Lock()
        self.index_cache: tuple[tuple[int, int], Encoded] | None = None
        self.build_locks: dict[tuple[str, str], threading.Lock] = {}
        self.label_files: dict[str, dict[str, Path | None]] = {}
        """Per graph, the dashboards file labelling its "mlp" / "attn" features (None: none)."""
        self.hub = ModelHub(model, transcoders, attn_transcoders)
        if graphs and (model or transcoders or attn_transcoders):
            self._load_overrides(graphs[0])
        self.views = LruCache(MAX_VIEWS)
        """(graph, view, index) per (name, file version), for the model panels."""
        self.head_answers = LruCache(MAX_CACHED)

    def _load_overrides(self, name: str) -> None:
        """A wrong --model / --transcoders / --attn-transcoders is an error before serving: load
        them (with what graph `name` records for the rest) now, which the panels then reuse."""
        from attrgraph.graph.store import load_meta

        try:
            self.hub.for_graph(load_meta(self.path, name))
        except (AttrgraphError, OSError, ValueError, KeyError) as e:
            given = [
                f"--{flag} {value}"
                for flag, value in (
                    ("model", self.hub.model),
                    ("transcoders", self.hub.transcoders),
                    ("attn-transcoders", self.hub.attn_transcoders),
                )
                if value
            ]
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ServeError(f"cannot load {' '.join(given)} for graph {name!r}: {first}") from None

    def version(self) -> tuple[int, int]:
        st = self.path.stat()
        return st.st_size, st.st_mtime_ns

    def graphs(self) -> list[str]:
        from attrgraph.graph.store import list_graphs

        return list_graphs(self.path)

    def circuits(self) -> list[str]:
        import h5py

        with h5py.File(self.path, "r") as f:
            return sorted(f["circuits"]) if "circuits" in f else []

    def index(self) -> dict:
        return {"file": self.path.name, "graphs": self.graphs(), "circuits": self.circuits()}

    def index_bytes(self) -> Encoded:
        """GET /api/graphs, encoded once per file version (encoded.py)."""
        version = self.version()
        with self.index_lock:  # a burst of first requests reads the file once
            if self.index_cache is None or self.index_cache[0] != version:
                self.index_cache = (version, encode(self.index()))
            return self.index_cache[1]

    def payload(self, kind: str, name: str) -> dict:
        return self._entry(kind, name)[0]

    def payload_bytes(self, kind: str, name: str) -> Encoded:
        """The payload as the reply's bytes, encoded with it, once per build (encoded.py)."""
        return self._entry(kind, name)[1]

    def _entry(self, kind: str, name: str) -> tuple[dict, Encoded]:
        key = (kind, name, self.version())
        with self.lock:
            hit = self.cache.get(key)
            build_lock = self.build_locks.setdefault((kind, name), threading.Lock())
        if hit is not None:
            return hit
        with build_lock:  # one build per graph: the others wait for it, then read the cache
            with self.lock:
                hit = self.cache.get(key)
            if hit is not None:
                return hit
            have = self.graphs() if kind == "graph" else self.circuits()
            if name not in have:
                raise LookupError(f"{self.path.name} has no {kind} named {name!r}; it holds {have}.")
            payload = self._build(kind, name)
            built = (payload, encode(payload))
            with self.lock:
                self.cache = {k: v for k, v in self.cache.items() if k[2] == key[2]}  # drop older versions
                self.cache[key] = built
            return built

    def _build(self, kind: str, name: str) -> dict:
        if kind == "circuit":
            from attrgraph.viewer.circuit_payload import circuit_payload

            return dict(circuit_payload(self.path, name), file=self.path.name)
        from attrgraph.graph.store import load_graph
        from attrgraph.graph.supernode_store import load_supernodes
        from attrgraph.viewer.dashboards import find_dashboards
        from attrgraph.viewer.payload import graph_payload, has_attention_features

        graph = load_graph(self.path, name)
        source = find_dashboards(graph.meta, self.dashboards)
        attn = (
            find_dashboards(graph.meta, self.attn_dashboards, "attn")
            if self.attn_dashboards is not None or has_attention_features(graph)
            else None
        )
        files = {
            site: (Path(src.dashboards.path) if src is not None and src.dashboards is not None else None)
            for site, src in (("mlp", source), ("attn", attn))
        }
        self.label_files[name] = files
        supernodes = load_supernodes(self.path, name)
        payload = graph_payload(graph, name, supernodes, source, attn)
        labels_editable = {site: f is not None for site, f in files.items()}
        return dict(payload, file=self.path.name, editable=True, labels_editable=labels_editable)

    # ------------------------------------------------------------------ the model panels
    def view_of(self, name: str) -> tuple:
        """(graph, its view, index in the graph of each view node) of stored graph `name`: the
        page's node ids index the view (payload.py step 1)."""
        from attrgraph.graph.store import load_graph
        from attrgraph.viewer.payload import graph_view

        def load() -> tuple:
            have = self.graphs()
            if name not in have:
                raise LookupError(f"{self.path.name} has no graph named {name!r}; it holds {have}.")
            graph = load_graph(self.path, name)
            view, index, _ = graph_view(graph)
            return graph, view, index

        return self.views.get((name, self.version()), load)

    def global_connections(self, query: dict[str, list[str]]) -> dict:
        """GET /api/global (global_request.py)."""
        from attrgraph.viewer.global_request import feature_of, global_json, parse_global

        name, node, k = parse_global(query)
        graph, view, _ = self.view_of(name)
        feature = feature_of(view, node)
        loaded = self.hub.for_graph(graph.meta)
        try:
            out = loaded.answers.get((feature, k), lambda: global_json(loaded, feature, k))
        except OptionError as e:  # the feature does not fit the sets served
            raise ViewRequestError(str(e)) from None
        return dict(out, graph=name, node=node)

    def heads(self, query: dict[str, list[str]]) -> dict:
        """GET /api/heads (heads_request.py)."""
        from attrgraph.viewer.heads_request import check_edge, heads_json, parse_heads

        name, source, target = parse_heads(query)
        graph, view, index = self.view_of(name)
        check_edge(view, source, target)
        loaded = self.hub.for_graph(graph.meta)
        s, t = int(index[source]), int(index[target])

        def compute() -> dict:
            try:
                return heads_json(loaded, graph, s, t)
            except (GraphError, OptionError) as e:  # built with other sets, custom targets, ...
                raise ViewRequestError(str(e)) from None

        hit = self.head_answers.get((name, self.version(), loaded.spec, s, t), compute)
        return dict(hit, graph=name, source=source, target=target)

    def save_supernodes(self, body: bytes) -> dict:
        from attrgraph.graph.store import load_graph
        from attrgraph.graph.supernode_store import save_supernodes
        from attrgraph.viewer.supernode_request import check_members, parse_request

        with self.lock:
            name, supernodes = parse_request(body, self.graphs())
            check_members(load_graph(self.path, name), supernodes)
            save_supernodes(self.path, supernodes, name)
        return {"saved": len(supernodes), "graph": name, "file": self.path.name}

    def read_link(self, body: bytes) -> dict:
        """POST /api/view: a shared link's supernodes (those storable in this graph) and pins."""
        from attrgraph.graph.shared_view import read_view
        from attrgraph.graph.store import load_graph
        from attrgraph.viewer.supernode_request import read_json, storable

        data = read_json(body, ViewRequestError, "{'graph': ..., 'link': ...}")
        if not isinstance(data, dict) or set(data) != {"graph", "link"} or not isinstance(data["link"], str):
            raise ViewRequestError(
                "the request must be a JSON object {'graph': NAME, 'link': the link's text}."
            )
        name, names = data["graph"], self.graphs()
        if name not in names:
            raise ViewRequestError(f"graph {name!r} is not in this file; it holds {names}.")
        graph = load_graph(self.path, name)
        view = read_view(data["link"], graph)
        kept, left_out, emptied = storable(graph, view.supernodes)
        return {
            "graph": name,
            "supernodes": [{"name": sn.name, "members": [list(m) for m in sn.members]} for sn in kept],
            "pinned": [list(k) for k in view.pinned],
            "left_out": len(left_out),
            "emptied": emptied,
            "labels": len(view.labels),
            "absent": list(view.absent),
        }

    def make_link(self, body: bytes) -> dict:
        """POST /api/link: the page's supernodes and pins as a Neuronpedia link (link_request.py)."""
        from attrgraph.graph.store import load_graph
        from attrgraph.viewer.link_request import make_link, parse_link_request

        name, supernodes, pins, model, slug = parse_link_request(body, self.graphs())
        return {"graph": name, "link": make_link(load_graph(self.path, name), supernodes, pins, model, slug)}

    def save_labels(self, body: bytes) -> dict:
        from attrgraph.graph.store import load_graph
        from attrgraph.viewer.label_request import check_features, parse_labels
        from transcoders.dashboard_file import set_labels

        name, labels = parse_labels(body, self.graphs())
        if name not in self.label_files:
            self.payload("graph", name)  # finds the dashboards files of its features
        with self.lock:
            check_features(load_graph(self.path, name), labels)
            files = self.label_files[name]
            for site in sorted({site for site, *_ in labels}):
                if files.get(site) is None:
                    raise LabelError(
                        f"graph {name!r} has no {'attention ' if site == 'attn' else ''}feature dashboards "
                        f"file to hold labels; serve with {'--attn-dashboards' if site == 'attn' else '--dashboards'}."
                    )
            for site in sorted({site for site, *_ in labels}):
                set_labels(files[site], {(layer, feat): text for s, layer, feat, text in labels if s == site})
            self.cache = {}  # the labels live in another file: its version is not in the cache key
        written = {site: str(files[site]) for site in sorted({site for site, *_ in labels})}
        return {"saved": len(labels), "graph": name, "files": written}


class Handler(BaseHTTPRequestHandler):
    server: ViewerServer
    server_version = "attrgraph-viewer"
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        self.timeout = self.server.socket_timeout  # StreamRequestHandler sets it on the socket
        super().setup()
        self.rfile.close()
        server = self.server
        self.rfile = self.reader = ConnectionReader(
            self.connection, server.socket_timeout, server.head_timeout, server.max_head
        )

    def handle_one_request(self) -> None:
        """http.server's loop step, reading the head through connection.py's bounds first."""
        self.raw_requestline, self.requestline, self.command = b"", "", ""
        self.request_version = self.default_request_version
        try:
            head = self.reader.read_head()
        except (TimeoutError, ConnectionError):
            self.close_connection = True  # too slow (connection.py step 2) or gone: nothing to answer
            return
        if isinstance(head, TooLarge):
            what = "request line" if head.line else "request head"
            return self.send_error(
                414 if head.line else 431, f"the {what} passes {self.server.max_head} bytes"
            )
        if head is None:
            self.close_connection = True
            return
        self.rfile = io.BytesIO(head)  # parse_request reads the headers from the bounded head
        self.raw_requestline = self.rfile.readline()
        parsed = self.parse_request()
        self.rfile = self.reader
        if not parsed:
            return
        if not self.path.startswith("/"):  # absolute-form (`GET http://evil.example/...`) or `*`
            return self._error(400, "send the request target as a path (/api/...), not a URL or '*'.")
        method = getattr(self, "do_" + self.command, None)
        if method is None:
            return self.send_error(501, f"unsupported method ({self.command!r})")
        if not self.server.begin_request():  # stopping (ViewerServer.wait_for_requests): nothing new starts
            self.close_connection = True
            return
        try:
            method()
            self.wfile.flush()
        finally:
            self.server.end_request()

    def log_message(self, format, *args):  # quiet unless asked: the CLI prints one line per start
        if self.server.verbose:
            super().log_message(format, *(TOKEN_IN_URL.sub(r"\1token=<hidden>", str(a)) for a in args))

    # ------------------------------------------------------------------ replies
    def _send(self, status: int, body: bytes, content_type: str, gzipped: bytes | None = None) -> None:
        """The reply; `gzipped`: `body` gzipped, sent instead when the client accepts it."""
        use_gzip = (
            gzipped is not None
            and len(gzipped) < len(body)  # a short reply grows when gzipped
            and accepts_gzip(self.headers.get("Accept-Encoding"))
        )
        self.send_response(status)
        self.send_header("Content-Type", content_type + ("; charset=utf-8" if "text" in content_type else ""))
        self.send_header("Content-Length", str(len(gzipped if use_gzip else body)))
        if gzipped is not None:
            self.send_header("Vary", "Accept-Encoding")
        if use_gzip:
            self.send_header("Content-Encoding", "gzip")
        for name, value in SECURITY_HEADERS:
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(gzipped if use_gzip else body)

    def _json(self, status: int, value) -> None:
        self._send(status, json.dumps(value, allow_nan=False).encode(), "application/json")

    def _encoded(self, value: Encoded) -> None:
        self._send(200, value.raw, "application/json", value.gzip)

    def _error(self, status: int, message: str) -> None:
        """A JSON error; the connection is closed after it, so no unread body follows (step 2)."""
        self.close_connection = True
        self._json(status, {"error": message})

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own refusals (a malformed request line, an unknown method) as JSON too."""
        try:
            short = self.responses.get(code, ("error",))[0]
        except AttributeError:
            short = "error"
        self.close_connection = True
        if not getattr(self, "command", None):
            self.command = ""
        if not hasattr(self, "headers"):
            self.headers = http.client.HTTPMessage()  # refused before its headers were parsed
        if getattr(self, "request_version", "HTTP/0.9") == "HTTP/0.9":
            self.request_version = "HTTP/1.0"  # a malformed request line: still a status line and headers
        try:
            self._json(code, {"error": f"{message or short} (HTTP {code})."})
        except OSError:
            pass

    def _refusal(self, api: bool) -> str | None:
        """Why this request is refused (step 1), or None."""
        access = self.server.access
        if not access.host_ok(self.headers.get("Host")):
            return "refused: this server answers only requests addressed to its own host."
        if api and access.token is not None:
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
            given = self.headers.get(TOKEN_HEADER) or (query.get("token") or [None])[0]
            if not access.token_ok(given):
                return "refused: this server needs the token of the URL it printed at start."
        if api and self.command in ("GET", "HEAD"):
            if not read_from_page(self.headers.get("Sec-Fetch-Site"), self.headers.get(PAGE_HEADER)):
                return (
                    f"refused: API reads come from the viewer's page; another site may not make this server "
                    f"work (a script of yours: send the header {PAGE_HEADER}: 1)."
                )
        return None

    def _body_pending(self) -> bool:
        return (
            bool(self.headers.get("Transfer-Encoding"))
            or (self.headers.get("Content-Length") or "0").strip() != "0"
        )

    # ------------------------------------------------------------------ routes
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        if self._body_pending():
            self.close_connection = True  # a GET's body is never read: never let it be parsed as a request
        url = urllib.parse.urlsplit(self.path)
        route = url.path
        refusal = self._refusal(route.startswith("/api/"))
        if refusal:
            return self._error(403, refusal)
        self._guarded(lambda: self._get(route, url.query))

    do_HEAD = do_GET

    def _get(self, route: str, query_string: str) -> None:
        if route in ("/", "/index.html"):
            return self._file(self.server.static_root / "index.html")
        if route.startswith("/static/"):
            try:
                path = static_file(route[len("/static/") :], self.server.static_root)
            except PermissionError:
                return self._error(403, f"refused: {route} leaves the viewer's static folder.")
            if path is None:
                return self._error(404, f"no static file {route}.")
            return self._file(path)
        query = urllib.parse.parse_qs(query_string)
        if route == "/api/graphs":
            return self._encoded(self.server.viewer.index_bytes())
        if route in ("/api/graph", "/api/circuit"):
            names = query.get("name", [])
            if len(names) != 1:
                return self._error(400, f"{route} needs one ?name=.")
            return self._encoded(self.server.viewer.payload_bytes(route.rsplit("/", 1)[1], names[0]))
        if route in MODEL_READS:
            viewer = self.server.viewer
            read = viewer.global_connections if route == "/api/global" else viewer.heads
            return self._json(200, read(query))
        return self._error(404, f"no such page {route}.")

    def do_POST(self) -> None:  # noqa: N802
        from attrgraph.viewer.supernode_request import MAX_BODY

        route = urllib.parse.urlsplit(self.path).path
        # every refusal below closes the connection (_error): the body is never read, never reparsed
        refusal = self._refusal(True)
        if refusal:
            return self._error(403, refusal)
        if route not in WRITES + POST_READS:
            return self._error(404, f"no such endpoint {route}; POST to {' or '.join(WRITES + POST_READS)}.")
        origin = self.headers.get("Origin")
        if not self.server.access.origin_ok(origin):
            return self._error(403, f"refused: a request from {origin} may not write this file.")
        if (self.headers.get("Content-Type") or "").split(";")[0].strip().lower() != "application/json":
            return self._error(400, "send the request as Content-Type: application/json.")
        if self.headers.get("Transfer-Encoding"):
            return self._error(411, "send a Content-Length, not a Transfer-Encoding.")
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            return self._error(411, "send a Content-Length.")
        if not 0 <= length <= MAX_BODY:
            return self._error(413, f"the request has {length} bytes; send at most {MAX_BODY}.")
        try:
            body = self.reader.read(length)
        except OSError:  # a timeout (connection.py step 3): the client sent headers and no body
            self.close_connection = True
            return
        if len(body) != length:
            self.close_connection = True
            return
        viewer = self.server.viewer
        answer = {
            "/api/supernodes": viewer.save_supernodes,
            "/api/labels": viewer.save_labels,
            "/api/view": viewer.read_link,
            "/api/link": viewer.make_link,
        }[route]
        self._guarded(lambda: self._json(200, answer(body)))

    def _guarded(self, route) -> None:
        """Run a route; every failure becomes a JSON error (step 3)."""
        try:
            route()
        except (SupernodeError, LabelError, ViewError, ViewRequestError) as e:
            self._error(400, str(e))
        except LookupError as e:
            self._error(404, str(e.args[0]))
        except (FileNotFoundError, GraphFileError) as e:
            if not self.server.viewer.path.exists():
                self._error(404, f"the file {self.server.viewer.path.name} is gone: it was moved or removed.")
            else:
                self._error(500, str(e))
        except AttrgraphError as e:
            self._error(500, str(e))
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except Exception as e:  # noqa: BLE001 (errors are always JSON; the traceback goes to stderr)
            traceback.print_exc(file=sys.stderr)
            self._error(500, f"the server failed: {type(e).__name__}: {e}")

    def _file(self, path: Path) -> None:
        self._send(200, path.read_bytes(), CONTENT_TYPES.get(path.suffix, "application/octet-stream"))


def _fixed_reply(status: int, message: str) -> bytes:
    """A whole JSON error reply, with the headers every response has, made once."""
    body = json.dumps({"error": message}).encode()
    heads = [
        ("Content-Type", "application/json"),
        ("Content-Length", str(len(body))),
        ("Connection", "close"),
    ]
    lines = [f"HTTP/1.1 {status} {http.client.responses[status]}"] + [
        f"{k}: {v}" for k, v in (*heads, *SECURITY_HEADERS)
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class ViewerServer(ThreadingHTTPServer):
    """A `ThreadingHTTPServer` holding a `Viewer`; `url` is where the page is (with the token)."""

    daemon_threads = True
    request_queue_size = BACKLOG
    BUSY = _fixed_reply(503, "the viewer is serving too many connections; retry shortly.")
    """The reply past `max_connections`, written before reading a byte (headers and body fixed)."""

    def __init__(
        self,
        viewer: Viewer,
        host: str,
        port: int,
        verbose: bool = False,
        allow_hosts: tuple[str, ...] = (),
        token: str | None = None,
        socket_timeout: float = SOCKET_TIMEOUT,
        head_timeout: float = HEAD_TIMEOUT,
        max_head: int = MAX_HEAD,
        max_connections: int = MAX_CONNECTIONS,
    ):
        self.viewer, self.host, self.verbose = viewer, host, verbose
        self.socket_timeout, self.head_timeout, self.max_head = socket_timeout, head_timeout, max_head
        self.max_connections = max_connections
        self.active = 0
        """Connections being served now."""
        self.active_lock = threading.Lock()
        self.busy = 0
        """Requests being answered now (a connection kept alive between requests is not one)."""
        self.stopping = False
        """Set by `wait_for_requests`: no request starts after it."""
        self.idle = threading.Condition(self.active_lock)
        """Notified when the last request being answered ends."""
        self.static_root = STATIC
        if ":" in host:
            self.address_family = socket.AF_INET6
        try:
            super().__init__((host, port), Handler)
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise ServeError(
                    f"port {port} on {host} is in use; pick another with --port (or --port 0 for a free one)."
                ) from None
            raise ServeError(
                f"cannot listen on {host}:{port} ({e.strerror or e}); pick another --host or --port."
            ) from None
        self.access = Access.for_server(host, self.server_address[1], allow_hosts, token)

    def process_request(self, request, client_address) -> None:
        """Serve in a thread, or past `max_connections` answer 503 and close, reading nothing."""
        with self.active_lock:
            full = self.active >= self.max_connections
            if not full:
                self.active += 1
        if not full:
            return super().process_request(request, client_address)
        try:
            request.settimeout(1.0)
            request.sendall(self.BUSY)
        except OSError:
            pass
        self.shutdown_request(request)

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self.active_lock:
                self.active -= 1

    def begin_request(self) -> bool:
        """A request on a connection is about to be answered: counted, unless the server is stopping."""
        with self.active_lock:
            if self.stopping:
                return False
            self.busy += 1
            return True

    def end_request(self) -> None:
        with self.active_lock:
            self.busy -= 1
            if not self.busy:
                self.idle.notify_all()

    def wait_for_requests(self, timeout: float) -> int:
        """After `shutdown`: start no more requests (a connection kept alive is closed at its next
        one), and wait up to `timeout` seconds for those being answered (a model panel may compute
        for a minute) to end; returns how many have not. Their threads are daemons, so the
        interpreter does not wait for them; one still inside torch when the interpreter finalizes
        aborts the process ("terminate called without an active exception": Python 3.11 ends a
        daemon thread with pthread_exit, which unwinds through torch's C++ frames)."""
        with self.idle:
            self.stopping = True
            self.idle.wait_for(lambda: self.busy == 0, timeout)
            return self.busy

    def handle_error(self, request, client_address) -> None:
        """A client that left (reset, closed, timed out) is no error of the server's: no traceback."""
        if isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            return
        super().handle_error(request, client_address)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        if host in WILDCARDS:
            host = "::1" if ":" in host else "127.0.0.1"
        query = f"?token={self.access.token}" if self.access.token else ""
        return f"http://{'[' + host + ']' if ':' in host else host}:{port}/{query}"


def make_server(
    path: str | os.PathLike,
    host: str = "127.0.0.1",
    port: int = 8765,
    dashboards: str | os.PathLike | None = None,
    verbose: bool = False,
    attn_dashboards: str | os.PathLike | None = None,
    allow_hosts: tuple[str, ...] = (),
    token: str | None = None,
    socket_timeout: float = SOCKET_TIMEOUT,
    model: str | None = None,
    transcoders: str | None = None,
    attn_transcoders: str | None = None,
    head_timeout: float = HEAD_TIMEOUT,
    max_head: int = MAX_HEAD,
    max_connections: int = MAX_CONNECTIONS,
) -> ViewerServer:
    """A viewer server for the graph file `path`, bound but not yet serving (call
    `serve_forever`, e.g. in a thread; `shutdown` and `server_close` stop it, and `wait_for_requests`
    lets the requests still being served end before the interpreter does). `port=0` takes a free port.
    `dashboards` / `attn_dashboards` label the MLP-site / attention features (default: found).
    `allow_hosts`: more names the Host header may give; `token`: the API token (default: a random
    one when `host` is not loopback, none on loopback). `model`, `transcoders`, `attn_transcoders`:
    the model panels' model and sets for every graph (default: what each graph's meta records).
    `head_timeout`, `max_head`, `max_connections`: connection.py's bounds and the connection cap."""
    viewer = Viewer(path, dashboards, attn_dashboards, model, transcoders, attn_transcoders)
    limits = {"head_timeout": head_timeout, "max_head": max_head, "max_connections": max_connections}
    return ViewerServer(viewer, host, port, verbose, tuple(allow_hosts), token, socket_timeout, **limits)


def warn_if_exposed(host: str) -> None:
    if not is_loopback(host):
        print(
            f"attrgraph serve: warning: listening on {host}, so other machines can read (and write "
            "supernodes and labels into) this file with the token of the URL below; the default "
            "127.0.0.1 keeps it to this machine.",
            file=sys.stderr,
        )

"""`attrgraph serve FILE`: a local HTTP server for the viewer page (stdlib `http.server`).

1. Bound to 127.0.0.1 unless another host is asked for (the CLI warns then). Requests whose
   `Host` header names anything but this server's own address (DNS rebinding), and POSTs that
   are not `application/json` or come from another `Origin` (cross-site forms), are refused.
2. Routes (GET unless said):
     /                        the page (static/index.html)
     /static/NAME             a file of static/; a path that leaves that folder is refused (403)
     /api/graphs              {"file", "graphs": [...], "circuits": [...]}
     /api/graph?name=NAME     payload.graph_payload of a stored graph (dashboards.py finds labels)
     /api/circuit?name=NAME   circuit_payload.circuit_payload of a stored circuit
     POST /api/supernodes     supernode_request.py: checked, then stored with
                              supernode_store.save_supernodes (the one atomic writer)
   Errors are JSON `{"error": sentence}` with 400 (a bad request; nothing written), 403, 404,
   413 or 500.
3. Payloads are cached per (kind, name) and file version (size, mtime); a write changes the
   version, so the next read sees it. Writes take a lock (and edit_h5 its file lock).
"""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from attrgraph.errors import AttrgraphError, GraphFileError, ServeError, SupernodeError

STATIC = Path(__file__).resolve().parent / "static"
"""The page's files (package data)."""
CONTENT_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css", ".png": "image/png"}
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def static_file(url_path: str) -> Path | None:
    """The file of static/ that a URL path under /static/ names, None when there is no such file.
    Raises `PermissionError` for a path that would leave static/ (`..`, absolute, backslashes,
    NUL; after percent-decoding, so `%2e%2e%2f` is caught too)."""
    rel = urllib.parse.unquote(url_path)
    parts = rel.replace("\\", "/").split("/")
    if "\0" in rel or "\\" in rel or rel.startswith("/") or any(p in ("..", ".") for p in parts):
        raise PermissionError(url_path)
    path = (STATIC / rel).resolve()
    if not path.is_relative_to(STATIC):
        raise PermissionError(url_path)
    return path if path.is_file() else None


class Viewer:
    """The state behind the routes: the graph file, the dashboards override, payload caches."""

    def __init__(
        self,
        path: str | os.PathLike,
        dashboards: str | os.PathLike | None = None,
        attn_dashboards: str | os.PathLike | None = None,
    ):
        from attrgraph.graph.store import list_graphs

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
        self.cache: dict[tuple, dict] = {}

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

    def payload(self, kind: str, name: str) -> dict:
        key = (kind, name, self.version())
        if key not in self.cache:
            have = self.graphs() if kind == "graph" else self.circuits()
            if name not in have:
                raise LookupError(f"{self.path.name} has no {kind} named {name!r}; it holds {have}.")
            self.cache = {k: v for k, v in self.cache.items() if k[2] == key[2]}  # drop older versions
            self.cache[key] = self._build(kind, name)
        return self.cache[key]

    def _build(self, kind: str, name: str) -> dict:
        if kind == "circuit":
            from attrgraph.viewer.circuit_payload import circuit_payload

            return dict(circuit_payload(self.path, name), file=self.path.name)
        from attrgraph.graph.store import load_graph
        from attrgraph.graph.supernode_store import load_supernodes
        from attrgraph.viewer.dashboards import find_dashboards
        from attrgraph.viewer.payload import graph_payload

        graph = load_graph(self.path, name)
        source = find_dashboards(graph.meta, self.dashboards)
        attn = (
            None
            if self.attn_dashboards is None
            else find_dashboards(graph.meta, self.attn_dashboards, "attn")
        )
        supernodes = load_supernodes(self.path, name)
        payload = graph_payload(graph, name, supernodes, source, attn)
        return dict(payload, file=self.path.name, editable=True)

    def save_supernodes(self, body: bytes) -> dict:
        from attrgraph.graph.store import load_graph
        from attrgraph.graph.supernode_store import save_supernodes
        from attrgraph.viewer.supernode_request import check_members, parse_request

        with self.lock:
            name, supernodes = parse_request(body, self.graphs())
            check_members(load_graph(self.path, name), supernodes)
            save_supernodes(self.path, supernodes, name)
        return {"saved": len(supernodes), "graph": name, "file": self.path.name}


class Handler(BaseHTTPRequestHandler):
    server: ViewerServer
    server_version = "attrgraph-viewer"
    protocol_version = "HTTP/1.1"

    def log_message(self, format, *args):  # quiet unless asked: the CLI prints one line per start
        if self.server.verbose:
            super().log_message(format, *args)

    # ------------------------------------------------------------------ replies
    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type + ("; charset=utf-8" if "text" in content_type else ""))
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, value) -> None:
        self._send(status, json.dumps(value, allow_nan=False).encode(), "application/json")

    def _error(self, status: int, message: str) -> None:
        self._json(status, {"error": message})

    def _host_ok(self) -> bool:
        host = (self.headers.get("Host") or "").rsplit(":", 1)[0].strip("[]").lower()
        allowed = {self.server.host.lower(), *(LOOPBACK if self.server.host in LOOPBACK else ())}
        return host in allowed or self.server.host in ("0.0.0.0", "::")

    # ------------------------------------------------------------------ routes
    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        url = urllib.parse.urlsplit(self.path)
        if not self._host_ok():
            return self._error(403, "refused: this server answers only requests addressed to its own host.")
        route = url.path
        try:
            if route in ("/", "/index.html"):
                return self._file(STATIC / "index.html")
            if route.startswith("/static/"):
                try:
                    path = static_file(route[len("/static/") :])
                except PermissionError:
                    return self._error(403, f"refused: {route} leaves the viewer's static folder.")
                if path is None:
                    return self._error(404, f"no static file {route}.")
                return self._file(path)
            query = urllib.parse.parse_qs(url.query)
            if route == "/api/graphs":
                return self._json(200, self.server.viewer.index())
            if route in ("/api/graph", "/api/circuit"):
                names = query.get("name", [])
                if len(names) != 1:
                    return self._error(400, f"{route} needs one ?name=.")
                return self._json(200, self.server.viewer.payload(route.rsplit("/", 1)[1], names[0]))
            return self._error(404, f"no such page {route}.")
        except LookupError as e:
            return self._error(404, str(e.args[0]))
        except AttrgraphError as e:
            return self._error(500, str(e))

    do_HEAD = do_GET

    def do_POST(self) -> None:  # noqa: N802
        from attrgraph.viewer.supernode_request import MAX_BODY

        if not self._host_ok():
            return self._error(403, "refused: this server answers only requests addressed to its own host.")
        if urllib.parse.urlsplit(self.path).path != "/api/supernodes":
            return self._error(404, f"no such endpoint {self.path}; POST supernodes to /api/supernodes.")
        origin = self.headers.get("Origin")
        if origin not in (None, "null") and urllib.parse.urlsplit(origin).netloc != self.headers.get("Host"):
            return self._error(403, f"refused: a request from {origin} may not write this file.")
        if (self.headers.get("Content-Type") or "").split(";")[0].strip() != "application/json":
            return self._error(400, "send the supernodes as Content-Type: application/json.")
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            return self._error(411, "send a Content-Length.")
        if not 0 <= length <= MAX_BODY:
            self.close_connection = True
            return self._error(413, f"the request has {length} bytes; send at most {MAX_BODY}.")
        body = self.rfile.read(length)
        try:
            return self._json(200, self.server.viewer.save_supernodes(body))
        except SupernodeError as e:
            return self._error(400, str(e))
        except AttrgraphError as e:
            return self._error(500, str(e))

    def _file(self, path: Path) -> None:
        self._send(200, path.read_bytes(), CONTENT_TYPES.get(path.suffix, "application/octet-stream"))


class ViewerServer(ThreadingHTTPServer):
    """A `ThreadingHTTPServer` holding a `Viewer`; `url` is where the page is."""

    daemon_threads = True

    def __init__(self, viewer: Viewer, host: str, port: int, verbose: bool = False):
        self.viewer, self.host, self.verbose = viewer, host, verbose
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

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{'[' + host + ']' if ':' in host else host}:{port}/"


def make_server(
    path: str | os.PathLike,
    host: str = "127.0.0.1",
    port: int = 8765,
    dashboards: str | os.PathLike | None = None,
    verbose: bool = False,
    attn_dashboards: str | os.PathLike | None = None,
) -> ViewerServer:
    """A viewer server for the graph file `path`, bound but not yet serving (call
    `serve_forever`, e.g. in a thread; `shutdown` and `server_close` stop it). `port=0` takes a free port.
    `dashboards` / `attn_dashboards` label the MLP-site / attention features (default: found)."""
    return ViewerServer(Viewer(path, dashboards, attn_dashboards), host, port, verbose)


def warn_if_exposed(host: str) -> None:
    if host not in LOOPBACK:
        print(
            f"attrgraph serve: warning: listening on {host}, so other machines can read (and write "
            "supernodes into) this file; the default 127.0.0.1 keeps it to this machine.",
            file=sys.stderr,
        )

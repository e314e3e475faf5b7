"""The viewer's server attacked as a web page or a process on 127.0.0.1 would (DESIGN.md, "The
viewer's security model"), over real sockets: smuggled requests in refused bodies, `Origin: null`,
near-miss Host and Origin names, a server bound to 0.0.0.0 (token), a symlink out of static/,
clients that stall, bursts of connections, concurrent first requests, a file removed while
serving. Every attack leaves the graph file byte-identical (sha256 before and after)."""

import json
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from attrgraph.graph.store import save_graph
from attrgraph.graph.supernode_store import load_supernodes, save_supernodes
from attrgraph.graph.supernodes import supernode
from attrgraph.viewer.access import TOKEN_HEADER
from attrgraph.viewer.server import STATIC, Viewer, ViewerServer, make_server, static_file
from tests.attrgraph.ag_helpers import random_graph
from tests.attrgraph.viewer.viewer_helpers import (
    PAGE_HEADER,
    assert_refused_as_writes_are,
    request,
    served,
    sha,
    token_headers,
)

HOSTS = ["127.0.0.1", "0.0.0.0"]
READS = (
    "/api/graphs",
    "/api/graph?name=g",
    "/api/global?graph=g&node=0",
    "/api/heads?graph=g&source=0&target=1",
)
"""Every API read; each gets the same attacks (the model panels' reads included)."""


@pytest.fixture
def small_file(tmp_path):
    """A hand-built graph "g" with one saved supernode (an empty list posted would wipe it)."""
    path = tmp_path / "small.h5"
    graph = random_graph(0)
    save_graph(graph, path, "g")
    save_supernodes(path, [supernode(graph, "kept", [5])], "g")
    return path


def raw(server, data: bytes, timeout: float = 30) -> bytes:
    """Send raw bytes on one connection to 127.0.0.1 and read until the server closes it."""
    port = server.server_address[1]
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        out = b""
        while True:
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                return out + b"<client timed out>"
            if not chunk:
                return out
            out += chunk


def statuses(reply: bytes) -> list[int]:
    return [int(m) for m in re.findall(rb"HTTP/1\.[01] (\d{3}) ", reply)]


def host_of(server) -> str:
    return f"127.0.0.1:{server.server_address[1]}"


def http(method: str, path: str, headers: dict, body: bytes = b"", length: bool = True) -> bytes:
    lines = [f"{method} {path} HTTP/1.1"] + [f"{k}: {v}" for k, v in headers.items()]
    if length:
        lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


WIPE = json.dumps({"graph": "g", "supernodes": []}).encode()


def inner_request(server) -> bytes:
    """What a cross-site text/plain form smuggles: a whole valid write (with the token when one is
    needed: the worst case) that would wipe the saved supernodes."""
    headers = {"Host": host_of(server), "Content-Type": "application/json", **token_headers(server)}
    return http("POST", "/api/supernodes", headers, WIPE)


REFUSALS = {
    "cross-site text/plain form": ({"Origin": "http://evil.example", "Content-Type": "text/plain"}, 403),
    "text/plain without Origin": ({"Content-Type": "text/plain"}, 400),
    "Origin null": ({"Origin": "null", "Content-Type": "text/plain"}, 403),
    "unknown endpoint": ({"Content-Type": "application/json", "path": "/api/elsewhere"}, 404),
    "foreign Host": ({"Content-Type": "application/json", "Host": "evil.example"}, 403),
    "no Content-Length": ({"Content-Type": "application/json", "length": False}, 411),
    "chunked": ({"Content-Type": "application/json", "Transfer-Encoding": "chunked"}, 411),
    "too large": ({"Content-Type": "application/json", "Content-Length": str(1 << 24), "length": False}, 413),
}


@pytest.mark.parametrize("host", HOSTS)
@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_a_refused_request_never_has_its_body_parsed_as_a_request(small_file, host, case):
    """Request smuggling: the refused request's body is a whole write; only one reply may come,
    then the connection closes, and the file is byte-identical."""
    before = sha(small_file)
    spec, status = REFUSALS[case]
    spec = dict(spec)
    with served(small_file, host=host, socket_timeout=3) as server:
        path, length = spec.pop("path", "/api/supernodes"), spec.pop("length", True)
        headers = {"Host": host_of(server), **token_headers(server), **spec}
        body = inner_request(server)
        reply = raw(server, http("POST", path, headers, body, length))
        assert statuses(reply) == [status], reply
        assert b"<client timed out>" not in reply  # closed by the server, not left open
        assert b"Connection: close" in reply
        assert json.loads(reply.split(b"\r\n\r\n", 1)[1])["error"]
    assert sha(small_file) == before
    assert [s.name for s in load_supernodes(small_file, "g")] == ["kept"]


@pytest.mark.parametrize("host", HOSTS)
def test_a_get_with_a_body_never_has_it_parsed_as_a_request(small_file, host):
    before = sha(small_file)
    with served(small_file, host=host, socket_timeout=3) as server:
        headers = {"Host": host_of(server), PAGE_HEADER: "1", **token_headers(server)}
        reply = raw(server, http("GET", "/api/graphs", headers, inner_request(server)))
        assert statuses(reply) == [200], reply
    assert sha(small_file) == before


@pytest.mark.parametrize("host", HOSTS)
def test_origin_null_and_near_miss_origins_may_not_write(small_file, host):
    before = sha(small_file)
    with served(small_file, host=host) as server:
        port = server.server_address[1]
        for origin in (
            "null",
            "http://evil.example",
            f"http://127.0.0.1:{port + 1}",  # another local port: another origin
            f"http://localhost:{port + 1}",
            f"http://127.0.0.1:{port}.evil.example",
            f"http://localhost.evil.example:{port}",
            f"http://127.0.0.1.evil.example:{port}",
            f"https://127.0.0.1:{port}",
            f"http://127.0.0.1:{port}@evil.example",
            "http://127.0.0.1",
        ):
            status, reply = request(
                server, "POST", "/api/supernodes", WIPE, {"Origin": origin, **token_headers(server)}
            )
            assert status == 403, (origin, reply)
            assert "may not write" in json.loads(reply)["error"]
    assert sha(small_file) == before


@pytest.mark.parametrize("host", HOSTS)
def test_near_miss_host_names_are_refused(small_file, host):
    before = sha(small_file)
    with served(small_file, host=host) as server:
        port = server.server_address[1]
        for name in (
            f"localhost.evil.example:{port}",
            f"127.0.0.1.evil.example:{port}",
            f"evil.example:{port}",
            f"127.0.0.1:{port}.evil.example",
            f"127.0.0.1:{port + 1}",
            "127.0.0.1",  # port 80 implied
            f"127.0.0.2:{port}",
            f"xlocalhost:{port}",
            "",
        ):
            for method, url in [("GET", u) for u in READS] + [("GET", "/"), ("POST", "/api/supernodes")]:
                body = WIPE if method == "POST" else None
                status, reply = request(server, method, url, body, {"Host": name, **token_headers(server)})
                assert status == 403, (name, method, url, status)
                assert "its own host" in json.loads(reply)["error"]
    assert sha(small_file) == before


def test_the_served_origin_may_write_on_loopback(small_file):
    with served(small_file) as server:
        port = server.server_address[1]
        for name in ("127.0.0.1", "localhost"):
            headers = {"Host": f"{name}:{port}", "Origin": f"http://{name}:{port}"}
            body = {"graph": "g", "supernodes": [{"name": name, "members": [["feature", 0, 0, 0]]}]}
            status, reply = request(server, "POST", "/api/supernodes", json.dumps(body).encode(), headers)
            assert status in (200, 400), reply  # reaches the checks of the request itself
        assert server.access.token is None  # loopback: no token


def test_beyond_loopback_every_api_call_needs_the_token(small_file):
    before = sha(small_file)
    with served(small_file, host="0.0.0.0") as server:
        token = server.access.token
        assert token and len(token) >= 32
        assert server.url == f"http://127.0.0.1:{server.server_address[1]}/?token={token}"
        near = token[:-1] + ("y" if token.endswith("x") else "x")  # one character off, never the token itself
        for url in (
            *READS,
            f"/api/graphs?token={near}",
            f"/api/global?graph=g&node=0&token={near}",
        ):
            status, reply = request(server, "GET", url)
            assert status == 403 and "token" in json.loads(reply)["error"], url
        for headers in ({}, {TOKEN_HEADER: "wrong"}, {TOKEN_HEADER: ""}):
            status, _ = request(server, "POST", "/api/supernodes", WIPE, headers)
            assert status == 403
        # a rebinding page: its own name in Host and Origin, no token
        port = server.server_address[1]
        evil = {"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"}
        assert request(server, "POST", "/api/supernodes", WIPE, evil)[0] == 403
        assert request(server, "POST", "/api/supernodes", WIPE, {**evil, TOKEN_HEADER: token})[0] == 403
        assert request(server, "GET", "/api/graphs", headers={TOKEN_HEADER: token})[0] == 200
        assert request(server, "GET", f"/api/graphs?token={token}")[0] == 200
        assert request(server, "GET", "/")[0] == 200  # the page itself holds no data
    assert sha(small_file) == before


def test_the_cli_prints_the_token_url_once_beyond_loopback(small_file):
    proc = subprocess.Popen(
        [sys.executable, "-m", "attrgraph.cli", "serve", str(small_file), "--host", "0.0.0.0", "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[3],
    )
    try:
        line = proc.stdout.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)/\?token=([\w-]+)", line)
        assert m, line
        import http.client

        conn = http.client.HTTPConnection("127.0.0.1", int(m.group(1)), timeout=30)
        conn.request("GET", f"/api/graphs?token={m.group(2)}", headers={PAGE_HEADER: "1"})
        assert conn.getresponse().status == 200
        conn.close()
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert "token" in err and "warning" in err


def test_a_symlink_out_of_the_static_folder_is_refused(small_file, tmp_path):
    root = tmp_path / "static"
    root.mkdir()
    for name in ("index.html", "viewer.js", "viewer.css"):
        (root / name).write_bytes((STATIC / name).read_bytes())
    secret = tmp_path / "secret.txt"
    secret.write_text("root:x:0:0")
    (root / "leak.js").symlink_to(secret)
    (root / "dir").symlink_to(tmp_path)
    (root / "inside.js").symlink_to(root / "viewer.js")  # a symlink that stays inside is fine
    with pytest.raises(PermissionError):
        static_file("leak.js", root)
    with pytest.raises(PermissionError):
        static_file("dir/secret.txt", root)
    assert static_file("inside.js", root) == (root / "viewer.js").resolve()
    with served(small_file) as server:
        server.static_root = root
        for url in ("/static/leak.js", "/static/dir/secret.txt"):
            status, body = request(server, "GET", url)
            assert status == 403 and b"root:" not in body, url
        assert request(server, "GET", "/static/inside.js")[0] == 200


def test_a_client_that_sends_headers_and_no_body_is_cut_off(small_file):
    """The body is waited for `head_timeout` seconds (connection.py step 3), then the connection closes."""
    with served(small_file, socket_timeout=1, head_timeout=1) as server:
        headers = {"Host": host_of(server), "Content-Type": "application/json", "Content-Length": "100"}
        lines = "POST /api/supernodes HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        reply = raw(server, (lines + "\r\n").encode(), timeout=60)
        assert b"<client timed out>" not in reply  # the server closed it
        assert request(server, "GET", "/api/graphs")[0] == 200


def test_the_listen_backlog_holds_a_burst_of_connections(small_file):
    server = make_server(small_file, port=0)
    port = server.server_address[1]
    out = subprocess.run(["ss", "-ltnH", f"sport = :{port}"], capture_output=True, text=True, check=True)
    backlog = int(out.stdout.split()[2])  # Send-Q of a listening socket is its backlog
    if backlog < 128:
        server.server_close()
        pytest.fail(f"listen backlog {backlog}: {out.stdout}")
    try:
        # nothing accepted yet: 100 connections wait in the queue, then all get their answer
        conns = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(100)]
        for c in conns:
            c.settimeout(30)
        thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
        thread.start()
        for c in conns:
            c.sendall(
                http(
                    "GET",
                    "/api/graphs",
                    {"Host": f"127.0.0.1:{port}", PAGE_HEADER: "1", "Connection": "close"},
                    length=False,
                )
            )
        replies = []
        for c in conns:
            data = b""
            while chunk := c.recv(65536):
                data += chunk
            replies.append(statuses(data))
            c.close()
        assert replies == [[200]] * 100
    finally:
        server.shutdown()
        server.server_close()


class CountingViewer(Viewer):
    """The real Viewer, counting builds; a build waits for `go`, so concurrent first requests overlap."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.arrived = self.builds = 0
        self.count_lock = threading.Lock()
        self.go = threading.Event()

    def payload_bytes(self, kind, name):
        with self.count_lock:
            self.arrived += 1
        return super().payload_bytes(kind, name)

    def _build(self, kind, name):
        with self.count_lock:
            self.builds += 1
        assert self.go.wait(60)
        return super()._build(kind, name)


def test_concurrent_first_requests_build_the_payload_once(small_file):
    server = ViewerServer(CountingViewer(small_file), "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    viewer = server.viewer
    try:
        results = []
        threads = [
            threading.Thread(target=lambda: results.append(request(server, "GET", "/api/graph?name=g")))
            for _ in range(8)
        ]
        for t in threads:
            t.start()
        for _ in range(6000):  # all 8 requests are inside payload() before the first build may finish
            if viewer.arrived == 8:
                break
            threading.Event().wait(0.01)
        assert viewer.arrived == 8
        viewer.go.set()
        for t in threads:
            t.join(60)
        assert [s for s, _ in results] == [200] * 8
        assert len({b for _, b in results}) == 1
        assert viewer.builds == 1
    finally:
        server.shutdown()
        server.server_close()


def test_a_file_removed_while_serving_gives_json_errors(small_file):
    with served(small_file) as server:
        assert request(server, "GET", "/api/graph?name=g")[0] == 200
        small_file.unlink()
        for method, url in [("GET", u) for u in READS] + [("POST", "/api/supernodes")]:
            body = WIPE if method == "POST" else None
            status, reply = request(server, method, url, body)
            assert status == 404, (url, reply)
            assert "is gone" in json.loads(reply)["error"]
        assert request(server, "GET", "/")[0] == 200
    assert not small_file.exists()  # nothing wrote a new one


@pytest.mark.parametrize(
    "data, status",
    [
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET / HTTP/9.9\r\n\r\n", 505),
        (b"BREW /api/graphs HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 501),
        (b"DELETE /api/graphs HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 501),
        (b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n", 414),
    ],
)
def test_errors_are_always_json(small_file, data, status):
    with served(small_file) as server:
        reply = raw(server, data)
    assert statuses(reply) == [status], reply[:200]
    head, body = reply.split(b"\r\n\r\n", 1)
    assert b"Content-Type: application/json" in head
    assert json.loads(body)["error"]


@pytest.mark.parametrize("host", HOSTS)
def test_label_writes_follow_the_same_rules(small_file, tmp_path, host):
    """POST /api/labels: refused cross-site, with Origin null, without the token beyond loopback, and
    when malformed or naming no feature of the graph; the graph file is never touched."""
    before = sha(small_file)
    good = json.dumps(
        {"graph": "g", "labels": [{"site": "mlp", "layer": 0, "feature": 0, "label": "x"}]}
    ).encode()
    with served(small_file, host=host) as server:
        tok = token_headers(server)
        assert_refused_as_writes_are(server, "/api/labels", good)
        for body in (
            b"{",
            json.dumps({"graph": "g", "labels": []}).encode(),
            json.dumps({"graph": "g"}).encode(),
        ):
            status, reply = request(server, "POST", "/api/labels", body, tok)
            assert status == 400 and json.loads(reply)["error"]
        # a feature the graph does not hold; and this graph has no dashboards file to hold labels
        bad = {"graph": "g", "labels": [{"site": "attn", "layer": 0, "feature": 10**6, "label": "x"}]}
        status, reply = request(server, "POST", "/api/labels", json.dumps(bad).encode(), tok)
        assert status == 400 and "is not a feature of this graph" in json.loads(reply)["error"]
        graph = random_graph(0)
        i = int(np.flatnonzero(graph.nodes.kind == "feature")[0])
        ok = {
            "graph": "g",
            "labels": [
                {
                    "site": "mlp",
                    "layer": int(graph.nodes.layer[i]),
                    "feature": int(graph.nodes.feature[i]),
                    "label": "x",
                }
            ],
        }
        status, reply = request(server, "POST", "/api/labels", json.dumps(ok).encode(), tok)
        assert status == 400 and "no feature dashboards file" in json.loads(reply)["error"]
    assert sha(small_file) == before

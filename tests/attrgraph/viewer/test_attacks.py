"""Issue 31's attacks on the viewer's server, each as the attacker ran it, over real sockets (and a
real chromium for framing): clickjacking through a frame, unbounded and slow request heads,
connection floods, other sites' reads that make the server work; and the smaller findings
(absolute-form targets, clients that drop, the token in --verbose logs, bodies that gave 500).
Every attack leaves the graph file byte-identical."""

import http.server
import json
import re
import select
import socket
import struct
import threading
import time

import pytest

from attrgraph.graph.store import save_graph
from attrgraph.graph.supernode_store import save_supernodes
from attrgraph.graph.supernodes import supernode
from tests.attrgraph.ag_helpers import random_graph
from tests.attrgraph.viewer.viewer_helpers import PAGE_HEADER, request, served, sha

READS = (
    "/api/graphs",
    "/api/graph?name=g",
    "/api/global?graph=g&node=0",
    "/api/heads?graph=g&source=0&target=1",
)
WIPE = json.dumps({"graph": "g", "supernodes": []}).encode()


@pytest.fixture
def small_file(tmp_path):
    path = tmp_path / "small.h5"
    graph = random_graph(0)
    save_graph(graph, path, "g")
    save_supernodes(path, [supernode(graph, "kept", [5])], "g")
    return path


def head_bytes(server, path: str = "/api/graphs", extra: str = "") -> bytes:
    port = server.server_address[1]
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n{PAGE_HEADER}: 1\r\n{extra}".encode()


def reply_of(sock: socket.socket, wait: float) -> bytes:
    """What the server sent on `sock` until it closed (or `wait` seconds passed)."""
    sock.settimeout(wait)
    out = b""
    try:
        while chunk := sock.recv(65536):
            out += chunk
    except (TimeoutError, ConnectionResetError):
        pass
    return out


def status_of(reply: bytes) -> int | None:
    m = re.match(rb"HTTP/1\.[01] (\d{3}) ", reply)
    return int(m.group(1)) if m else None


def headers_of(reply: bytes) -> dict[str, str]:
    lines = reply.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")[1:]
    return {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines)}


# ------------------------------------------------------------------ 1. framing (clickjacking)
def assert_unframeable(headers: dict[str, str], what: str) -> None:
    """X-Frame-Options DENY and a CSP with frame-ancestors 'none', default-src 'self' and no inline
    script (the issue's strict policy)."""
    assert headers.get("x-frame-options", "").upper() == "DENY", what
    csp = headers.get("content-security-policy", "")
    directives = {d.split()[0]: d.split()[1:] for d in csp.split(";") if d.strip()}
    assert directives.get("frame-ancestors") == ["'none'"], (what, csp)
    assert directives.get("default-src") == ["'self'"], (what, csp)
    assert "'unsafe-inline'" not in csp and "'unsafe-eval'" not in csp, (what, csp)


def test_every_response_refuses_framing_and_sets_a_strict_csp(small_file):
    with served(small_file, max_head=4096) as server:
        port = server.server_address[1]
        for method, url, body in (
            ("GET", "/", None),
            ("GET", "/static/viewer.js", None),
            ("GET", "/api/graphs", None),
            ("GET", "/api/graph?name=nope", None),  # 404
            ("GET", "/static/../server.py", None),  # 403
            ("POST", "/api/supernodes", b"{"),  # 400
        ):
            conn = socket.create_connection(("127.0.0.1", port), timeout=30)
            heads = head_bytes(server, url, "Connection: close\r\n").replace(
                b"GET ", f"{method} ".encode(), 1
            )
            if body is not None:
                heads += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n".encode()
            conn.sendall(heads + b"\r\n" + (body or b""))
            reply = reply_of(conn, 30)
            conn.close()
            assert status_of(reply) is not None, reply[:200]
            assert_unframeable(headers_of(reply), f"{method} {url} -> {status_of(reply)}")
        with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:  # http.server's own 431
            conn.sendall(head_bytes(server) + b"X-Big: " + b"a" * 8000 + b"\r\n\r\n")
            reply = reply_of(conn, 30)
        assert status_of(reply) == 431
        assert_unframeable(headers_of(reply), "431")


class EvilSite(http.server.BaseHTTPRequestHandler):
    """Another origin's page: the viewer framed at a hash the attacker picks, and images that ask
    the viewer's API to work (attack 3)."""

    page = b""

    def do_GET(self):  # noqa: N802
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(self.page)))
        self.end_headers()
        self.wfile.write(self.page)

    def log_message(self, *args):
        pass


@pytest.mark.bundled("default", "default-plt")
def test_another_site_can_neither_frame_the_page_nor_make_the_server_work(browser, ioi_file):
    """Chromium loads an evil page on another port that frames the viewer at `#graph:ioi&pins=...`
    and points <img> tags at the API; the frame is refused (no viewer in it) and the server neither
    builds a payload nor loads a model. Then the viewer itself still works in the same browser
    under its CSP (no violation in the console)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    with served(ioi_file) as server:
        port = server.server_address[1]
        viewer = f"http://127.0.0.1:{port}"
        imgs = "".join(
            f'<img src="{viewer}{u}">'
            for u in ("/api/graphs", "/api/graph?name=ioi", "/api/global?graph=ioi&node=20&k=5")
        )
        EvilSite.page = (
            f'<html><body><iframe id="victim" src="{viewer}/#graph:ioi&pins=21.22" width="1200" height="800" '
            f'style="opacity:0.01"></iframe>{imgs}<p id="done">decoy</p></body></html>'
        ).encode()
        evil = http.server.ThreadingHTTPServer(("127.0.0.1", 0), EvilSite)
        threading.Thread(target=evil.serve_forever, args=(0.05,), daemon=True).start()
        try:
            browser.get_log("browser")
            browser.get(f"http://localhost:{evil.server_address[1]}/")
            WebDriverWait(browser, 20).until(lambda b: b.find_element(By.ID, "done"))
            time.sleep(2)  # the frame and images have had their time
            browser.switch_to.frame(browser.find_element(By.ID, "victim"))
            framed = browser.find_elements(By.ID, "pick") + browser.find_elements(By.CSS_SELECTOR, "g.node")
            browser.switch_to.default_content()
            assert framed == [], "the viewer rendered inside another site's frame"
            assert server.viewer.cache == {} and server.viewer.hub.loads == 0, "another site made it work"
            browser.get_log("browser")
            browser.get(server.url + "#graph:ioi")
            WebDriverWait(browser, 20).until(lambda b: len(b.find_elements(By.CSS_SELECTOR, "g.node")) > 0)
            logs = [e["message"] for e in browser.get_log("browser")]
            assert not [m for m in logs if "Content Security Policy" in m or "SEVERE" in m], logs
        finally:
            evil.shutdown()
            evil.server_close()


# ------------------------------------------------------------------ 2. heads without bounds
def test_huge_headers_are_refused_after_a_bounded_read(small_file):
    """The attacker's head: 98 headers of 65,000 bytes. The server answers 431 and closes long
    before the head ends (http.server read all ~6.4 MB first)."""
    before = sha(small_file)
    with served(small_file) as server:
        port = server.server_address[1]
        with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
            conn.sendall(head_bytes(server))
            sent, reply = 0, b""
            for k in range(98):
                try:
                    conn.sendall(f"X-Pad-{k}: ".encode() + b"a" * 65000 + b"\r\n")
                except (BrokenPipeError, ConnectionResetError):
                    break
                sent += 1
                if select.select([conn], [], [], 0.2)[0]:
                    break
            reply = reply_of(conn, 30)
        assert status_of(reply) == 431, reply[:300]
        assert sent < 10, f"the server read {sent} headers of 65,000 bytes before refusing"
        assert request(server, "GET", "/api/graphs")[0] == 200
    assert sha(small_file) == before


def test_a_head_that_drips_in_is_cut_off_at_the_head_deadline(small_file):
    """One byte every 0.2 s never hits the 5 s socket timeout; the head deadline (1 s here) ends it."""
    with served(small_file, socket_timeout=5, head_timeout=1) as server:
        port = server.server_address[1]
        with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
            conn.sendall(head_bytes(server) + b"X-Slow: ")
            t0, closed = time.monotonic(), False
            while time.monotonic() - t0 < 8:
                try:
                    conn.sendall(b"a")
                except (BrokenPipeError, ConnectionResetError):
                    closed = True
                    break
                if select.select([conn], [], [], 0.2)[0]:
                    closed = reply_of(conn, 1) == b"" or True
                    break
            waited = time.monotonic() - t0
        assert closed and waited < 4, f"the slow head was still held after {waited:.1f} s"


def test_connections_past_the_cap_are_refused_before_reading(small_file):
    with served(small_file, max_connections=4, socket_timeout=30) as server:
        port = server.server_address[1]
        idle = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(4)]
        time.sleep(0.3)  # all four accepted and waiting for their heads
        with socket.create_connection(("127.0.0.1", port), timeout=10) as extra:
            reply = reply_of(extra, 10)  # sent nothing: the refusal comes without reading
        assert status_of(reply) == 503, reply[:200]
        assert json.loads(reply.split(b"\r\n\r\n", 1)[1])["error"]
        for conn in idle:
            conn.close()
        time.sleep(0.3)
        assert request(server, "GET", "/api/graphs")[0] == 200


# ------------------------------------------------------------------ 3. other sites' reads
@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_api_reads_not_from_the_page_are_refused_before_any_work(small_file, host):
    with served(small_file, host=host) as server:
        tok = {"X-Attrgraph-Token": server.access.token} if server.access.token else {}
        for url in READS:
            for headers in (
                {PAGE_HEADER: None},  # an <img>, <script> or curl without the header
                {PAGE_HEADER: None, "Sec-Fetch-Site": "cross-site"},
                {PAGE_HEADER: None, "Sec-Fetch-Site": "same-site"},  # another port of this machine
                {"Sec-Fetch-Site": "cross-site"},  # the header cannot outvote the browser
            ):
                status, reply = request(server, "GET", url, headers={**tok, **headers})
                assert status == 403, (url, headers, reply)
                assert "from the viewer's page" in json.loads(reply)["error"]
        assert server.viewer.cache == {} and server.viewer.index_cache is None
        assert server.viewer.hub.loads == 0 and len(server.viewer.views.items) == 0
        for headers in ({}, {PAGE_HEADER: None, "Sec-Fetch-Site": "same-origin"}, {"Sec-Fetch-Site": "none"}):
            assert request(server, "GET", "/api/graphs", headers={**tok, **headers})[0] == 200
        assert request(server, "GET", "/", headers={PAGE_HEADER: None})[0] == 200  # the page holds no data


# ------------------------------------------------------------------ also found
def test_an_absolute_form_target_is_refused(small_file):
    before = sha(small_file)
    with served(small_file) as server:
        port = server.server_address[1]
        for method, body in (("GET", None), ("POST", WIPE)):
            heads = {"Host": f"127.0.0.1:{port}", PAGE_HEADER: "1", "Content-Type": "application/json"}
            lines = [
                f"{method} http://evil.example/api/{'graphs' if body is None else 'supernodes'} HTTP/1.1"
            ]
            lines += [f"{k}: {v}" for k, v in heads.items()] + [f"Content-Length: {len(body or b'')}"]
            with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
                conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b""))
                reply = reply_of(conn, 30)
            assert status_of(reply) == 400, reply[:300]
            assert "not a URL" in json.loads(reply.split(b"\r\n\r\n", 1)[1])["error"]
    assert sha(small_file) == before


def test_a_client_that_drops_leaves_no_traceback(small_file, capfd):
    with served(small_file) as server:
        port = server.server_address[1]
        for data in (head_bytes(server)[:30], head_bytes(server, "/api/graph?name=g") + b"\r\n"):
            conn = socket.create_connection(("127.0.0.1", port), timeout=30)
            conn.sendall(data)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # reset
            conn.close()
            time.sleep(0.5)
        assert request(server, "GET", "/api/graphs")[0] == 200
    err = capfd.readouterr().err
    assert "Traceback" not in err, err


def test_verbose_logs_never_show_the_token(small_file, capfd):
    with served(small_file, host="0.0.0.0", verbose=True) as server:
        token = server.access.token
        assert request(server, "GET", f"/api/graphs?token={token}")[0] == 200
        assert request(server, "GET", f"/api/graph?name=g&token={token}&x=1")[0] == 200
    err = capfd.readouterr().err
    assert "GET /api/graphs?token=" in err  # the request is logged ...
    assert token not in err and token[:8] not in err  # ... its token is not


def nested(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


TEXTS = {"surrogate": '"bad \\ud800"', "nul": '"bad \\u0000"'}
"""JSON strings that decode to a lone surrogate / hold a NUL: neither can be stored in HDF5."""


@pytest.mark.parametrize("case", ["nested", "surrogate", "nul"])
def test_supernode_bodies_that_gave_500_are_refused_with_400(small_file, case):
    graph = random_graph(0)
    i = int((graph.nodes.kind == "feature").nonzero()[0][0])
    member = ["feature", int(graph.nodes.layer[i]), int(graph.nodes.position[i]), int(graph.nodes.feature[i])]
    body = (
        f'{{"graph": "g", "supernodes": [{{"name": {TEXTS.get(case)}, "members": [{json.dumps(member)}]}}]}}'
    )
    data = nested(400_000) if case == "nested" else body.encode()
    assert len(data) <= 1 << 20  # within the body limit: refused for what it holds
    before = sha(small_file)
    with served(small_file) as server:
        status, reply = request(server, "POST", "/api/supernodes", data)
        assert status == 400, (case, reply[:300])
        assert json.loads(reply)["error"]
    assert sha(small_file) == before


@pytest.mark.bundled("default", "default-plt")
@pytest.mark.parametrize("case", ["nested", "surrogate", "nul"])
def test_label_bodies_that_gave_500_are_refused_with_400(ioi, ioi_file, tmp_path, case):
    """On a graph whose dashboards file can hold labels (a copy of the bundled one)."""
    import shutil

    from transcoders.paths import BUNDLED

    boards = tmp_path / "boards.h5"
    shutil.copyfile(BUNDLED["default-plt"] / "dashboards.h5", boards)
    i = int((ioi.nodes.kind == "feature").nonzero()[0][0])
    feat = f'"site": "mlp", "layer": {int(ioi.nodes.layer[i])}, "feature": {int(ioi.nodes.feature[i])}'
    body = f'{{"graph": "ioi", "labels": [{{{feat}, "label": {TEXTS.get(case)}}}]}}'
    data = nested(400_000) if case == "nested" else body.encode()
    before = sha(boards), sha(ioi_file)
    with served(ioi_file, dashboards=boards) as server:
        good = body.replace(TEXTS.get(case) or "None", '"fine"').encode()
        if case != "nested":
            assert request(server, "POST", "/api/labels", good)[0] == 200  # the same request, plain text
        before = sha(boards), sha(ioi_file)
        status, reply = request(server, "POST", "/api/labels", data)
        assert status == 400, (case, reply[:300])
        assert json.loads(reply)["error"]
    assert (sha(boards), sha(ioi_file)) == before


def test_a_write_without_content_type_is_refused(small_file):
    before = sha(small_file)
    with served(small_file) as server:
        port = server.server_address[1]
        for route in ("/api/supernodes", "/api/labels"):
            lines = [f"POST {route} HTTP/1.1", f"Host: 127.0.0.1:{port}", f"Content-Length: {len(WIPE)}"]
            with socket.create_connection(("127.0.0.1", port), timeout=30) as conn:
                conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + WIPE)
                reply = reply_of(conn, 30)
            assert status_of(reply) == 400, reply[:300]
            assert "Content-Type: application/json" in json.loads(reply.split(b"\r\n\r\n", 1)[1])["error"]
    assert sha(small_file) == before

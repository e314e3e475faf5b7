"""The viewer's HTTP server with raw requests: its JSON, supernodes written (and refused without
touching the file), static files and paths that try to leave them, hosts and origins, bad files."""

import json

import h5py
import numpy as np
import pytest

from attrgraph.errors import GraphFileError, ServeError
from attrgraph.graph.store import save_graph
from attrgraph.graph.supernode_store import load_supernodes, save_supernodes
from attrgraph.graph.supernodes import node_key, supernode
from attrgraph.viewer.server import STATIC, make_server, static_file
from tests.attrgraph.ag_helpers import random_graph
from tests.attrgraph.viewer.viewer_helpers import get_json, request, served, sha, toy_circuits


@pytest.fixture
def small_file(tmp_path):
    """A hand-built graph as "g" (no dashboards) and the toy circuits."""
    path = tmp_path / "small.h5"
    save_graph(random_graph(0), path, "g")
    toy_circuits(path)
    return path


def test_index_graph_and_circuit_payloads(small_file):
    graph = random_graph(0)
    with served(small_file) as server:
        assert server.server_address[0] == "127.0.0.1"
        index = get_json(server, "/api/graphs")
        assert index == {"file": "small.h5", "graphs": ["g"], "circuits": ["toy-eap", "toy-peap"]}
        data = get_json(server, "/api/graph?name=g")
        assert len(data["nodes"]) == graph.n_nodes and len(data["edges"]) == graph.n_edges
        assert (
            data["editable"]
            and data["dashboards"] == {}
            and "no feature dashboards" in data["dashboards_note"]
        )
        circuit = get_json(server, "/api/circuit?name=toy-peap")
        assert circuit["kind"] == "circuit" and circuit["n_edges"] == len(circuit["edges"]) == 10
        status, body = request(server, "GET", "/api/graph?name=nope")
        assert status == 404 and "no graph named 'nope'" in json.loads(body)["error"]
        status, _ = request(server, "GET", "/api/graph")
        assert status == 400


def test_page_and_static_files_are_served(small_file):
    with served(small_file) as server:
        status, page = request(server, "GET", "/")
        assert status == 200 and b'src="static/viewer.js"' in page
        for name in ("viewer.js", "viewer.css", "index.html"):
            status, body = request(server, "GET", f"/static/{name}")
            assert status == 200 and body == (STATIC / name).read_bytes()
        assert request(server, "GET", "/static/nope.js")[0] == 404
        assert request(server, "GET", "/etc/passwd")[0] == 404


TRAVERSALS = [
    "/static/../../etc/passwd",
    "/static/../server.py",
    "/static/%2e%2e/%2e%2e/etc/passwd",
    "/static/%2E%2E%2F%2E%2E%2Fetc%2Fpasswd",
    "/static/..%2f..%2fetc/passwd",
    "/static/..%5c..%5cetc%5cpasswd",
    "/static//etc/passwd",
    "/static/%2fetc%2fpasswd",
    "/static/./viewer.js",
    "/static/viewer.js%00.png",
]


@pytest.mark.parametrize("url", TRAVERSALS)
def test_paths_that_leave_the_static_folder_are_refused(small_file, url):
    with served(small_file) as server:
        status, body = request(server, "GET", url)
    assert status == 403, (url, status)
    assert "leaves the viewer's static folder" in json.loads(body)["error"]
    assert b"root:" not in body


def test_static_file_checks_the_resolved_path():
    assert static_file("viewer.js") == STATIC / "viewer.js"
    assert static_file("missing.js") is None
    for bad in ("../server.py", "%2e%2e/server.py", "/etc/passwd", "a\\..\\..\\x", "x\0"):
        with pytest.raises(PermissionError):
            static_file(bad)


def _members(graph, ids):
    return [list(node_key(graph, int(i))) for i in ids]


def test_supernodes_posted_are_stored_and_replace_the_old_ones(small_file):
    graph = random_graph(0)
    feats = np.flatnonzero(graph.nodes.kind == "feature")
    save_supernodes(small_file, [supernode(graph, "old", feats[:1])], "g")
    body = {
        "graph": "g",
        "supernodes": [
            {"name": "first", "members": _members(graph, feats[:3])},
            {"name": "second", "members": _members(graph, feats[3:5])},
        ],
    }
    with served(small_file) as server:
        status, reply = request(server, "POST", "/api/supernodes", body)
        assert status == 200, reply
        assert json.loads(reply) == {"saved": 2, "graph": "g", "file": "small.h5"}
        data = get_json(server, "/api/graph?name=g")  # a fresh payload: the file changed
    stored = load_supernodes(small_file, "g")
    assert [s.name for s in stored] == ["first", "second"]
    assert [list(m) for m in stored[0].members] == body["supernodes"][0]["members"]
    assert [s["name"] for s in data["supernodes"]] == ["first", "second"]
    with h5py.File(small_file) as f:  # the graph and circuits are still there
        assert sorted(f["graphs"]) == ["g"] and sorted(f["circuits"]) == ["toy-eap", "toy-peap"]


def _bad_requests(graph):
    feats = np.flatnonzero(graph.nodes.kind == "feature")
    ok = _members(graph, feats[:2])
    return [
        (b"{not json", "not JSON"),
        ("\udcff".encode("utf-8", "surrogatepass"), "not JSON"),
        ([], "exactly the keys"),
        ({"graph": "g"}, "exactly the keys"),
        ({"graph": "g", "supernodes": [], "extra": 1}, "exactly the keys"),
        ({"graph": "other", "supernodes": []}, "not in this file"),
        ({"graph": "g", "supernodes": {}}, "must be a list"),
        ({"graph": "g", "supernodes": ["x"]}, "exactly the keys 'name' and 'members'"),
        ({"graph": "g", "supernodes": [{"name": "", "members": ok}]}, "needs a name"),
        ({"graph": "g", "supernodes": [{"name": 3, "members": ok}]}, "needs a name"),
        ({"graph": "g", "supernodes": [{"name": "x" * 201, "members": ok}]}, "needs a name"),
        ({"graph": "g", "supernodes": [{"name": "a", "members": []}]}, "non-empty list"),
        ({"graph": "g", "supernodes": [{"name": "a", "members": [["feature", 0, 0]]}]}, "a member is"),
        ({"graph": "g", "supernodes": [{"name": "a", "members": [["head", 0, 0, 1]]}]}, "a member is"),
        ({"graph": "g", "supernodes": [{"name": "a", "members": [["feature", "0", 0, 1]]}]}, "a member is"),
        ({"graph": "g", "supernodes": [{"name": "a", "members": [["feature", True, 0, 1]]}]}, "a member is"),
        ({"graph": "g", "supernodes": [{"name": "a", "members": [["feature", 0, 99, 1]]}]}, "not a node"),
        (
            {"graph": "g", "supernodes": [{"name": "a", "members": ok}, {"name": "a", "members": ok[:1]}]},
            "two supernodes are named",
        ),
        (
            {"graph": "g", "supernodes": [{"name": "a", "members": ok}, {"name": "b", "members": ok[:1]}]},
            "a node may belong to one",
        ),
    ]


@pytest.mark.parametrize("case", range(19))
def test_a_malformed_supernode_request_is_a_400_and_writes_nothing(small_file, case):
    graph = random_graph(0)
    cases = _bad_requests(graph)
    assert len(cases) == 19
    body, match = cases[case]
    save_supernodes(small_file, [supernode(graph, "kept", [5])], "g")
    before = sha(small_file)
    with served(small_file) as server:
        status, reply = request(server, "POST", "/api/supernodes", body)
    assert status == 400, reply
    assert match in json.loads(reply)["error"]
    assert sha(small_file) == before
    assert [s.name for s in load_supernodes(small_file, "g")] == ["kept"]


def test_posts_that_are_not_json_too_large_or_cross_site_are_refused(small_file):
    before = sha(small_file)
    body = {"graph": "g", "supernodes": []}
    with served(small_file) as server:
        status, reply = request(server, "POST", "/api/supernodes", b"graph=g", {"Content-Type": "text/plain"})
        assert status == 400 and b"application/json" in reply
        status, reply = request(server, "POST", "/api/supernodes", body, {"Origin": "http://evil.example"})
        assert status == 403
        status, _ = request(server, "POST", "/api/supernodes", body, {"Content-Length": str(1 << 24)})
        assert status == 413
        status, _ = request(server, "POST", "/api/elsewhere", body)
        assert status == 404
        status, reply = request(server, "GET", "/api/graphs", headers={"Host": "evil.example:80"})
        assert status == 403  # DNS rebinding: a foreign name resolving to 127.0.0.1
    assert sha(small_file) == before


def test_a_port_in_use_is_one_clear_error(small_file):
    with served(small_file) as server:
        port = server.server_address[1]
        with pytest.raises(ServeError, match=f"port {port} on 127.0.0.1 is in use; pick another with --port"):
            make_server(small_file, port=port)


def test_a_file_with_nothing_to_view_is_refused(tmp_path):
    empty = tmp_path / "empty.h5"
    with h5py.File(empty, "w") as f:
        f.attrs["format"] = "attrgraph"
    with pytest.raises(
        GraphFileError, match="holds no graphs or circuits to view; write one with `attrgraph build"
    ):
        make_server(empty, port=0)
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(GraphFileError, match="is not an HDF5 file"):
        make_server(text, port=0)
    with pytest.raises(GraphFileError, match="does not exist"):
        make_server(tmp_path / "missing.h5", port=0)


def test_a_wrong_dashboards_option_is_refused_before_serving(small_file, tmp_path):
    with pytest.raises(GraphFileError, match="no dashboards file at"):
        make_server(small_file, port=0, dashboards=tmp_path / "nothing")


def test_stopping_waits_for_requests_being_answered_not_for_idle_connections(small_file):
    """`wait_for_requests` after `shutdown`: a connection kept alive between requests is not a
    request (with a 600 s socket timeout it would hold the wait that long), and a request sent on it
    afterwards is not answered: the connection is closed."""
    import http.client
    import threading

    from tests.attrgraph.viewer.viewer_helpers import PAGE_HEADER

    server = make_server(small_file, port=0, socket_timeout=600)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=60)
    try:
        conn.request("GET", "/api/graphs", headers={PAGE_HEADER: "1"})
        response = conn.getresponse()
        assert response.status == 200 and json.loads(response.read())["graphs"] == ["g"]
        server.shutdown()
        server.server_close()
        thread.join(5)
        assert server.active == 1  # the kept-alive connection's thread, waiting for a next request
        assert server.wait_for_requests(30) == 0
        conn.request("GET", "/api/graphs", headers={PAGE_HEADER: "1"})
        with pytest.raises((ConnectionError, http.client.RemoteDisconnected)):
            conn.getresponse()
    finally:
        conn.close()

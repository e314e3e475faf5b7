"""Each view's reply bytes are made once per file version (encoded.py) and sent gzipped to a client
that accepts it: the same JSON either way, the same bytes object for every request until the file
changes. `Accept-Encoding` is read as RFC 9110 section 12.5.3 writes it (q=0 means "not this")."""

import gzip
import json

import pytest

from attrgraph.graph.store import save_graph
from attrgraph.viewer.encoded import accepts_gzip
from tests.attrgraph.ag_helpers import random_graph
from tests.attrgraph.viewer.viewer_helpers import PAGE_HEADER, served


@pytest.mark.parametrize(
    "header, want",
    [
        (None, False),
        ("", False),
        ("gzip", True),
        ("GZIP", True),
        ("gzip, deflate, br", True),
        ("deflate, gzip;q=1.0, *;q=0.5", True),  # RFC 9110's example
        ("gzip;q=0", False),
        ("gzip; q=0.0", False),
        ("*", True),
        ("identity", False),
        ("br, deflate", False),
    ],
)
def test_accept_encoding(header, want):
    assert accepts_gzip(header) is want


def get(server, url: str, encoding: str | None) -> tuple[int, dict, bytes]:
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=30)
    heads = {PAGE_HEADER: "1", **({"Accept-Encoding": encoding} if encoding else {})}
    conn.request("GET", url, headers=heads)
    r = conn.getresponse()
    out = r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    conn.close()
    return out


def test_a_view_is_encoded_once_and_gzipped_for_clients_that_take_it(tmp_path):
    path = tmp_path / "g.h5"
    save_graph(random_graph(0, n_feat=200), path, "g")
    with served(path) as server:
        status, heads, plain = get(server, "/api/graph?name=g", None)
        assert status == 200 and "content-encoding" not in heads
        status, heads, packed = get(server, "/api/graph?name=g", "gzip, deflate")
        assert status == 200 and heads["content-encoding"] == "gzip" and heads["vary"] == "Accept-Encoding"
        assert int(heads["content-length"]) == len(packed) < len(plain)
        assert gzip.decompress(packed) == plain
        assert json.loads(plain)["name"] == "g"
        viewer = server.viewer
        first = viewer.payload_bytes("graph", "g")
        assert viewer.payload_bytes("graph", "g") is first  # kept, not re-encoded
        save_graph(random_graph(1), path, "h")  # a new file version: encoded anew
        assert viewer.payload_bytes("graph", "g") is not first
        status, heads, tiny = get(server, "/api/graphs", "gzip")
        assert "content-encoding" not in heads  # a reply gzip would only grow goes as it is
        assert json.loads(tiny)["graphs"] == ["g", "h"]

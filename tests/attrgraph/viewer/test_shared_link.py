"""A Neuronpedia link pasted into the page (POST /api/view): its supernodes and pins shown on the
IOI graph, stored by the page's own save; the endpoint under the writes' rules, writing nothing.
Expected values: the nodes the link's ids name, found by the ids our export gives them (which
test_shared_view.py checks against circuit-tracer's decoder and exporter)."""

import json
import urllib.parse

import numpy as np
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from attrgraph.graph.neuronpedia import node_ids
from attrgraph.graph.supernode_store import load_supernodes
from attrgraph.graph.supernodes import Supernode, node_key
from tests.attrgraph.ag_helpers import random_graph
from tests.attrgraph.viewer.viewer_helpers import (
    assert_refused_as_writes_are,
    open_page,
    request,
    served,
    sha,
    token_headers,
)

HOSTS = ["127.0.0.1", "0.0.0.0"]


@pytest.fixture
def small_file(tmp_path):
    """A hand-built graph "g", alone in its file."""
    from attrgraph.graph.store import save_graph

    path = tmp_path / "small.h5"
    save_graph(random_graph(0), path, "g")
    return path


def page_link(pinned, groups) -> str:
    query = {"slug": "ioi", "pinnedIds": ",".join(pinned), "supernodes": json.dumps(groups)}
    return "https://www.neuronpedia.org/default/graph?" + urllib.parse.urlencode(query)


def absent_feature(graph, layer: int, pos: int) -> str:
    """The id of a feature of (layer, pos) that the graph does not hold."""
    n = graph.nodes
    have = set(n.feature[(n.kind == "feature") & (n.layer == layer) & (n.position == pos)].tolist())
    return f"{layer}_{min(set(range(len(have) + 1)) - have)}_{pos}"


def import_link(browser, server, ioi, link: str):
    """The IOI graph's page with `link` pasted and imported; its status line."""
    open_page(browser, server, "graph:ioi", ioi.n_nodes)
    browser.find_element(By.ID, "view-link").send_keys(link)
    browser.find_element(By.ID, "import-view").click()
    status = browser.find_element(By.ID, "save-status")
    WebDriverWait(browser, 20).until(lambda b: "imported" in status.text)
    return status


@pytest.mark.bundled("default", "default-plt")
def test_a_pasted_link_shows_its_supernodes_and_pins_and_save_stores_them(browser, ioi, ioi_file):
    ids = node_ids(ioi)
    index = {x: i for i, x in enumerate(ids)}
    feats = [ids[i] for i in np.flatnonzero(ioi.nodes.kind == "feature")]
    gone = absent_feature(ioi, 0, 1)
    groups = [["names", feats[0], feats[1], gone], ["to", feats[-1]]]
    pinned = [feats[2], ids[0]]
    with served(ioi_file) as server:
        status = import_link(browser, server, ioi, page_link(pinned, groups))
        assert status.text == (
            "imported 2 supernodes and 2 pins; 1 member not in this graph left out; not saved yet."
        )
        names = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#supernode-list .name")]
        assert names == ["names", "to"]
        shown = browser.execute_script("return [...window.attrgraphViewer.pinned].sort((a, b) => a - b)")
        page_of = browser.execute_script("return window.attrgraphViewer.data.nodes.map(n => n.key)")
        assert sorted(tuple(page_of[i]) for i in shown) == sorted(
            tuple(node_key(ioi, index[x])) for x in pinned
        )
        assert browser.find_element(By.ID, "pin-count").text == "2"
        browser.find_element(By.ID, "save").click()
        WebDriverWait(browser, 20).until(lambda b: "saved" in status.text)
    assert load_supernodes(ioi_file, "ioi") == [
        Supernode("names", (node_key(ioi, index[feats[0]]), node_key(ioi, index[feats[1]]))),
        Supernode("to", (node_key(ioi, index[feats[-1]]),)),
    ]


@pytest.mark.parametrize("host", HOSTS)
def test_the_link_endpoint_follows_the_writes_rules_and_writes_nothing(small_file, host):
    from attrgraph.graph.store import load_graph

    graph = load_graph(small_file, "g")
    ids = node_ids(graph)
    feats = [ids[i] for i in np.flatnonzero(graph.nodes.kind == "feature")]
    good = json.dumps({"graph": "g", "link": page_link([feats[0]], [["pair", feats[1], feats[2]]])}).encode()
    before = sha(small_file)
    with served(small_file, host=host) as server:
        tok = token_headers(server)
        assert_refused_as_writes_are(server, "/api/view", good)
        status, reply = request(server, "POST", "/api/view", good, tok)
        assert status == 200
        answer = json.loads(reply)
        assert answer["supernodes"] == [
            {"name": "pair", "members": [list(node_key(graph, ids.index(f))) for f in feats[1:3]]}
        ]
        assert answer["pinned"] == [list(node_key(graph, ids.index(feats[0])))]
        for body, says in (
            (b"{", "is not JSON"),
            (json.dumps({"graph": "g"}).encode(), "must be a JSON object {'graph': NAME, 'link'"),
            (json.dumps({"graph": "nope", "link": "x"}).encode(), "graph 'nope' is not in this file"),
            (
                json.dumps({"graph": "g", "link": "https://www.neuronpedia.org/x/graph?slug=s"}).encode(),
                "holds no",
            ),
            (
                json.dumps({"graph": "g", "link": page_link(["E_99999_0"], [])}).encode(),
                "shows another prompt",
            ),
        ):
            status, reply = request(server, "POST", "/api/view", body, tok)
            assert status == 400 and says in json.loads(reply)["error"], reply
        assert request(server, "GET", "/api/view", None, tok)[0] == 404
    assert sha(small_file) == before


# ------------------------------------------------------------------------------------ POST /api/link
@pytest.mark.bundled("default", "default-plt")
def test_the_page_makes_a_link_of_what_it_shows(browser, ioi, ioi_file):
    """A link pasted (its supernodes and pins shown), then "link for Neuronpedia": the link made
    reads back (read_view, whose reading test_shared_view.py checks against circuit-tracer's
    decoder) as the supernodes and pins the page shows, on Neuronpedia's page of the slug given."""
    from attrgraph.graph.shared_view import read_view

    ids = node_ids(ioi)
    index = {x: i for i, x in enumerate(ids)}
    feats = [ids[i] for i in np.flatnonzero(ioi.nodes.kind == "feature")]
    groups = [["names", feats[0], feats[1]], ["to", feats[-1]]]
    pinned = [feats[2], ids[0]]
    with served(ioi_file) as server:
        status = import_link(browser, server, ioi, page_link(pinned, groups))
        browser.find_element(By.ID, "make-link").click()
        WebDriverWait(browser, 20).until(lambda b: "fill in" in status.text)  # no model id nor slug yet
        browser.find_element(By.ID, "np-model").send_keys("attrgraph-default")
        browser.find_element(By.ID, "np-slug").send_keys("ioi-mine")
        browser.find_element(By.ID, "make-link").click()
        WebDriverWait(browser, 20).until(lambda b: "a link with" in status.text)
        link = browser.find_element(By.ID, "np-link").get_attribute("value")
    assert link.startswith("https://www.neuronpedia.org/attrgraph-default/graph?slug=ioi-mine&")
    view = read_view(link, ioi)
    assert view.supernodes == (
        Supernode("names", (node_key(ioi, index[feats[0]]), node_key(ioi, index[feats[1]]))),
        Supernode("to", (node_key(ioi, index[feats[-1]]),)),
    )
    assert set(view.pinned) >= {node_key(ioi, index[x]) for x in pinned} and not view.absent


@pytest.mark.parametrize("host", HOSTS)
def test_the_link_maker_follows_the_writes_rules_and_writes_nothing(small_file, host):
    from attrgraph.graph.shared_view import read_view
    from attrgraph.graph.store import load_graph

    graph = load_graph(small_file, "g")
    feats = [list(node_key(graph, int(i))) for i in np.flatnonzero(graph.nodes.kind == "feature")]
    request_of = lambda **kw: json.dumps(  # noqa: E731
        {"graph": "g", "supernodes": [{"name": "pair", "members": feats[1:3]}], "pinned": [feats[0]],
         "model": "m", "slug": "s"} | kw
    ).encode()  # fmt: skip
    before = sha(small_file)
    with served(small_file, host=host) as server:
        tok = token_headers(server)
        assert_refused_as_writes_are(server, "/api/link", request_of())
        status, reply = request(server, "POST", "/api/link", request_of(), tok)
        assert status == 200, reply
        view = read_view(json.loads(reply)["link"], graph)
        assert view.supernodes == (Supernode("pair", tuple(tuple(m) for m in feats[1:3])),)
        assert view.pinned[0] == tuple(feats[0])
        gone = ["feature", 0, 0, 10**6]
        for body, says in (
            (b"[", "is not JSON"),
            (json.dumps({"graph": "g"}).encode(), "must be a JSON object with exactly the keys"),
            (request_of(graph="nope"), "graph 'nope' is not in this file"),
            (request_of(model=" "), "model must be Neuronpedia's model id"),
            (request_of(slug=3), "slug must be Neuronpedia's slug of the graph"),
            (request_of(pinned=[["neuron", 0, 0, 1]]), "pin 0 has member ['neuron', 0, 0, 1]"),
            (request_of(pinned=[gone]), f"pinned node {gone + ['mlp']} is not a node of this graph"),
            (
                request_of(supernodes=[{"name": "a", "members": [gone]}]),
                f"supernode 'a' member {gone + ['mlp']} is not a node of this graph",
            ),
        ):
            status, reply = request(server, "POST", "/api/link", body, tok)
            assert status == 400 and says in json.loads(reply)["error"], reply
    assert sha(small_file) == before

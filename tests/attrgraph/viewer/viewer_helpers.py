"""Helpers for the viewer tests: graph files, a server in a thread, a headless chromium."""

import contextlib
import hashlib
import http.client
import json
import os
import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import torch

PAGE_HEADER = "X-Attrgraph-Page"
"""The header the page's reads carry (access.py step 4; viewer.js getJSON sends it)."""

PROMPT = "When Mary and John went to the store, John gave a drink to"


def ioi_graph():
    """The pruned IOI graph of the bundled model and default-plt, as `attrgraph build` makes it."""
    from attrgraph.bundled.loading import load_model
    from attrgraph.engine.attribute import attribute
    from attrgraph.graph.prune import prune_graph
    from transcoders.formats import load_transcoders

    model = load_model("default")
    graph = attribute(model, load_transcoders("default-plt"), PROMPT, progress=False)
    graph.meta.update(model="default", transcoders="default-plt")
    return prune_graph(graph, 0.8, 0.98)


def toy_circuits(path: Path) -> None:
    """Two hand-built circuits in `path`: non-positional ("toy-eap") and positional ("toy-peap")."""
    from attrgraph.circuits.circuit import EdgeLayout, EdgeScores
    from attrgraph.circuits.construct import greedy
    from attrgraph.circuits.graph import ComponentGraph
    from attrgraph.circuits.store import save_circuit

    g = ComponentGraph(2, 2, True)
    gen = torch.Generator().manual_seed(0)
    flat = EdgeLayout(g)
    scores = EdgeScores(flat, torch.randn(g.valid.shape, generator=gen) * g.valid)
    save_circuit(greedy(scores, 8), path, "toy-eap", scores)
    pos = EdgeLayout(g, ("t0", "t1", "t2"), torch.tril(torch.ones(3, 3, dtype=torch.bool)))
    resid = torch.randn(pos.resid_valid().shape, generator=gen) * pos.resid_valid()
    attn = torch.randn(pos.attn_valid_full().shape, generator=gen) * pos.attn_valid_full()
    pscores = EdgeScores(pos, resid, attn, "peap")
    save_circuit(greedy(pscores, 10), path, "toy-peap", pscores)


def sha(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@contextlib.contextmanager
def served(path, **kwargs):
    """A viewer server for `path` on a free port (of 127.0.0.1 unless `host=`), serving in a thread."""
    from attrgraph.viewer.server import make_server

    server = make_server(path, port=0, **kwargs)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
        # a model panel the page asked for ends here, not inside torch as the interpreter exits (which
        # aborts it: ViewerServer.wait_for_requests)
        assert server.wait_for_requests(300) == 0


def request(server, method: str, url: str, body=None, headers=None) -> tuple[int, bytes]:
    """A raw request (http.client sends the path as given: no normalisation of `..`) to 127.0.0.1,
    with the header the page sends on its reads (access.py step 4) unless `headers` sets it to None."""
    port = server.server_address[1]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        data = body if isinstance(body, bytes | None) else json.dumps(body).encode()
        heads = {"Content-Type": "application/json"} if data is not None else {}
        heads[PAGE_HEADER] = "1"
        headers = {k: v for k, v in {**heads, **(headers or {})}.items() if v is not None}
        conn.request(method, url, body=data, headers=headers)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def get_json(server, url: str):
    status, body = request(server, "GET", url)
    assert status == 200, body
    return json.loads(body)


def chromium(tmpdir: Path):
    """A headless chromium driven by chromium-driver; fails (never skips) when either is missing.
    Its temporary files go to `tmpdir`: chromium leaves its socket folder behind when chromedriver
    stops it, which would otherwise be one more `/tmp/org.chromium.Chromium.*` each time."""
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    browser, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (browser and driver):
        pytest.fail(
            "the viewer's browser tests need Debian's chromium and chromium-driver "
            "(apt-get install chromium chromium-driver; .ci/run installs them); they do not skip.",
            pytrace=False,
        )
    options = Options()
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--window-size=1400,900",
    ):
        options.add_argument(arg)
    options.binary_location = browser
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(
        service=Service(driver, env={**os.environ, "TMPDIR": str(tmpdir)}), options=options
    )


def open_page(browser, server, hash_: str, n_nodes: int | None = None):
    """Load the page at view `hash_` and wait for its data (and for `n_nodes` drawn nodes)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get("about:blank")
    browser.get(server.url + "#" + hash_)
    WebDriverWait(browser, 20).until(
        lambda b: b.execute_script("return !!(window.attrgraphViewer && window.attrgraphViewer.data)")
    )
    if n_nodes is not None:
        WebDriverWait(browser, 20).until(lambda b: len(b.find_elements(By.CSS_SELECTOR, "g.node")) == n_nodes)


def token_headers(server) -> dict:
    """The token header a server beyond loopback needs on every API call (none on loopback)."""
    from attrgraph.viewer.access import TOKEN_HEADER

    return {TOKEN_HEADER: server.access.token} if server.access.token else {}


def assert_refused_as_writes_are(server, route: str, body: bytes) -> None:
    """A POST of `body` to `route` refused with Origin null or another site's (403), as text/plain
    (400), and without the token beyond loopback (403): the writes' rules (access.py step 3)."""
    tok = token_headers(server)
    for headers, status in (
        ({"Origin": "null", **tok}, 403),
        ({"Origin": "http://evil.example", **tok}, 403),
        ({"Content-Type": "text/plain", **tok}, 400),
    ):
        assert request(server, "POST", route, body, headers)[0] == status, headers
    if server.access.token:
        assert request(server, "POST", route, body)[0] == 403


def click_node(browser, node: int, shift: bool = False) -> None:
    """A (shift-)click on node `node` wherever the camera is: the page's own click handler runs, as
    for a person who panned to it first (WebDriver refuses a click on a node outside the window)."""
    browser.execute_script(
        "document.querySelector(`g.node[data-id='${arguments[0]}']`)"
        ".dispatchEvent(new MouseEvent('click', {bubbles: true, shiftKey: arguments[1]}));",
        node,
        shift,
    )


def hover_node(browser, node: int) -> None:
    """The pointer entering node `node` (its mouseenter handler), wherever the camera is."""
    browser.execute_script(
        "document.querySelector(`g.node[data-id='${arguments[0]}']`).dispatchEvent(new MouseEvent('mouseenter'));",
        node,
    )


def random_full_graph(seed: int = 0, n_feat: int = 60):
    """A random graph that looks unpruned (no meta["pruned"]), with influence computed."""
    from attrgraph.graph.prune import compute_influence, normalize_matrix
    from tests.attrgraph.ag_helpers import random_graph

    g = random_graph(seed, n_feat=n_feat)
    g.nodes.influence = compute_influence(normalize_matrix(g.adjacency), g.logit_weights()).astype(np.float32)
    return g

"""What a first look at the viewer gives (issue 31, "Reading"), in headless chromium: the default
draws the focused node's edges and only the strongest few elsewhere (not a hairball of every
edge), labels of a crowded layer clear each other, the token axis is readable, the selected edge
is kept in the URL, and a CLT + attention-SAE graph draws as the MLP-only one does. Expected
edges come from the stored Graph's adjacency, not from the page."""

import math

import numpy as np
import pytest
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from tests.attrgraph.viewer.viewer_helpers import PROMPT, click_node, served

pytestmark = pytest.mark.bundled("default", "default-plt")
TOP_EDGES = 60
"""Edges drawn thin when no node is focused (viewer.js TOP_EDGES; the issue's "thin top-k")."""


def severe(browser) -> list:
    return [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def open_page(browser, server, view: str, n_nodes: int):
    browser.get("about:blank")
    browser.get(server.url + "#" + view)
    WebDriverWait(browser, 20).until(lambda b: len(b.find_elements(By.CSS_SELECTOR, "g.node")) == n_nodes)


def visible_edges(browser) -> set[tuple[int, int]]:
    """(source, target) of every edge path the page shows (display not none)."""
    pairs = browser.execute_script(
        "return [...document.querySelectorAll('#graph path.edge')]"
        ".filter((p) => getComputedStyle(p).display !== 'none')"
        ".map((p) => [Number(p.dataset.src), Number(p.dataset.tgt)]);"
    )
    return {(s, t) for s, t in pairs}


def edges_of(graph) -> list[tuple[int, int, float]]:
    A = graph.adjacency.tocoo()
    return [(int(s), int(t), float(w)) for t, s, w in zip(A.row, A.col, A.data)]


def test_the_default_draws_the_focused_nodes_edges_and_a_thin_top_k(browser, ioi, ioi_file):
    edges = edges_of(ioi)
    strongest = {(s, t) for s, t, _ in sorted(edges, key=lambda e: -abs(e[2]))[:TOP_EDGES]}
    feats = np.flatnonzero(ioi.nodes.kind == "feature")
    node = int(feats[np.argmax(ioi.nodes.influence[feats])])
    touching = {(s, t) for s, t, _ in edges if node in (s, t)}
    with served(ioi_file) as server:
        open_page(browser, server, "graph:ioi", ioi.n_nodes)
        assert len(browser.find_elements(By.CSS_SELECTOR, "path.edge")) == ioi.n_edges > TOP_EDGES
        assert visible_edges(browser) == strongest
        widths = browser.execute_script(
            "return [...document.querySelectorAll('#graph path.edge.top')].map((p) => getComputedStyle(p).strokeWidth);"
        )
        assert set(widths) == {"1.2px"}  # thin
        click_node(browser, node)
        assert visible_edges(browser) == strongest | touching
        open_page(browser, server, f"graph:ioi&sel={node}", ioi.n_nodes)  # selected in the URL
        assert visible_edges(browser) == strongest | touching
        browser.find_element(By.ID, "all-edges").click()
        assert len(visible_edges(browser)) == ioi.n_edges
        assert "all=1" in browser.current_url
    assert severe(browser) == []


def test_the_selected_edge_is_kept_in_the_url(browser, ioi, ioi_file):
    s, t, _ = max(edges_of(ioi), key=lambda e: abs(e[2]))
    with served(ioi_file) as server:
        open_page(browser, server, "graph:ioi", ioi.n_nodes)
        assert browser.execute_script(f"return window.attrgraphViewer.selectEdge({s}, {t});")
        url = browser.current_url
        assert url.endswith(f"&edge={s}.{t}") or f"&edge={s}.{t}&" in url, url
        open_page(browser, server, url.split("#", 1)[1], ioi.n_nodes)  # a fresh page at that URL
        WebDriverWait(browser, 20).until(lambda b: b.find_elements(By.CSS_SELECTOR, "path.edge.selected"))
        chosen = browser.find_element(By.CSS_SELECTOR, "path.edge.selected")
        assert (int(chosen.get_attribute("data-src")), int(chosen.get_attribute("data-tgt"))) == (s, t)
        assert chosen.is_displayed()
        assert browser.find_element(By.CSS_SELECTOR, "#details h3.edge-label").text == "Edge"
    assert severe(browser) == []


def label_geometry(browser) -> list[dict]:
    """Every node label: anchor (x, y), angle (degrees, from its rotate()), font size (user units)."""
    return browser.execute_script(
        "return [...document.querySelectorAll('#graph text.nlabel')].map((t) => ({"
        "x: Number(t.getAttribute('x')), y: Number(t.getAttribute('y')),"
        "angle: Number(/rotate\\(([-\\d.]+)/.exec(t.getAttribute('transform'))[1]),"
        "size: parseFloat(getComputedStyle(t).fontSize)}));"
    )


def test_labels_of_a_crowded_layer_clear_each_other_and_the_token_axis_is_readable(browser, ioi, ioi_file):
    """Labels in one row are parallel lines of text: two clear each other when their anchors are at
    least a font size apart across the text (|dx| * sin(angle)). The token axis: every token
    shown, each at least 10 px on screen, neighbours clear of each other the same way."""
    with served(ioi_file) as server:
        open_page(browser, server, "graph:ioi", ioi.n_nodes)
        k = browser.execute_script("return window.attrgraphViewer.cam.k;")
        labels = label_geometry(browser)
        rows: dict[float, list[dict]] = {}
        for lab in labels:
            rows.setdefault(lab["y"], []).append(lab)
        crowded = max(len(r) for r in rows.values())
        assert crowded >= 8  # the IOI graph has a crowded layer
        for row in rows.values():
            xs = sorted(lab["x"] for lab in row)
            sin = abs(math.sin(math.radians(row[0]["angle"])))
            gaps = [b - a for a, b in zip(xs, xs[1:])]
            if gaps:
                assert min(gaps) * sin >= row[0]["size"], (min(gaps), sin, row[0]["size"])
        tokens = browser.execute_script(
            "return [...document.querySelectorAll('#graph text.col-label')].map((t) => ({"
            "text: t.textContent, x: Number(t.getAttribute('x')),"
            "angle: Number(/rotate\\(([-\\d.]+)/.exec(t.getAttribute('transform'))[1]),"
            "size: parseFloat(getComputedStyle(t).fontSize)}));"
        )
        assert len(tokens) == ioi.n_pos
        for tok in tokens:
            assert tok["size"] * k >= 10 - 1e-6, tok  # on screen, in CSS pixels
        xs = [tok["x"] for tok in tokens]
        sin = abs(math.sin(math.radians(tokens[0]["angle"])))
        assert min(b - a for a, b in zip(xs, xs[1:])) * sin >= tokens[0]["size"]
    assert severe(browser) == []


@pytest.fixture(scope="module")
def clt_attn(tmp_path_factory):
    """The IOI prompt with the bundled CLT and attention SAE, pruned as `attrgraph build` does."""
    import torch

    import attrgraph
    from attrgraph.graph.store import save_graph
    from transcoders import load_transcoders

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = attrgraph.load_model("default")
        sets = [load_transcoders("default-clt"), load_transcoders("default-attn-sae")]
        graph = attrgraph.prune_graph(attrgraph.attribute(model, sets, PROMPT, progress=False), 0.8, 0.98)
    finally:
        torch.set_num_threads(n)
    graph.meta.update(model="default", transcoders="default-clt", attn_transcoders="default-attn-sae")
    path = tmp_path_factory.mktemp("clt") / "clt.h5"
    save_graph(graph, path, "clt-attn")
    return graph, path


@pytest.mark.bundled("default", "default-clt", "default-attn-sae")
def test_a_clt_and_attention_sae_graph_draws_and_shows_both_kinds_of_feature(browser, clt_attn):
    graph, path = clt_attn
    feats = np.flatnonzero(graph.nodes.kind == "feature")
    attn = [int(i) for i in feats if graph.nodes.site[i] == "attn"]
    mlp = [int(i) for i in feats if graph.nodes.site[i] != "attn"]
    assert attn and mlp
    with served(path) as server:
        open_page(browser, server, "graph:clt-attn", graph.n_nodes)
        assert len(browser.find_elements(By.CSS_SELECTOR, "path.edge")) == graph.n_edges
        drawn_attn = {
            int(e.get_attribute("data-id"))
            for e in browser.find_elements(By.CSS_SELECTOR, "g.node.feature.attn")
        }
        assert drawn_attn == set(attn)
        for i, letter in ((attn[0], "A"), (mlp[0], "L")):
            click_node(browser, i)
            WebDriverWait(browser, 20).until(
                lambda b, i=i, letter=letter: (
                    f"{letter}{graph.nodes.layer[i]}/F{graph.nodes.feature[i]}"
                    in b.find_element(By.ID, "details").text
                )
            )
            touching = {(s, t) for s, t, _ in edges_of(graph) if i in (s, t)}
            assert touching <= visible_edges(browser)
    assert severe(browser) == []

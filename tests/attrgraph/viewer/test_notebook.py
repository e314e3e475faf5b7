"""`attrgraph.show(graph)`: one self-contained page (no server, no network) that draws the graph
in chromium from a file:// URL, inside an iframe for Jupyter; text in the graph cannot end its
script element."""

import html
import re

import numpy as np
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

import attrgraph
from attrgraph.graph.supernodes import supernode
from attrgraph.viewer.notebook import GraphView
from tests.attrgraph.ag_helpers import random_graph

HOSTILE = "</script><script>document.title='owned'</script>"


def hostile_graph():
    g = random_graph(2)
    g.prompt_tokens[0] = HOSTILE  # a prompt may hold any text
    g.logit_strings[0] = "<!--"
    return g


def test_one_page_with_everything_inline():
    g = random_graph(2)
    view = attrgraph.show(g, supernodes=[supernode(g, "pair", [10, 11])])
    assert isinstance(view, GraphView)
    page = view.html
    assert "static/viewer" not in page and "<style>" in page and "window.ATTRGRAPH_DATA = {" in page
    # nothing is loaded from anywhere: no src/href but data: and the inline page itself
    assert re.findall(r'(?:src|href)="([^"]*)"', page) == ["data:,"]
    assert repr(view) == f"GraphView('graph': {g.n_nodes} nodes, {g.n_edges} edges)"
    assert view.payload["editable"] is False and view.payload["supernodes"][0]["name"] == "pair"
    frame = view._repr_html_()
    assert frame.startswith('<iframe srcdoc="') and html.unescape(frame.split('"')[1]) == page


def test_the_standalone_page_draws_the_graph_offline(browser, tmp_path):
    g = hostile_graph()
    path = attrgraph.show(g, supernodes=[supernode(g, "pair", [10, 11])]).save(tmp_path / "view.html")
    browser.get_log("browser")
    browser.get(path.as_uri())
    WebDriverWait(browser, 20).until(lambda b: len(b.find_elements(By.CSS_SELECTOR, "g.node")) == g.n_nodes)
    assert len(browser.find_elements(By.CSS_SELECTOR, "path.edge")) == g.n_edges
    assert browser.title == "attrgraph viewer"  # the hostile token ran nothing
    labels = [e.text for e in browser.find_elements(By.CSS_SELECTOR, "#canvas text.col-label")]
    assert labels[0] == HOSTILE[:13] + "…"
    assert len(browser.find_elements(By.CSS_SELECTOR, "g.group")) == 1
    assert not browser.find_element(By.ID, "save").is_displayed()  # read-only: nothing to save to
    feature = int(np.flatnonzero(g.nodes.kind == "feature")[0])
    browser.find_element(By.CSS_SELECTOR, f'g.node[data-id="{feature}"]').click()
    assert "no feature dashboards" in browser.find_element(By.ID, "details").text
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []

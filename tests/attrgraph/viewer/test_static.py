"""The page (static/) as a person uses it, in a real headless chromium driven by chromium-driver:
it loads without console errors and draws every node and edge; clicking a feature shows its
dashboard; a supernode grouped in the page is in the HDF5 file afterwards; circuits draw too.
These tests fail, never skip, without chromium (.ci/run installs it)."""

import numpy as np
import pytest
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select, WebDriverWait

from attrgraph.graph.scores import compute_graph_scores
from attrgraph.graph.supernode_store import load_supernodes
from attrgraph.graph.supernodes import node_key
from tests.attrgraph.viewer.viewer_helpers import click_node, get_json, hover_node, served

pytestmark = pytest.mark.bundled("default", "default-plt")


def severe(browser) -> list:
    return [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def open_page(browser, server, view: str, n_nodes: int):
    browser.get(server.url + "#" + view)
    WebDriverWait(browser, 20).until(lambda b: len(b.find_elements(By.CSS_SELECTOR, "g.node")) == n_nodes)


def test_the_page_draws_every_node_and_edge_without_console_errors(browser, ioi, ioi_file):
    browser.get_log("browser")  # start from an empty log
    with served(ioi_file) as server:
        open_page(browser, server, "graph:ioi", ioi.n_nodes)
        assert len(browser.find_elements(By.CSS_SELECTOR, "g.node")) == ioi.n_nodes
        assert len(browser.find_elements(By.CSS_SELECTOR, "path.edge")) == ioi.n_edges
        kinds = {k: len(browser.find_elements(By.CSS_SELECTOR, f"g.node.{k}")) for k in ("feature", "logit")}
        assert kinds == {"feature": ioi.n_features, "logit": 1}
        negative = int((ioi.adjacency.data < 0).sum())
        assert len(browser.find_elements(By.CSS_SELECTOR, "path.edge.neg")) == negative > 0
        summary = browser.find_element(By.ID, "summary").text
        replacement = compute_graph_scores(ioi).replacement
        assert f"{ioi.n_nodes} nodes, {ioi.n_edges} edges" in summary
        assert f"replacement {replacement:.3f}" in summary, summary
        # the circuits of the file are one pick away
        circuit = get_json(server, "/api/circuit?name=toy-peap")
        Select(browser.find_element(By.ID, "pick")).select_by_value("circuit:toy-peap")
        WebDriverWait(browser, 20).until(
            lambda b: "circuit toy-peap" in b.find_element(By.ID, "summary").text
        )
        assert len(browser.find_elements(By.CSS_SELECTOR, "g.node")) == len(circuit["nodes"])
        assert len(browser.find_elements(By.CSS_SELECTOR, "path.edge")) == circuit["n_edges"] == 10
    assert severe(browser) == []


def test_clicking_a_feature_shows_its_dashboard(browser, ioi, ioi_file):
    from transcoders.dashboard_file import load_dashboards
    from transcoders.paths import BUNDLED

    feats = np.flatnonzero(ioi.nodes.kind == "feature")
    top = int(feats[np.argmax(ioi.nodes.influence[feats])])
    layer, feature = int(ioi.nodes.layer[top]), int(ioi.nodes.feature[top])
    board = load_dashboards(BUNDLED["default-plt"] / "dashboards.h5").feature(layer, feature)
    with served(ioi_file) as server:
        open_page(browser, server, "graph:ioi", ioi.n_nodes)
        details = browser.find_element(By.ID, "details")
        logit = int(browser.find_element(By.CSS_SELECTOR, "g.node.logit").get_attribute("data-id"))
        hover_node(browser, logit)  # hovering shows a node too (the logit may lie outside the window)
        assert details.find_element(By.CSS_SELECTOR, "h3.node-label").text == "logit 'Mary' p=0.994"
        assert "influence" in details.text and "incoming edges" in details.text
        click_node(browser, top)
        WebDriverWait(browser, 10).until(lambda b: "Dashboard" in details.text)
        assert details.find_element(By.CSS_SELECTOR, "h3.node-label").text == board["label"]
        assert f"L{layer}/F{feature}" in details.text
        examples = details.find_elements(By.CSS_SELECTOR, ".top-examples .example")
        assert len(examples) == len(board["top"]) > 0
        first = examples[0].find_elements(By.CSS_SELECTOR, ".tok")
        assert [t.text for t in first] == board["top"][0]["tokens"]
        centre = first[board["top"][0]["center"]]
        assert "center" in centre.get_attribute("class")
        assert f'"{board["top_logits"][0][0]}"' in details.text  # top logits listed
        n_in = int(ioi.adjacency[[top]].count_nonzero())
        assert f"incoming edges ({n_in})" in details.text
    assert severe(browser) == []


def test_a_supernode_grouped_in_the_page_is_in_the_file(browser, ioi, ioi_file):
    feats = np.flatnonzero(ioi.nodes.kind == "feature")[:3]
    with served(ioi_file) as server:
        open_page(browser, server, "graph:ioi", ioi.n_nodes)
        for i in feats:  # shift-click pins
            node = browser.find_element(By.CSS_SELECTOR, f'g.node[data-id="{i}"]')
            ActionChains(browser).key_down(Keys.SHIFT).click(node).key_up(Keys.SHIFT).perform()
        assert browser.find_element(By.ID, "pin-count").text == "3"
        browser.find_element(By.ID, "only-pinned").click()  # the pinned subgraph alone
        shown = [e for e in browser.find_elements(By.CSS_SELECTOR, "g.node") if e.is_displayed()]
        assert len(shown) == 3
        browser.find_element(By.ID, "group-name").send_keys("say Mary")
        browser.find_element(By.ID, "group").click()
        assert len(browser.find_elements(By.CSS_SELECTOR, "g.group")) == 1
        browser.find_element(By.ID, "save").click()
        status = browser.find_element(By.ID, "save-status")
        WebDriverWait(browser, 10).until(lambda b: status.text.startswith("saved"))
        assert status.text == "saved 1 supernode to graphs.h5:/supernodes/ioi."
    (stored,) = load_supernodes(ioi_file, "ioi")
    assert stored.name == "say Mary"
    assert sorted(stored.members) == sorted(node_key(ioi, int(i)) for i in feats)
    assert severe(browser) == []

"""Reading a graph in the page (headless chromium, the pruned IOI graph of the bundled model):
labels beside the nodes, the error toggle, threshold sliders and the pruning rule selector checked
against prune_graph (both rules) and scores.py, wheel zoom and drag pan with a minimum text size, search, features ranked by influence,
edge weight on hover, edge lists with layer and position, collapsed supernodes with summed edges,
the pinned pane, labels edited in the page, the view in the URL hash, the pin button after grouping.
Expected values come from the Python side (the Graph, prune.py, scores.py, the dashboards file)."""

import json
import shutil

import numpy as np
import pytest
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.common.action_chains import ActionChains
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.support.ui import Select, WebDriverWait

from attrgraph.graph.prune import RULES, prune_graph
from attrgraph.graph.scores import compute_graph_scores
from attrgraph.graph.supernode_store import save_supernodes
from attrgraph.graph.supernodes import supernode
from attrgraph.viewer.payload import view_keys
from tests.attrgraph.viewer.viewer_helpers import click_node, get_json, open_page, served, sha

pytestmark = pytest.mark.bundled("default", "default-plt")


def severe(browser) -> list:
    return [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def js(browser, script, *args):
    return browser.execute_script(script, *args)


def set_slider(browser, id_, value):
    js(
        browser,
        "const e = document.getElementById(arguments[0]); e.value = arguments[1];"
        "e.dispatchEvent(new Event('input'));",
        id_,
        str(value),
    )


IOI_THRESHOLDS = [(1.0, 1.0), (0.6, 1.0), (0.7, 0.9), (0.6, 0.6), (0.9, 0.6)]
"""(node, edge) thresholds of the slider tests on the IOI graph; by circuit-tracer's rule, a feature
drops for want of an input at (0.6, 0.6) and (0.9, 0.6), an error node for want of an output at
(0.9, 0.6)."""


def slider_reference(graph, nt: float, et: float, rule: str):
    """What the page's sliders should draw for `graph` (viewer.js step 1): prune_graph on the graph
    the page received (unmarked, so that prune_graph takes it), its step 3 ranking by each node's
    influence in the unpruned graph, which the pruned graph stores."""
    received = graph.subgraph(np.ones(graph.n_nodes, bool))
    del received.meta["pruned"]
    return prune_graph(received, nt, et, influence=graph.nodes.unpruned_influence, rule=rule)


def view_index(graph, pruned) -> list[int]:
    """For each node of `pruned` (pruned from `graph`), its index in `graph`: the page's node id."""
    where = {k: i for i, k in enumerate(view_keys(graph))}
    return [where[k] for k in view_keys(pruned)]


def pick_rule(browser, rule: str):
    Select(browser.find_element(By.ID, "prune-rule")).select_by_value(rule)


def drawn_ids(browser) -> list[int]:
    return [int(e.get_attribute("data-id")) for e in browser.find_elements(By.CSS_SELECTOR, "g.node")]


def short(text: str, n: int = 26) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def cut_from(label: str, full: str) -> bool:
    """Whether a drawn label is `full`, or `full` cut to fit its row (at least 6 characters, up to 26,
    ending in an ellipsis: viewer.js fitLabels)."""
    return (
        6 <= len(label) <= 26 and label == short(full, len(label))
        if len(full) > len(label)
        else label == full
    )


def test_features_carry_their_dashboard_labels_readable_at_default_zoom(browser, ioi, ioi_file):
    from transcoders.dashboard_file import load_dashboards
    from transcoders.paths import BUNDLED

    boards = load_dashboards(BUNDLED["default-plt"] / "dashboards.h5")
    feats = np.flatnonzero(ioi.nodes.kind == "feature")
    with served(ioi_file) as server:
        open_page(browser, server, "graph:ioi", ioi.n_nodes)
        labels = {
            # textContent: WebDriver's .text is empty for a label panned out of the window
            int(t.get_attribute("data-id")): t.get_attribute("textContent")
            for t in browser.find_elements(By.CSS_SELECTOR, "#graph text.nlabel.feature")
        }
        assert sorted(labels) == feats.tolist()
        for i in feats:
            want = boards.label(int(ioi.nodes.layer[i]), int(ioi.nodes.feature[i]))
            assert cut_from(labels[int(i)], want), (i, labels[int(i)], want)
        px = js(
            browser,
            "const t = document.querySelector('#graph text.nlabel');"
            "return parseFloat(getComputedStyle(t).fontSize) * window.attrgraphViewer.cam.k;",
        )
        assert px >= 10 - 1e-3  # on screen, in CSS pixels
        i = int(feats[0])
        browser.find_element(By.CSS_SELECTOR, f'g.node[data-id="{i}"]').click()
        details = browser.find_element(By.ID, "details").text
        assert f"L{ioi.nodes.layer[i]}/F{ioi.nodes.feature[i]}" in details
    assert severe(browser) == []


def test_error_nodes_can_be_hidden_and_shown(browser, ioi, ioi_file):
    errors = set(np.flatnonzero(ioi.nodes.kind == "error").tolist())
    A = ioi.adjacency.tocoo()
    touching = sum(1 for t, s in zip(A.row, A.col) if t in errors or s in errors)
    with served(ioi_file) as server:
        open_page(browser, server, "graph:ioi", ioi.n_nodes)
        assert len(browser.find_elements(By.CSS_SELECTOR, "g.node.error")) == len(errors) > 0
        browser.find_element(By.ID, "show-errors").click()
        assert browser.find_elements(By.CSS_SELECTOR, "g.node.error") == []
        assert len(drawn_ids(browser)) == ioi.n_nodes - len(errors)
        assert len(browser.find_elements(By.CSS_SELECTOR, "path.edge")) == ioi.n_edges - touching
        browser.find_element(By.ID, "show-errors").click()
        assert len(browser.find_elements(By.CSS_SELECTOR, "g.node.error")) == len(errors)


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("nt, et", IOI_THRESHOLDS)
def test_threshold_sliders_prune_as_prune_graph_and_scores_follow(browser, ioi, ioi_file, nt, et, rule):
    ref = slider_reference(ioi, nt, et, rule)
    scores = compute_graph_scores(ref)
    with served(ioi_file) as server:
        data = get_json(server, "/api/graph?name=ioi")
        assert data["slider_influence"] == "unpruned"  # the pruned graph stores it
        open_page(browser, server, "graph:ioi", ioi.n_nodes)
        assert browser.find_element(By.ID, "prune-rule").get_attribute("value") == ioi.meta["prune_rule"]
        pick_rule(browser, rule)
        set_slider(browser, "node-threshold", nt)
        set_slider(browser, "edge-threshold", et)
        assert sorted(drawn_ids(browser)) == sorted(view_index(ioi, ref))  # the same nodes, not only as many
        assert len(browser.find_elements(By.CSS_SELECTOR, "path.edge")) == ref.n_edges
        summary = browser.find_element(By.ID, "summary").text
        assert f"replacement {scores.replacement:.3f}" in summary, summary
        assert f"completeness {scores.completeness:.3f}" in summary, summary
        assert f"{ref.n_nodes} nodes, {ref.n_edges} edges" in summary
        assert ("rule=appendix" in browser.current_url) == (rule != ioi.meta["prune_rule"])
    assert severe(browser) == []


def test_the_two_rules_draw_different_graphs_at_the_thresholds_tested(ioi):
    """The slider test above can tell the rules apart: at each pruning threshold pair it uses, the
    two rules keep different nodes of the IOI graph."""
    for nt, et in IOI_THRESHOLDS[1:]:
        a, b = (slider_reference(ioi, nt, et, rule) for rule in RULES)
        assert view_index(ioi, a) != view_index(ioi, b), (nt, et)


def hand_built_graph():
    """A random signed DAG (ag_helpers) made so that every part of both rules' last step acts:
    three features and an error node without an outgoing edge, three features without an incoming
    one; influence computed
    (prune.py steps 1-2), stored unpruned."""
    import scipy.sparse as sp

    from attrgraph.graph.prune import compute_influence, normalize_matrix
    from tests.attrgraph.ag_helpers import random_graph

    g = random_graph(5, n_feat=30)
    A = g.adjacency.toarray()
    feats = np.flatnonzero(g.nodes.kind == "feature")
    A[:, feats[20:23]] = 0.0  # rows are targets: these send nothing
    A[:, np.flatnonzero(g.nodes.kind == "error")[0]] = 0.0
    A[feats[3:6], :] = 0.0  # and these receive nothing
    g = g.subgraph(np.ones(g.n_nodes, bool), adjacency=sp.csr_array(A))
    g.nodes.influence = compute_influence(normalize_matrix(g.adjacency), g.logit_weights())
    return g


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("nt, et", [(1.0, 1.0), (1.0, 0.8), (0.9, 0.7)])
def test_the_sliders_drop_nodes_left_without_links_as_each_rule_says(browser, tmp_path, nt, et, rule):
    """circuit-tracer's rule drops features and errors without an outgoing edge and features without
    an incoming one; the appendix's only features that had outgoing edges and lost them (prune.py
    step 5). A hand-built unpruned graph: the sliders rank by its stored influence."""
    from attrgraph.graph.store import save_graph

    g = hand_built_graph()
    ref = prune_graph(g, nt, et, influence=g.nodes.influence, rule=rule)
    path = tmp_path / "hand.h5"
    save_graph(g, path, "hand")
    with served(path) as server:
        assert get_json(server, "/api/graph?name=hand")["prune_rule"] == "circuit-tracer"  # unpruned
        open_page(browser, server, "graph:hand", None)
        pick_rule(browser, rule)
        set_slider(browser, "node-threshold", nt)
        set_slider(browser, "edge-threshold", et)
        ids = drawn_ids(browser)
        kinds = g.nodes.kind[ids]
        for kind in ("embedding", "error", "feature", "logit"):
            assert (kinds == kind).sum() == (ref.nodes.kind == kind).sum(), kind
        assert sorted(g.nodes.feature[ids][kinds == "feature"]) == sorted(
            ref.nodes.feature[ref.nodes.kind == "feature"]
        )
        assert len(browser.find_elements(By.CSS_SELECTOR, "path.edge")) == ref.n_edges
        scores = compute_graph_scores(ref)
        summary = browser.find_element(By.ID, "summary").text
        assert f"replacement {scores.replacement:.3f}" in summary, summary
        assert f"completeness {scores.completeness:.3f}" in summary, summary
    assert severe(browser) == []


def test_the_hand_built_graph_tells_every_part_of_the_last_step_apart():
    """Each threshold pair above draws a different graph under each rule, and the appendix's keeps a
    feature that never had an outgoing edge (what `had_out` is for)."""
    g = hand_built_graph()
    for nt, et in [(1.0, 1.0), (1.0, 0.8), (0.9, 0.7)]:
        ct, app = (prune_graph(g, nt, et, influence=g.nodes.influence, rule=r) for r in RULES)
        assert (ct.n_nodes, ct.n_edges) != (app.n_nodes, app.n_edges), (nt, et)
    app = prune_graph(g, 1.0, 0.8, influence=g.nodes.influence, rule="appendix")
    silent = set(g.nodes.feature[np.flatnonzero(g.nodes.kind == "feature")[20:23]].tolist())
    assert silent <= set(app.nodes.feature.tolist())


def test_the_rule_selector_starts_with_the_recorded_rule_and_lives_in_the_hash(browser, ioi, ioi_file):
    from attrgraph.graph.store import save_graph

    other = ioi.subgraph(np.ones(ioi.n_nodes, bool))
    other.meta["prune_rule"] = "appendix"  # as if pruned by the appendix's rule
    save_graph(other, ioi_file, "ioi_app")
    want = {rule: slider_reference(ioi, 0.6, 1.0, rule).n_nodes for rule in RULES}
    with served(ioi_file) as server:
        open_page(browser, server, "graph:ioi_app&nt=0.6")
        assert browser.find_element(By.ID, "prune-rule").get_attribute("value") == "appendix"
        assert len(drawn_ids(browser)) == want["appendix"]
        open_page(browser, server, "graph:ioi&nt=0.6&rule=appendix")
        assert browser.find_element(By.ID, "prune-rule").get_attribute("value") == "appendix"
        assert len(drawn_ids(browser)) == want["appendix"]
        js(browser, "location.hash = 'graph:ioi&nt=0.6'")  # no rule: the recorded one
        WebDriverWait(browser, 10).until(
            lambda b: b.find_element(By.ID, "prune-rule").get_attribute("value") == "circuit-tracer"
        )
        assert len(drawn_ids(browser)) == want["circuit-tracer"]
        pick_rule(browser, "appendix")
        assert "rule=appendix" in browser.current_url and len(drawn_ids(browser)) == want["appendix"]
        pick_rule(browser, "circuit-tracer")
        assert "rule=" not in browser.current_url
    assert severe(browser) == []


def test_wheel_zooms_about_the_cursor_drag_pans_and_text_keeps_a_minimum_size(browser, ioi, ioi_file):
    with served(ioi_file) as server:
        open_page(browser, server, "graph:ioi", ioi.n_nodes)
        cam0 = js(browser, "return Object.assign({}, window.attrgraphViewer.cam)")
        canvas = browser.find_element(By.ID, "canvas")
        js(
            browser,
            "const svg = document.getElementById('graph'), b = svg.getBoundingClientRect();"
            "svg.dispatchEvent(new WheelEvent('wheel', {deltaY: -300, clientX: b.left + 200, clientY: b.top + 150,"
            " bubbles: true, cancelable: true}));",
        )
        cam1 = js(browser, "return Object.assign({}, window.attrgraphViewer.cam)")
        assert cam1["k"] == pytest.approx(cam0["k"] * np.exp(0.45))
        # the graph point under the cursor stays under it (to the pixel: event coordinates are whole)
        px0 = 1 / cam0["k"]
        assert cam0["x"] + 200 / cam0["k"] == pytest.approx(cam1["x"] + 200 / cam1["k"], abs=px0)
        assert cam0["y"] + 150 / cam0["k"] == pytest.approx(cam1["y"] + 150 / cam1["k"], abs=px0)
        ActionChains(browser).move_to_element_with_offset(canvas, -300, 200).click_and_hold().move_by_offset(
            40, 0
        ).move_by_offset(40, -30).release().perform()
        cam2 = js(browser, "return Object.assign({}, window.attrgraphViewer.cam)")
        assert cam2["k"] == cam1["k"]
        pixel = 1 / cam1["k"]  # the pointer lands on whole pixels
        assert cam2["x"] == pytest.approx(cam1["x"] - 80 / cam1["k"], abs=pixel)
        assert cam2["y"] == pytest.approx(cam1["y"] + 30 / cam1["k"], abs=pixel)
        for _ in range(30):
            browser.find_element(By.ID, "zoom-out").click()
        px = js(
            browser,
            "const t = document.querySelector('#graph text.nlabel');"
            "return [parseFloat(getComputedStyle(t).fontSize) * window.attrgraphViewer.cam.k,"
            " window.attrgraphViewer.cam.k];",
        )
        assert px[1] < 0.1 and px[0] >= 10 - 1e-3
        box = js(browser, "return document.getElementById('graph').viewBox.baseVal.width")
        assert box == pytest.approx(canvas.size["width"] / px[1], rel=1e-3)


def test_search_and_features_ranked_by_influence(browser, ioi, ioi_file):
    with served(ioi_file) as server:
        data = get_json(server, "/api/graph?name=ioi")
        open_page(browser, server, "graph:ioi", ioi.n_nodes)
        needle = "mary"
        want = [
            n["id"]
            for n in data["nodes"]
            if any(needle in str(n.get(k, "")).lower() for k in ("label", "name", "token"))
        ]
        search = browser.find_element(By.ID, "search")
        search.send_keys("Mary")
        assert browser.find_element(By.ID, "search-count").text == f"{len(want)} matches"
        assert sorted(
            int(e.get_attribute("data-id")) for e in browser.find_elements(By.CSS_SELECTOR, "g.node.match")
        ) == sorted(want)
        search.send_keys(Keys.ENTER)
        assert browser.find_element(By.CSS_SELECTOR, "g.node.selected").get_attribute("data-id") == str(
            js(browser, "return window.attrgraphViewer.matches[0]")
        )
        feats = np.flatnonzero(ioi.nodes.kind == "feature")
        # by each node's influence in the unpruned graph (the sliders' ranking), ties by index
        order = feats[np.lexsort((feats, -ioi.nodes.unpruned_influence[feats]))][:40]
        ranked = [
            int(li.get_attribute("data-id")) for li in browser.find_elements(By.CSS_SELECTOR, "#ranked li")
        ]
        assert ranked == order.tolist()


def test_edge_weight_on_hover_and_edge_lists_with_layer_and_position(browser, ioi, ioi_file):
    with served(ioi_file) as server:
        data = get_json(server, "/api/graph?name=ioi")
        open_page(browser, server, "graph:ioi", ioi.n_nodes)
        s, t, w = max(data["edges"], key=lambda e: abs(e[2]))
        js(
            browser,
            "document.querySelector(`path.edge[data-src='${arguments[0]}'][data-tgt='${arguments[1]}']`)"
            ".dispatchEvent(new MouseEvent('mouseover', {bubbles: true, clientX: 300, clientY: 300}));",
            s,
            t,
        )
        tip = browser.find_element(By.ID, "edge-tip")
        assert tip.is_displayed()
        assert tip.text == f"{data['nodes'][s]['label']} → {data['nodes'][t]['label']}: {w:.4f}"
        feat = next(
            i for i in range(ioi.n_nodes) if ioi.nodes.kind[i] == "feature" and ioi.adjacency[[i]].nnz
        )
        browser.find_element(By.CSS_SELECTOR, f'g.node[data-id="{feat}"]').click()
        rows = browser.find_elements(By.CSS_SELECTOR, "#details .edges-list li .where")
        assert rows
        A = ioi.adjacency.tocsr()
        src = int(A.indices[np.argmax(np.abs(A.data[A.indptr[feat] : A.indptr[feat + 1]])) + A.indptr[feat]])
        n = data["nodes"][src]
        layer = {"embedding": "emb", "error": f"L{n['layer']}", "feature": f"L{n['layer']}"}[n["kind"]]
        assert rows[0].text == f"{layer} @{n['position']} {json.dumps(ioi.prompt_tokens[n['position']])}"


def test_a_supernode_collapses_into_one_node_with_summed_edges(browser, ioi, ioi_file):
    feats = np.flatnonzero(ioi.nodes.kind == "feature")
    members = feats[np.argsort(-ioi.nodes.influence[feats])][:3]
    save_supernodes(ioi_file, [supernode(ioi, "top three", members)], "ioi")
    A = ioi.adjacency.toarray()
    inside = np.zeros(ioi.n_nodes, bool)
    inside[members] = True
    out_sum = A[~inside][:, inside].sum(axis=1)  # from the group to each outside target
    in_sum = A[inside][:, ~inside].sum(axis=0)
    outside = np.flatnonzero(~inside)
    want = {(int(t),): w for t, w in zip(outside, out_sum) if np.any(A[t, inside] != 0)}
    want_in = {(int(s),): w for s, w in zip(outside, in_sum) if np.any(A[inside, s] != 0)}
    with served(ioi_file) as server:
        open_page(browser, server, "graph:ioi", ioi.n_nodes)
        browser.find_element(By.ID, "collapse").click()
        assert len(browser.find_elements(By.CSS_SELECTOR, "g.node")) == ioi.n_nodes - 3 + 1
        assert len(browser.find_elements(By.CSS_SELECTOR, "g.node.supernode")) == 1
        edges = js(browser, "return window.attrgraphViewer.edges.map(e => [e.src, e.tgt, e.w])")
        got = {(t,): w for s, t, w in edges if s == "s0"}
        got_in = {(s,): w for s, t, w in edges if t == "s0"}
        assert got.keys() == want.keys() and got_in.keys() == want_in.keys()
        for k in want:
            assert got[k] == pytest.approx(want[k], rel=1e-4, abs=1e-6)
        for k in want_in:
            assert got_in[k] == pytest.approx(want_in[k], rel=1e-4, abs=1e-6)
        n_other = sum(1 for s, t, _ in edges if "s0" not in (s, t))
        assert n_other == int(((A != 0) & ~inside[:, None] & ~inside[None, :]).sum())


def test_pinned_nodes_get_their_own_pane_and_the_pin_button_is_right_after_grouping(browser, ioi, ioi_file):
    feats = np.flatnonzero(ioi.nodes.kind == "feature")
    chosen = feats[np.argsort(-ioi.nodes.influence[feats])][:4]
    A = ioi.adjacency.toarray()
    n_between = int((A[np.ix_(chosen, chosen)] != 0).sum())
    with served(ioi_file) as server:
        open_page(browser, server, "graph:ioi", ioi.n_nodes)
        assert not browser.find_element(By.ID, "pinned-pane").is_displayed()
        for i in chosen[1:]:
            click_node(browser, int(i), shift=True)  # some lie outside the window
        click_node(browser, int(chosen[0]))
        browser.find_element(By.ID, "pin-toggle").click()
        assert browser.find_element(By.ID, "pin-toggle").text == "unpin"
        assert browser.find_element(By.ID, "pinned-pane").is_displayed()
        pane = browser.find_element(By.ID, "pinned-graph")
        assert sorted(
            int(g.get_attribute("data-id")) for g in pane.find_elements(By.CSS_SELECTOR, "g.pnode")
        ) == sorted(chosen.tolist())
        assert len(pane.find_elements(By.CSS_SELECTOR, "path.pedge")) == n_between
        browser.find_element(By.ID, "group-name").send_keys("four")
        browser.find_element(By.ID, "group").click()
        assert browser.find_element(By.ID, "pin-toggle").text == "pin"  # no stale "unpin"
        assert not browser.find_element(By.ID, "pinned-pane").is_displayed()


def test_a_label_edited_in_the_page_is_saved_in_the_dashboards_file(browser, ioi, ioi_file, tmp_path):
    from transcoders.dashboard_file import read_user_labels
    from transcoders.paths import BUNDLED

    bundled = BUNDLED["default-plt"] / "dashboards.h5"
    bundled_sha = sha(bundled)
    boards = tmp_path / "dashboards.h5"
    shutil.copyfile(bundled, boards)
    graph_sha = sha(ioi_file)
    i = int(np.flatnonzero(ioi.nodes.kind == "feature")[0])
    layer, feat = int(ioi.nodes.layer[i]), int(ioi.nodes.feature[i])
    with served(ioi_file, dashboards=boards) as server:
        open_page(browser, server, "graph:ioi", ioi.n_nodes)
        browser.find_element(By.CSS_SELECTOR, f'g.node[data-id="{i}"]').click()
        edit = browser.find_element(By.ID, "label-edit")
        edit.clear()
        edit.send_keys("says <b>Mary</b> & co")
        browser.find_element(By.ID, "label-save").click()
        # the panel is drawn again when the save ends: a status element found just before may be gone
        WebDriverWait(browser, 20, ignored_exceptions=(StaleElementReferenceException,)).until(
            lambda b: (
                b.find_elements(By.ID, "label-status")
                and "saved" in b.find_element(By.ID, "label-status").text
            )
        )
        label = browser.find_element(By.CSS_SELECTOR, f'#graph text.nlabel[data-id="{i}"]')
        assert cut_from(label.text, "says <b>Mary</b> & co"), label.text
        assert browser.find_element(By.CSS_SELECTOR, "h3.node-label").text == "says <b>Mary</b> & co"
        assert browser.find_element(By.CSS_SELECTOR, "g.node.selected").get_attribute("data-id") == str(i)
    assert read_user_labels(boards) == {(layer, feat): "says <b>Mary</b> & co"}
    assert sha(ioi_file) == graph_sha and sha(bundled) == bundled_sha
    assert severe(browser) == []


def test_the_view_lives_in_the_url_hash(browser, ioi, ioi_file):
    feats = np.flatnonzero(ioi.nodes.kind == "feature")
    top = feats[np.argsort(-ioi.nodes.unpruned_influence[feats])]  # the sliders' ranking
    sel, pins = int(top[0]), [int(top[1]), int(top[2])]
    ref = slider_reference(ioi, 0.7, 1.0, ioi.meta["prune_rule"])
    assert set(view_index(ioi, ref)) >= {sel, *pins}  # kept at the node threshold used here
    with served(ioi_file) as server:
        open_page(browser, server, f"graph:ioi&sel={sel}&pins={pins[0]}.{pins[1]}&nt=0.7&err=0")
        n_err = int((ref.nodes.kind == "error").sum())
        assert len(drawn_ids(browser)) == ref.n_nodes - n_err
        assert browser.find_element(By.ID, "pin-count").text == "2"
        assert browser.find_element(By.ID, "node-threshold").get_attribute("value") == "0.7"
        assert not browser.find_element(By.ID, "show-errors").is_selected()
        assert browser.find_element(By.CSS_SELECTOR, "g.node.selected").get_attribute("data-id") == str(sel)
        # changes are written back; a hash change is applied
        browser.find_element(By.ID, "show-errors").click()
        assert "err=0" not in browser.current_url and "nt=0.7" in browser.current_url
        js(browser, f"location.hash = 'graph:ioi&sel={pins[0]}&et=0.9'")
        WebDriverWait(browser, 10).until(
            lambda b: b.find_element(By.ID, "edge-threshold").get_attribute("value") == "0.9"
        )
        assert browser.find_element(By.CSS_SELECTOR, "g.node.selected").get_attribute("data-id") == str(
            pins[0]
        )
        assert browser.find_element(By.ID, "pin-count").text == "0"
        assert browser.find_element(By.ID, "node-threshold").get_attribute("value") == "1"
    assert severe(browser) == []

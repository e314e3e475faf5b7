"""The viewer's model panels (viewer/model_hub.py, global_request.py, heads_request.py) on the
pruned IOI graph of the bundled model and default-plt: /api/global equals GlobalWeights and
transcoders' coactivation computed here, /api/heads sums to the graph's own edge and equals
head_loadings, concurrent requests on the one shared model give what one at a time gives, bad
parameters are JSON 400s, and in chromium a clicked feature and a clicked edge fill their panels."""

import json
import threading

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from attrgraph.graph.store import save_graph
from tests.attrgraph.ag_helpers import random_graph
from tests.attrgraph.viewer.viewer_helpers import click_node, get_json, request, served

pytestmark = pytest.mark.bundled("default", "default-plt")


@pytest.fixture(scope="module")
def bundled():
    """The bundled model and default-plt, loaded here (not through the server's hub)."""
    from attrgraph.bundled.loading import load_model
    from transcoders.formats import load_transcoders

    return load_model("default").eval(), load_transcoders("default-plt").eval()


def strongest_edges(graph, n: int, kind: str | None = None) -> list[tuple[int, int]]:
    """(source, target) of the `n` strongest edges (by |weight|), into `kind` nodes when given."""
    A = sp.coo_array(graph.adjacency)
    keep = A.data != 0
    if kind is not None:
        keep &= graph.nodes.kind[A.row] == kind
    rows, cols, vals = A.row[keep], A.col[keep], A.data[keep]
    order = np.argsort(-np.abs(vals), kind="stable")[:n]
    return [(int(cols[j]), int(rows[j])) for j in order]


def corpus(model, n_seqs: int) -> torch.Tensor:
    """The corpus default-plt's dashboards were read on (their attributes say which), first `n_seqs`."""
    from transcoders.dashboard_file import load_dashboards
    from transcoders.paths import BUNDLED
    from transcoders.train import sequence_source

    attrs = load_dashboards(BUNDLED["default-plt"] / "dashboards.h5").attrs
    seed = json.loads(attrs["config"])["seed"]
    it = sequence_source(model, attrs["corpus"], seed)()
    return torch.tensor([next(it) for _ in range(n_seqs)])


def test_global_connections_are_the_features_global_weights(ioi, ioi_file, bundled):
    from attrgraph.analysis.global_weights import GlobalWeights, mean_norm_scales
    from attrgraph.viewer.model_hub import corpus_seqs
    from transcoders.coactivation import compute_coactivation, flat_index

    model, tc = bundled
    seqs = corpus(model, corpus_seqs(model.cfg.n_ctx))
    gw = GlobalWeights(model, tc, mean_norm_scales(model, seqs.split(8)))
    n = ioi.nodes
    feats = np.flatnonzero(n.kind == "feature")
    picks = [int(feats[np.argmax(n.layer[feats])]), int(feats[np.argmin(n.layer[feats])])]
    with served(ioi_file) as server:
        for node in picks:
            layer, f = int(n.layer[node]), int(n.feature[node])
            got = get_json(server, f"/api/global?graph=ioi&node={node}&k=7")
            assert got["feature"] == dict(site="mlp", layer=layer, feature=f, name=f"L{layer}/F{f}")
            assert (
                got["coactivation"]["available"] and got["coactivation"]["n_positions"] == seqs[:, 1:].numel()
            )
            me = flat_index([tc], 0, layer, f)
            for direction in ("input", "output"):
                want = getattr(gw, f"{direction}_weights")("mlp", layer, f).top(7)
                rows = got[direction]
                assert [(r["layer"], r["feature"]) for r in rows] == list(
                    zip(want.layer.tolist(), want.feature.tolist())
                )
                np.testing.assert_allclose([r["weight"] for r in rows], want.weight, rtol=1e-9)
                others = [flat_index([tc], 0, r["layer"], r["feature"]) for r in rows]
                pairs = [(o, me) if direction == "input" else (me, o) for o in others]
                if pairs:
                    co = compute_coactivation(model, [tc], seqs, np.array(pairs))
                    assert [r["n_both"] for r in rows] == co.n_both.tolist()
                    assert [r["coactive"] for r in rows] == (co.n_both > 0).tolist()
            v = gw.vocab_weights("mlp", layer, f)
            v = v - v.mean()
            top = v.topk(10).indices.tolist()
            assert [t["id"] for t in got["logits_top"]] == top
            assert [t["token"] for t in got["logits_top"]] == [model.tokenizer.decode([i]) for i in top]
            np.testing.assert_allclose([t["weight"] for t in got["logits_top"]], v[top].numpy(), rtol=1e-9)
            assert [t["id"] for t in got["logits_bottom"]] == (-v).topk(10).indices.tolist()
        assert get_json(server, f"/api/global?graph=ioi&node={picks[1]}&k=7") == got  # the kept answer
        top_layer = get_json(server, f"/api/global?graph=ioi&node={picks[0]}")  # default k
        assert len(top_layer["input"]) == 10 and top_layer["output"] == []  # the last layer writes no feature
        assert server.viewer.hub.loads == 1  # the model and set, loaded once for every request


@pytest.fixture
def plt_without_dashboards(tmp_path):
    """default-plt's weights in a folder of their own, with no dashboards file (so no corpus)."""
    import shutil

    from transcoders.paths import BUNDLED

    folder = tmp_path / "plt-bare"
    folder.mkdir()
    for name in ("config.json", "weights.safetensors", "manifest.json"):
        shutil.copy(BUNDLED["default-plt"] / name, folder / name)
    return folder


def test_without_coactivation_statistics_the_panel_says_so(ioi, ioi_file, bundled, plt_without_dashboards):
    from attrgraph.analysis.global_weights import GlobalWeights

    model, tc = bundled
    n = ioi.nodes
    feats = np.flatnonzero(n.kind == "feature")
    node = int(feats[np.argmax(n.layer[feats])])
    with served(ioi_file, transcoders=str(plt_without_dashboards)) as server:
        got = get_json(server, f"/api/global?graph=ioi&node={node}")
    co = got["coactivation"]
    assert (
        not co["available"]
        and "no coactivation statistics" in co["note"]
        and "no dashboards file" in co["note"]
    )
    assert got["input"] and all(r["coactive"] is None and r["n_both"] is None for r in got["input"])
    assert got["scales"].startswith("raw")
    want = GlobalWeights(model, tc).input_weights("mlp", int(n.layer[node]), int(n.feature[node])).top(10)
    np.testing.assert_allclose([r["weight"] for r in got["input"]], want.weight, rtol=1e-9)


def test_head_loadings_sum_to_the_graphs_edge_and_equal_the_library(ioi, ioi_file, bundled):
    from attrgraph.analysis.head_loadings import head_loadings

    model, tc = bundled
    edges = strongest_edges(ioi, 4) + strongest_edges(ioi, 2, "logit")
    want = head_loadings(model, tc, ioi, [(t, s) for s, t in edges])
    n = ioi.nodes
    with served(ioi_file) as server:
        for i, (s, t) in enumerate(edges):
            got = get_json(server, f"/api/heads?graph=ioi&source={s}&target={t}")
            adjacency = float(ioi.adjacency[t, s])
            assert (got["source"], got["target"], got["adjacency"]) == (s, t, adjacency)
            assert got["n_layers"] == model.cfg.n_layers and got["n_heads"] == model.cfg.n_heads
            assert abs(got["edge"] - adjacency) <= 1e-6 * abs(adjacency)
            for layer in got["layers"]:
                total = sum(layer["heads"]) + layer["bypass"]
                assert abs(total - adjacency) <= 1e-6 * abs(adjacency), (s, t, layer)
            heads = np.array([layer["heads"] for layer in got["layers"]])
            np.testing.assert_allclose(heads, want.heads[i], rtol=1e-9, atol=1e-12)
            if n.kind[s] == "feature":  # an MLP feature writes after its own layer's attention
                assert np.all(heads[: int(n.layer[s]) + 1] == 0.0)
            order = np.argsort(-np.abs(heads), axis=None, kind="stable")[:8]
            assert [(h["layer"], h["head"]) for h in got["top_heads"]] == [
                (int(o // heads.shape[1]), int(o % heads.shape[1])) for o in order
            ]


def test_threads_at_once_give_what_one_at_a_time_gives(ioi, ioi_file, bundled):
    """`frozen_forward` swaps `block.mlp` on the shared model: concurrent sweeps hold `model_lock`
    (without it, 29 of 30 results of 6 threads at once differed), and so does the corpus pass."""
    from attrgraph.analysis.head_loadings import head_loadings

    model, tc = bundled
    edges = strongest_edges(ioi, 6)
    alone = [head_loadings(model, tc, ioi, [(t, s)]) for s, t in edges]

    def at_once(call, n):
        barrier, out = threading.Barrier(n), [None] * n

        def run(i):
            barrier.wait()
            out[i] = call(i)

        threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(120)
        return out

    together = at_once(lambda i: head_loadings(model, tc, ioi, [(edges[i][1], edges[i][0])]), 2)
    for a, b in zip(alone, together):
        np.testing.assert_array_equal(a.heads, b.heads)
        np.testing.assert_array_equal(a.edge, b.edge)
    feats = np.flatnonzero(ioi.nodes.kind == "feature")
    urls = [f"/api/heads?graph=ioi&source={s}&target={t}" for s, t in edges] + [
        f"/api/global?graph=ioi&node={int(f)}" for f in feats[[0, len(feats) // 2, -1]]
    ]
    with served(ioi_file) as one:
        sequential = [get_json(one, url) for url in urls]
    with served(ioi_file) as server:  # a fresh server: every request loads or computes at once
        replies = at_once(lambda i: request(server, "GET", urls[i]), len(urls))
        assert server.viewer.hub.loads == 1
    for (status, body), want in zip(replies, sequential):
        assert status == 200, body
        assert json.loads(body) == want
    for (_, body), a in zip(replies, alone):
        heads = [layer["heads"] for layer in json.loads(body)["layers"]]
        np.testing.assert_allclose(heads, a.heads[0], rtol=1e-12, atol=0)


def test_bad_parameters_are_json_400s(ioi, ioi_file, tmp_path):
    n = ioi.nodes
    feature = int(np.flatnonzero(n.kind == "feature")[0])
    logit = int(np.flatnonzero(n.kind == "logit")[0])
    emb = int(np.flatnonzero(n.kind == "embedding")[0])
    s, t = strongest_edges(ioi, 1)[0]
    A = ioi.adjacency
    none = next(
        (i, j)
        for i in range(ioi.n_nodes)
        for j in range(ioi.n_nodes)
        if A[j, i] == 0 and n.kind[j] == "feature"
    )
    bad = {
        "/api/global": "one graph=",
        "/api/global?graph=ioi": "one node=",
        "/api/global?graph=ioi&node=abc": "not an integer",
        "/api/global?graph=ioi&node=-1": "not an integer",
        "/api/global?graph=ioi&node=%EF%BC%91": "not an integer",  # a full-width digit
        f"/api/global?graph=ioi&node={ioi.n_nodes}": "not a node",
        f"/api/global?graph=ioi&node={logit}": "logit node",
        f"/api/global?graph=ioi&node={feature}&node={feature}": "one node=",
        f"/api/global?graph=ioi&node={feature}&k=0": "k='0'",
        f"/api/global?graph=ioi&node={feature}&k=51": "k='51'",
        "/api/heads?graph=ioi": "one source=",
        f"/api/heads?graph=ioi&source={s}": "one target=",
        f"/api/heads?graph=ioi&source={s}&target=x{t}": "not an integer",
        f"/api/heads?graph=ioi&source={s}&target={ioi.n_nodes + 5}": "not a node",
        f"/api/heads?graph=ioi&source={s}&target={emb}": "embedding node",
        f"/api/heads?graph=ioi&source={none[0]}&target={none[1]}": "no edge",
    }
    with served(ioi_file) as server:
        for url, words in bad.items():
            status, body = request(server, "GET", url)
            assert status == 400, (url, body)
            assert words in json.loads(body)["error"], (url, body)
        for url in ("/api/global?graph=nope&node=0", "/api/heads?graph=nope&source=0&target=1"):
            status, body = request(server, "GET", url)
            assert status == 404 and "no graph named 'nope'" in json.loads(body)["error"]
        assert server.viewer.hub.loads == 0  # nothing was loaded for a refused request
    path = tmp_path / "hand.h5"  # a hand-built graph: it records no model or sets
    hand = random_graph(0)
    save_graph(hand, path, "g")
    hs, ht = strongest_edges(hand, 1, "feature")[0]
    with served(path) as server:
        for url in (f"/api/global?graph=g&node={ht}", f"/api/heads?graph=g&source={hs}&target={ht}"):
            status, body = request(server, "GET", url)
            error = json.loads(body)["error"]
            assert status == 400 and "records no" in error and "serve it with --" in error, (url, error)
    with served(ioi_file, transcoders="default-clt") as server:  # not the set the graph was built with
        status, body = request(server, "GET", f"/api/heads?graph=ioi&source={s}&target={t}")
        assert status == 400 and "other MLP transcoders" in json.loads(body)["error"]


def test_serve_takes_the_model_options():
    import argparse

    from attrgraph.cli import serve

    parser = argparse.ArgumentParser()
    serve.add_parser(parser.add_subparsers())
    args = parser.parse_args(
        ["serve", "f.h5", "--model", "m", "--transcoders", "t", "--attn-transcoders", "a"]
    )
    assert (args.model, args.transcoders, args.attn_transcoders) == ("m", "t", "a")
    args = parser.parse_args(["serve", "f.h5"])
    assert (args.model, args.transcoders, args.attn_transcoders) == (None, None, None)


@pytest.mark.parametrize(
    "options, says",
    [
        (["--transcoders", "nosuch"], "no transcoders at nosuch"),
        (["--model", "nosuch-model"], "is not 'default', a model folder"),
        (["--attn-transcoders", "default-plt"], "must be an SAE set"),
    ],
)
def test_serve_refuses_model_options_it_cannot_load_before_serving(
    ioi_file, options, says, monkeypatch, capsys
):
    """One line and exit 2 before listening: in this process, a server that started fails the test
    instead of serving (the subprocess test below runs the same refusal as a real command)."""
    from attrgraph.cli import main
    from attrgraph.viewer.server import ViewerServer

    def started(self, *a, **k):
        raise AssertionError("the server started")

    monkeypatch.setattr(ViewerServer, "server_bind", started)
    rc = main(["serve", str(ioi_file), "--port", "0", *options])
    out, err = capsys.readouterr()
    err = err.strip()
    assert rc == 2 and out == "", (rc, out, err)
    assert err.startswith("attrgraph serve: error: cannot load " + " ".join(options)), err
    assert says in err and "\n" not in err, err


def test_serve_refuses_a_model_option_as_a_command(ioi_file):
    """The same refusal from `python -m attrgraph.cli`: one line on stderr, exit 2, nothing served
    (a server that started would outlive the timeout)."""
    import subprocess
    import sys

    cmd = [
        sys.executable,
        "-m",
        "attrgraph.cli",
        "serve",
        str(ioi_file),
        "--port",
        "0",
        "--transcoders",
        "nosuch",
    ]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    err = res.stderr.strip()
    assert res.returncode == 2 and res.stdout == "", (res.returncode, res.stdout, err)
    assert err.startswith("attrgraph serve: error: cannot load --transcoders nosuch"), err
    assert "no transcoders at nosuch" in err and "\n" not in err, err


def open_global_panel(browser, server, graph, node: int):
    """Load the page of graph "ioi", click feature `node` and wait for its Global connections."""
    browser.get(server.url + "#graph:ioi")
    WebDriverWait(browser, 20).until(
        lambda b: len(b.find_elements(By.CSS_SELECTOR, "g.node")) == graph.n_nodes
    )
    click_node(browser, node)  # the feature may lie outside the window
    return WebDriverWait(browser, 120).until(
        lambda b: b.find_element(By.CSS_SELECTOR, "#details #global-panel.loaded")
    )


def severe(browser) -> list:
    return [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]


def test_a_clicked_feature_and_a_clicked_edge_fill_their_panels(
    browser, ioi, ioi_file, plt_without_dashboards
):
    n = ioi.nodes
    feats = np.flatnonzero(n.kind == "feature")
    node = int(feats[np.argmax(n.layer[feats])])
    s, t = strongest_edges(ioi, 1)[0]
    browser.get_log("browser")
    with served(ioi_file) as server:
        browser.get("about:blank")
        panel = open_global_panel(browser, server, ioi, node)
        want = get_json(server, f"/api/global?graph=ioi&node={node}")
        names = lambda cls: [  # noqa: E731
            li.get_attribute("data-name") for li in panel.find_elements(By.CSS_SELECTOR, f".{cls} li.gw-row")
        ]
        assert names("gw-input") == [r["name"] for r in want["input"]]
        assert names("gw-output") == [r["name"] for r in want["output"]]
        unused = [
            li.get_attribute("data-name") for li in panel.find_elements(By.CSS_SELECTOR, "li.gw-row.unused")
        ]
        assert unused and unused == [
            r["name"] for d in ("output", "input") for r in want[d] if r["coactive"] is False
        ]
        assert (
            json.dumps(want["logits_top"][0]["token"])
            in panel.find_element(By.CSS_SELECTOR, ".gw-logits-top").text
        )
        assert "Dashboard" in browser.find_element(By.ID, "details").text  # still beside its dashboard
        edge = browser.find_element(By.CSS_SELECTOR, f'path.edge[data-src="{s}"][data-tgt="{t}"]')
        browser.execute_script("arguments[0].dispatchEvent(new MouseEvent('click', {bubbles: true}))", edge)
        heads = WebDriverWait(browser, 120).until(
            lambda b: b.find_element(By.CSS_SELECTOR, "#details #heads-panel.loaded")
        )
        got = get_json(server, f"/api/heads?graph=ioi&source={s}&target={t}")
        rows = heads.find_elements(By.CSS_SELECTOR, "table.heads-table tr[data-layer]")
        assert len(rows) == got["n_layers"]
        assert len(rows[0].find_elements(By.CSS_SELECTOR, "td")) == got["n_heads"] + 1
        top = got["top_heads"][0]
        assert f"L{top['layer']}.H{top['head']}" in heads.find_element(By.CSS_SELECTOR, "li.head-row").text
        assert "selected" in edge.get_attribute("class")
        click_node(browser, node)  # back to the feature
        WebDriverWait(browser, 20).until(
            lambda b: b.find_element(By.CSS_SELECTOR, "#details #global-panel.loaded")
        )
    with served(ioi_file, transcoders=str(plt_without_dashboards)) as server:  # no corpus: said, not marked
        panel = open_global_panel(browser, server, ioi, node)
        assert "no coactivation statistics" in panel.text
        assert panel.find_elements(By.CSS_SELECTOR, "li.gw-row") and not panel.find_elements(
            By.CSS_SELECTOR, ".unused"
        )
    assert severe(browser) == []

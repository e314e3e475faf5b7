"""Adaptive graphs: the exactness contract for every explored target, the budget, the exploration
order, and the full budget reproducing the full graph."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

import attrgraph.engine.linear_backward as lb
from attrgraph.bundled.loading import load_model
from attrgraph.engine.adaptive import attribute_adaptive
from attrgraph.engine.attribute import attribute
from attrgraph.engine.batch_plan import device_budget
from attrgraph.engine.replacement import ReplacementModel
from attrgraph.graph.scores import compute_graph_scores
from tests.attrgraph.ag_helpers import tiny_attn_saes, tiny_model, tiny_transcoders
from tests.attrgraph.peer_frontend import peer_case
from transcoders.formats import load_transcoders

TOKENS = torch.tensor([0, 5, 9, 3, 17, 22, 5, 9, 31, 2, 7, 7])


@pytest.fixture(params=["host", "device", "device, then host"])
def rows_at(request, monkeypatch):
    """Where the linear engine keeps the rows: the CPU's plan (on the host), a GPU's budget (on the
    device, where adaptive.py ranks and folds them), or a GPU's budget for the logits' rows and the
    first step's only, the later steps' not fitting there (every row set then goes to the host). Pass
    its `trace` to `attribute_adaptive`: the steps done so far say which budget a step gets."""
    trace, cpu = [], lb.budget_for

    def budget(device, need, live):
        if request.param == "device" or (request.param != "host" and not trace):
            return device_budget(8 << 30, need, live)
        return cpu(device, need, live)

    monkeypatch.setattr(lb, "budget_for", budget)
    return SimpleNamespace(trace=trace, on_device=request.param == "device")


@pytest.fixture(scope="module", params=["plt", "clt"])
def setup(request):
    model = tiny_model("gpt2", n_layers=3)
    rm = ReplacementModel(model, tiny_transcoders(model, request.param, request.param == "plt"))
    full = attribute(model, rm, TOKENS, exclude_bos=True)
    return model, rm, full


@pytest.fixture(scope="module")
def on_the_host(setup):
    """The partial graph of `test_partial_graph_is_exact_for_explored_targets` with the CPU's plan:
    ranked by graph/streamed_influence.py, which test_explores_circuit_tracers_features_with_its_rows
    checks against circuit-tracer's choice."""
    model, rm, full = setup
    return attribute_adaptive(
        model, rm, TOKENS, max_feature_nodes=full.n_features // 4, k=8, exclude_bos=True
    )


def node_keys(g, mask):
    n = g.nodes
    return list(zip(n.layer[mask], n.position[mask], n.feature[mask]))


def test_partial_graph_is_exact_for_explored_targets(setup, on_the_host, rows_at):
    model, rm, full = setup
    budget = full.n_features // 4
    trace = rows_at.trace
    g = attribute_adaptive(model, rm, TOKENS, max_feature_nodes=budget, k=8, exclude_bos=True, trace=trace)
    assert g.n_features == budget == g.meta["n_explored"] and len(trace) == -(-budget // 8) > 1
    assert g.meta["rows_on_device"] == rows_at.on_device
    # ranked on the device as on the host: the same features explored
    explored = node_keys(g, g.nodes.kind == "feature")
    assert explored == node_keys(on_the_host, on_the_host.nodes.kind == "feature")
    assert g.n_nodes == len(TOKENS) + 3 * (len(TOKENS) - 1) + budget + len(g.logit_tokens)
    # explored targets: their rows sum to what the full graph's rows sum to (pre-activation - bias)
    full_index = {key: i for i, key in enumerate(node_keys(full, np.ones(full.n_nodes, bool)))}
    A, F = g.dense().astype(np.float64), full.dense().astype(np.float64)
    f = g.nodes.kind == "feature"
    rows_g = np.flatnonzero(f | (g.nodes.kind == "logit"))
    rows_f = [full_index[k] for k in node_keys(g, f)] + list(np.flatnonzero(full.nodes.kind == "logit"))
    np.testing.assert_allclose(A[rows_g].sum(1), F[rows_f].sum(1), rtol=1e-5, atol=1e-6 * np.abs(F).max())
    # edges from explored features and embeddings are the full graph's edges
    cols_g = np.flatnonzero(f | (g.nodes.kind == "embedding"))
    cols_f = [full_index[k] for k in node_keys(g, g.nodes.kind == "embedding")] + [
        full_index[k] for k in node_keys(g, f)
    ]
    cols_f = sorted(cols_f)
    np.testing.assert_allclose(
        A[np.ix_(rows_g, cols_g)], F[np.ix_(rows_f, cols_f)], rtol=1e-5, atol=1e-6 * np.abs(F).max()
    )


def test_first_explored_features_are_the_most_influential_on_the_logits(setup):
    model, rm, full = setup
    k = 5
    g = attribute_adaptive(model, rm, TOKENS, max_feature_nodes=k, k=k, exclude_bos=True)
    # one step: ranked by influence in the graph made of the logit rows only (direct effects)
    F = np.abs(full.dense().astype(np.float64))
    lg = full.nodes.kind == "logit"
    direct = (F[lg] / F[lg].sum(1, keepdims=True) * full.logit_probs[:, None]).sum(0)
    f = np.flatnonzero(full.nodes.kind == "feature")
    top = f[np.argsort(-direct[f], kind="stable")[:k]]
    assert set(node_keys(g, g.nodes.kind == "feature")) == set(
        node_keys(full, np.isin(np.arange(full.n_nodes), top))
    )


def test_full_budget_gives_the_full_graph(setup, rows_at):
    model, rm, full = setup
    g = attribute_adaptive(
        model, rm, TOKENS, max_feature_nodes=10**6, k=64, exclude_bos=True, trace=rows_at.trace
    )
    assert len(rows_at.trace) > 1 and g.meta["rows_on_device"] == rows_at.on_device
    # features never reached (influence 0) stay unexplored; with them folded the scores agree
    reached = full.nodes.influence[full.nodes.kind == "feature"] > 0
    assert g.n_features == reached.sum()
    s_full, s_g = compute_graph_scores(full), compute_graph_scores(g)
    np.testing.assert_allclose(list(s_g), list(s_full), rtol=1e-4)
    np.testing.assert_allclose(
        np.sort(g.nodes.influence[g.nodes.kind == "feature"]),
        np.sort(full.nodes.influence[full.nodes.kind == "feature"][reached]),
        rtol=1e-4,
    )


def test_replacement_score_grows_with_budget(setup):
    model, rm, full = setup
    scores = [
        compute_graph_scores(
            attribute_adaptive(model, rm, TOKENS, max_feature_nodes=b, k=16, exclude_bos=True)
        ).replacement
        for b in (0, 16, 64, 10**6)
    ]
    # budget 0: only the embeddings' direct paths count as explained
    assert scores == sorted(scores) and scores[0] < scores[-1]
    assert scores[-1] == pytest.approx(compute_graph_scores(full).replacement, rel=1e-4)


@pytest.mark.parametrize(
    "options,message",
    [(dict(max_feature_nodes=-1), "max_feature_nodes is -1; pass 0 or more"), (dict(k=0), "k is 0; pass")],
)
def test_a_budget_or_step_that_explores_nothing_is_refused(setup, options, message):
    model, rm, _ = setup
    with pytest.raises(ValueError, match=message):
        attribute_adaptive(model, rm, TOKENS, **{"max_feature_nodes": 8, **options})


def test_attribute_dispatches_adaptive_and_stores_scores(setup, tmp_path):
    import h5py

    from attrgraph.graph.store import save_graph
    from attrgraph.graph.summary import format_summary, summarize

    model, rm, full = setup
    g = attribute(model, rm, TOKENS, method="adaptive", max_feature_nodes=10, exclude_bos=True)
    assert g.meta["method"] == "adaptive" and g.n_features == 10
    # the rows engine and its products, as attribute's meta gives them (the autograd one counts none)
    assert g.meta["backend"] == "linear" and g.meta["backward_gflop"] > 0
    by_autograd = attribute(model, rm, TOKENS, method="adaptive", max_feature_nodes=10, backend="autograd")
    assert by_autograd.meta["backend"] == "autograd" and by_autograd.meta["backward_gflop"] == 0
    s = compute_graph_scores(full)
    assert full.meta["unpruned_replacement_score"] == pytest.approx(s.replacement, rel=1e-9)
    assert full.meta["unpruned_completeness_score"] == pytest.approx(s.completeness, rel=1e-9)
    save_graph(g, tmp_path / "a.h5")
    with h5py.File(tmp_path / "a.h5") as f:
        assert f["graphs/graph"].attrs["replacement_score"] == pytest.approx(
            compute_graph_scores(g).replacement
        )
    text = format_summary(summarize(g))
    assert "scores: replacement" in text and "adaptive: 10 of" in text


def test_adaptive_with_attention_features(rows_at):
    """Explored targets of both sites keep their full-graph rows; an unexplored feature's edges
    land on the error node of its own (layer, position, site); the full budget gives the full scores."""
    model = tiny_model("gemma2", n_layers=3)
    rm = ReplacementModel(model, [tiny_transcoders(model, "plt", True), tiny_attn_saes(model)])
    full = attribute(model, rm, TOKENS, exclude_bos=True)
    budget, trace = full.n_features // 3, rows_at.trace
    g = attribute_adaptive(model, rm, TOKENS, max_feature_nodes=budget, k=8, exclude_bos=True, trace=trace)
    assert len(trace) > 1 and g.meta["rows_on_device"] == rows_at.on_device
    n, fn = g.nodes, full.nodes

    def keys(nodes):
        return list(zip(nodes.kind, nodes.layer, nodes.position, nodes.feature, nodes.site, nodes.token))

    index = {k: i for i, k in enumerate(keys(fn))}
    where = np.array([index[k] for k in keys(n)])
    A, F = g.dense().astype(np.float64), full.dense().astype(np.float64)
    rows = np.flatnonzero((n.kind == "feature") | (n.kind == "logit"))
    assert len(set(n.site[n.kind == "feature"])) == 2  # explored features of both sites
    explored = np.zeros(full.n_nodes, bool)
    explored[where] = True
    # what the full rows give each kept column once unexplored features are folded into their errors
    folded = F[where[rows]][:, explored]
    for j in np.flatnonzero(fn.kind == "feature"):
        if explored[j]:
            continue
        err = index[("error", fn.layer[j], fn.position[j], -1, fn.site[j], -1)]
        folded[:, np.searchsorted(np.flatnonzero(explored), err)] += F[where[rows], j]
    np.testing.assert_allclose(A[rows], folded, rtol=1e-5, atol=1e-6 * np.abs(F).max())
    trace.clear()
    everything = attribute_adaptive(
        model, rm, TOKENS, max_feature_nodes=10**6, k=64, exclude_bos=True, trace=trace
    )
    np.testing.assert_allclose(
        list(compute_graph_scores(everything)), list(compute_graph_scores(full)), rtol=1e-4
    )


@pytest.mark.parametrize(
    "case,budget,batch_size",
    [
        # circuit-tracer's default schedule (batch_size 512: it ranks again after 2,048 features), ours
        # by default; with a step of 256 ours explores 5 other features of the 3,000
        pytest.param("--arch llama --n-layers 6 --prompt-len 40 --l0 16", 3000, None, marks=pytest.mark.slow),
        # a short schedule (batch_size 16: 64 features a step, 4 steps) and a cross-layer transcoder
        pytest.param(
            "--arch gemma2 --transcoder clt --n-layers 3 --prompt-len 16 --l0 8",
            200,
            16,
            marks=pytest.mark.slow,
        ),
    ],
)
def test_explores_circuit_tracers_features_with_its_rows(tmp_path, case, budget, batch_size):
    """circuit-tracer's `attribute(max_feature_nodes=...)` on the same weights (the peer harness) is the
    oracle: the same explored features, and their rows and the logits' rows equal on every column but
    the errors' (circuit-tracer drops an unexplored feature's edges; ours adds them to its error)."""
    args = f"{case} --n-heads 4 --d-model 64 --d-transcoder 256 --d-vocab 128 --max-feature-nodes {budget}"
    peer_case(tmp_path, args + (f" --batch-size {batch_size}" if batch_size else ""))
    model, tc = load_model(tmp_path), load_transcoders(tmp_path / "transcoders")
    tokens = np.load(tmp_path / "input_tokens.npy")
    k = {} if batch_size is None else dict(k=4 * batch_size)  # its update_interval is 4
    g = attribute_adaptive(
        model, tc, tokens, max_feature_nodes=budget, exclude_bos=True, embedding="token", **k
    )
    active = np.load(tmp_path / "active_features.npy")
    selected = active[np.load(tmp_path / "selected_features.npy")]
    assert len(selected) == budget < len(active)
    n = g.nodes
    f = n.kind == "feature"
    assert sorted(node_keys(g, f)) == sorted(map(tuple, selected.tolist()))
    # circuit-tracer's node order: its features in index order, errors (layer, position), tokens, logits
    n_pos, L = len(tokens), g.meta["n_layers"]
    ct_logits = np.load(tmp_path / "logit_token_ids.npy").tolist()
    index = {key: i for i, key in enumerate(map(tuple, selected.tolist()))}
    ours_logits = np.asarray(g.logit_tokens)
    ct_of = {
        "feature": lambda i: index[(n.layer[i], n.position[i], n.feature[i])],
        "embedding": lambda i: budget + L * n_pos + n.position[i],
        "logit": lambda i: (
            budget + (L + 1) * n_pos + ct_logits.index(ours_logits[i - (g.n_nodes - len(ours_logits))])
        ),
    }
    rows = np.flatnonzero(f | (n.kind == "logit"))
    cols = np.flatnonzero(n.kind != "error")
    ct_rows, ct_cols = ([ct_of[n.kind[i]](i) for i in x] for x in (rows, cols))
    theirs = np.load(tmp_path / "adjacency.npy")[np.ix_(ct_rows, ct_cols)]
    ours = g.adjacency[rows][:, cols].toarray()
    assert np.abs(theirs).max() > 0 and (np.abs(ours) > 0).sum() > 10 * len(rows)
    np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-5 * np.abs(theirs).max())


@pytest.mark.parametrize("kind", ["plt", "clt"])
def test_exploring_on_the_device_waits_for_it_per_step_not_per_batch(kind, monkeypatch):
    """With a GPU's budget, steps 2-3 read from the device a fixed number of times per step (the
    ranking's influence), whether a step's rows come in one batch per layer or one batch per row."""
    from attrgraph.engine import adaptive
    from tests.host_reads import count_host_reads

    model = tiny_model("llama", torch.float32, n_layers=3)
    rm = ReplacementModel(model, tiny_transcoders(model, kind, True))
    monkeypatch.setattr(lb, "budget_for", lambda device, need, live: device_budget(8 << 30, need, live))
    original, waits, batches = adaptive._Explorer.explore, {}, {}

    def counted(self, *args):
        found = []
        waits[self.options["batch_size"]] = count_host_reads(lambda: found.append(original(self, *args))).n
        batches[self.options["batch_size"]] = self.stats["batches"]
        return found[0]

    monkeypatch.setattr(adaptive._Explorer, "explore", counted)
    steps = []
    for batch_size in (1, None):
        trace = []
        g = attribute_adaptive(
            model, rm, TOKENS, max_feature_nodes=24, k=8, batch_size=batch_size, trace=trace
        )
        assert g.meta["rows_on_device"] and len(trace) == 3
        steps.append(len(trace))
    assert batches[1] >= 24 + 1 > 2 * batches[None]  # a batch per row: the logits, then 24 features
    # per step: the ranking's two reads (influence and error shares, copied out), and the host's
    # own tensors made into injections (three per layer), which the counter cannot tell apart on the
    # CPU: 44 in all, and none per batch or per feature explored (8 a step)
    assert waits[1] == waits[None] <= 15 * steps[0]

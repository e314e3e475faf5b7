"""Pruning the rows held on the device (device_prune.py), on the CPU with a GPU's budget: the
cutoff is prune.find_threshold's, the pruned graph is `prune_graph`'s on random graphs and on
tiny models, and the full graph is never copied to the host."""

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attrgraph.engine.device_prune as dp
import attrgraph.engine.linear_backward as lb
from attrgraph.engine.attribute import attribute
from attrgraph.engine.batch_plan import device_budget
from attrgraph.engine.device_rows import DeviceRows
from attrgraph.engine.pruned_build import attribute_pruned
from attrgraph.graph.prune import (
    RULES,
    _prune_edges,
    compute_influence,
    find_threshold,
    normalize_matrix,
    prune_graph,
    select_nodes,
)
from attrgraph.graph.streamed_influence import row_blocks
from tests.attrgraph.ag_helpers import ARCHS, random_graph, tiny_attn_saes, tiny_model, tiny_transcoders
from tests.attrgraph.engine.test_pruned_build import assert_same_pruned_graph
from tests.host_reads import count_host_reads

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TOKENS = torch.tensor([0, 5, 9, 3, 17, 22, 5, 9, 11, 2, 30, 7])
THRESHOLDS = ((0.7, 0.9), (0.5, 0.8), (0.9, 0.99), (1.0, 1.0))


@given(
    kind=st.sampled_from(["uniform", "ties", "wide", "sparse"]),
    n=st.integers(0, 300),
    chunks=st.integers(1, 5),
    limit=st.sampled_from([0, 3, 1 << 22]),
    threshold=st.one_of(st.sampled_from([0.0, 0.8, 0.98, 1.0]), st.integers(0, 1000).map(lambda k: k / 1000)),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=150, deadline=None)
def test_the_cutoff_is_find_thresholds(kind, n, chunks, limit, threshold, seed):
    """Scores of every kind (ties, zeros, 40 orders of magnitude) in chunks with non-scores among
    them, the select ending in any pass (`SORT_LIMIT` 0 runs all four): the same cutoff, exactly."""
    rng = np.random.default_rng(seed)
    x = {
        "uniform": lambda: rng.random(n),
        "ties": lambda: rng.integers(0, 5, n).astype(np.float64),
        "wide": lambda: np.exp(rng.normal(0, 20, n)),
        "sparse": lambda: rng.random(n) * (rng.random(n) < 0.3),
    }[kind]()
    parts = [np.concatenate([c, -rng.random(2)]) for c in np.array_split(x, chunks)]
    with pytest.MonkeyPatch.context() as m:
        m.setattr(dp, "SORT_LIMIT", limit)
        got = dp.edge_cutoff(lambda: [torch.from_numpy(p) for p in parts], threshold)
    assert got == find_threshold(x, threshold)


def _as_device_rows(adjacency: np.ndarray, first_node: int, n_cols: int, batch: int, rng) -> DeviceRows:
    """The rows `first_node..` of a dense strictly lower-triangular matrix as DeviceRows: batches of
    at most `batch` rows within one of its blocks, each with the columns before its block (a random
    share of them dropped where the rows have no entry), in a shuffled batch order."""
    blocks, batches, flat, at = row_blocks(adjacency), [], [], 0
    for b0, b1 in blocks:
        for r0 in range(max(b0, first_node), b1, batch):
            rows = np.arange(r0, min(r0 + batch, b1))
            used = np.abs(adjacency[rows][:, : min(b0, n_cols)]).sum(0) > 0
            columns = np.flatnonzero(used | (rng.random(len(used)) < 0.5))
            batches.append((rows - first_node, columns, adjacency[np.ix_(rows, columns)].astype(np.float32)))
    for i in rng.permutation(len(batches)):
        rows, columns, block = batches[i]
        flat.append((rows, columns, at, torch.from_numpy(block.reshape(-1))))
        at += block.size
    buffer = torch.cat([f[3] for f in flat]) if flat else torch.zeros(0)
    return DeviceRows(len(adjacency) - first_node, n_cols, buffer, [f[:3] for f in flat]), blocks


@given(
    seed=st.integers(0, 2**16),
    n_feat=st.integers(1, 30),
    density=st.integers(1, 9).map(lambda k: k / 10),
    batch=st.integers(1, 7),
    rule=st.sampled_from(RULES),
    node_threshold=st.sampled_from([0.5, 0.8, 1.0]),
    edge_threshold=st.sampled_from([0.6, 0.9, 0.98, 1.0]),
)
@settings(max_examples=80, deadline=None)
def test_random_graphs_prune_on_the_device_as_on_the_host(
    seed, n_feat, density, batch, rule, node_threshold, edge_threshold
):
    """A random signed DAG in node order as blocks of rows: the kept nodes, the kept edges (their
    values exactly) and the influence on the node-pruned graph are graph/prune.py's `_prune_edges`."""
    g = random_graph(seed, n_feat=n_feat, density=density)
    A = g.adjacency.toarray().astype(np.float32).astype(np.float64)
    kind, w = g.nodes.kind, g.logit_weights()
    first_node = int(np.isin(kind, ("embedding", "error")).sum())
    n_cols = int((kind != "logit").sum())
    influence = compute_influence(normalize_matrix(A), w)
    keep = select_nodes(kind, influence, node_threshold, rule)
    idx = np.flatnonzero(keep)
    rows, blocks = _as_device_rows(A, first_node, n_cols, batch, np.random.default_rng(seed))
    got = dp.prune_device_edges(rows, kind, w, keep, blocks, first_node, edge_threshold, rule)
    want_keep, want_adj, want_influence = _prune_edges(
        kind[idx], w[idx], sp.csr_array(A[idx][:, idx]), edge_threshold, False, rule
    )
    expected = np.zeros_like(keep)
    expected[idx[want_keep]] = True
    np.testing.assert_array_equal(got.keep, expected)
    np.testing.assert_array_equal(got.adjacency.toarray(), want_adj.toarray())
    np.testing.assert_allclose(got.influence, want_influence, rtol=1e-12, atol=1e-15)


def test_a_feature_whose_targets_were_all_pruned_keeps_by_the_appendixs_rule():
    """Hand-built: e -> f1 -> f2, f3 -> logit, and e -> logit, every edge 1. Influence: e 1, f1 2/3,
    f2 and f3 1/3 each; at a node threshold of 0.7 the cumulative shares are 3/7, 5/7, ... so e and
    f1 stay and f2, f3 go. In the node-pruned graph f1 never had an output, so the appendix's rule
    keeps it; circuit-tracer's drops it (a feature needs an output)."""
    kinds = np.array(["embedding", "feature", "feature", "feature", "logit"])
    A = np.zeros((5, 5))
    A[1, 0] = A[2, 1] = A[3, 1] = A[4, 0] = A[4, 2] = A[4, 3] = 1.0
    w = np.array([0, 0, 0, 0, 1.0])
    influence = compute_influence(normalize_matrix(A), w)
    np.testing.assert_allclose(influence[:4], [1, 2 / 3, 1 / 3, 1 / 3])
    for rule, kept in (("appendix", [1, 1, 0, 0, 1]), ("circuit-tracer", [1, 0, 0, 0, 1])):
        keep = select_nodes(kinds, influence, 0.7, rule)
        np.testing.assert_array_equal(keep, [1, 1, 0, 0, 1])
        rows, blocks = _as_device_rows(A, 1, 4, 2, np.random.default_rng(0))
        got = dp.prune_device_edges(rows, kinds, w, keep, blocks, 1, 1.0, rule)
        np.testing.assert_array_equal(got.keep, kept)
        # an edge threshold of 1 keeps every edge among the kept nodes: e -> logit, and e -> f1
        np.testing.assert_array_equal(got.adjacency.toarray(), A[np.ix_(got.keep, got.keep)])


def _gpu(monkeypatch) -> None:
    monkeypatch.setattr(lb, "budget_for", lambda *a: device_budget(8 << 30, 1 << 20, 6))


def _pruned_on_the_device(monkeypatch) -> list:
    """Records each `prune_device_edges` call's result and refuses `DeviceRows.to_csr` (the full
    graph's copy to the host)."""
    calls = []
    original = dp.prune_device_edges

    def spy(*args, **kwargs):
        calls.append(original(*args, **kwargs))
        return calls[-1]

    def refuse(self):
        raise AssertionError("the full graph was copied to the host")

    monkeypatch.setattr("attrgraph.engine.pruned_build.prune_device_edges", spy)
    monkeypatch.setattr(DeviceRows, "to_csr", refuse)
    return calls


def assert_same_graph(want, got):
    for f in ("kind", "layer", "position", "feature", "token", "site"):
        np.testing.assert_array_equal(getattr(got.nodes, f), getattr(want.nodes, f))
    np.testing.assert_array_equal(got.adjacency.toarray(), want.adjacency.toarray())
    for f in ("influence", "unpruned_influence", "unpruned_share"):
        np.testing.assert_allclose(getattr(got.nodes, f), getattr(want.nodes, f), rtol=1e-9, atol=1e-15)
    for k in ("pruned", "node_threshold", "edge_threshold", "prune_rule", "backend", "precision"):
        assert got.meta[k] == want.meta[k]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kind", ["plt", "clt"])
def test_attribute_pruned_on_the_device_is_prune_graph_of_attribute(arch, kind, monkeypatch):
    """With a GPU's budget `attribute_pruned` prunes the rows where they are and copies the pruned
    graph only: the graph of `prune_graph(attribute(...))`, whose rows are the same numbers, for
    both rules and thresholds down to 0.5 and up to 1."""
    model = tiny_model(arch, torch.float32)
    tc = tiny_transcoders(model, kind, True)
    _gpu(monkeypatch)
    full = attribute(model, tc, TOKENS)
    calls = _pruned_on_the_device(monkeypatch)
    for rule in RULES:
        for thresholds in THRESHOLDS:
            got = attribute_pruned(model, tc, TOKENS, *thresholds, rule=rule)
            assert_same_graph(prune_graph(full, *thresholds, rule=rule), got)
            assert got.meta["unpruned_n_edges"] == full.n_edges
            for k in ("unpruned_replacement_score", "unpruned_completeness_score"):
                assert got.meta[k] == pytest.approx(full.meta[k], rel=1e-9)
    assert len(calls) == len(RULES) * len(THRESHOLDS)
    assert 0 < calls[0].adjacency.nnz < full.n_edges


def test_attention_features_prune_on_the_device(monkeypatch):
    model = tiny_model("llama", torch.float32)
    sets = [tiny_transcoders(model), tiny_attn_saes(model)]
    _gpu(monkeypatch)
    full = attribute(model, sets, TOKENS)
    calls = _pruned_on_the_device(monkeypatch)
    want = prune_graph(full, 0.7, 0.9)
    assert want.nodes.mask("feature", "attn").any()
    assert_same_graph(want, attribute_pruned(model, sets, TOKENS, 0.7, 0.9))
    assert len(calls) == 1


def test_on_the_cpu_the_rows_are_streamed_not_held(monkeypatch):
    """The CPU's plan never keeps rows on the device: `attribute_pruned` streams them (step 2)."""
    model = tiny_model("gpt2", torch.float32)
    tc = tiny_transcoders(model)
    calls = _pruned_on_the_device(monkeypatch)
    got = attribute_pruned(model, tc, TOKENS, 0.7, 0.9)
    assert_same_pruned_graph(prune_graph(attribute(model, tc, TOKENS), 0.7, 0.9), got)
    assert calls == []


@pytest.mark.parametrize("rule", RULES)
def test_pruning_on_the_device_reads_from_it_per_pass_not_per_batch(rule, monkeypatch):
    """On a GPU each read waits for the device (tests/host_reads.py): the influence, each pass of the
    cutoff's select (`SORT_LIMIT` 0: all four, then the last bin's scores), each round of the rule's
    removals and the kept edges' counts read a fixed number of times, none per batch. One graph, its
    rows in batches of one target and in the plan's: the same reads, the same pruned graph (to the
    rows' rounding)."""
    model = tiny_model("llama", torch.float32)
    tc = tiny_transcoders(model, "clt", True)
    _gpu(monkeypatch)
    _pruned_on_the_device(monkeypatch)  # the full graph's copy refused; its spy is replaced below
    monkeypatch.setattr(dp, "SORT_LIMIT", 0)
    reads, graphs = {}, {}
    original = dp.prune_device_edges

    def counted(rows, *args, **kwargs):
        found = []
        seen = count_host_reads(
            lambda: found.append(original(rows, *args, **kwargs)), under="/attrgraph/"
        ).seen
        reads[len(rows.batches)] = sorted(seen)
        return found[0]

    monkeypatch.setattr("attrgraph.engine.pruned_build.prune_device_edges", counted)
    for batch_size in (1, None):
        graphs[batch_size] = attribute_pruned(model, tc, TOKENS, 0.8, 0.9, rule=rule, batch_size=batch_size)
    # keyed by batches: two entries, so both builds pruned through `counted`
    (many, one_each), (few, by_plan) = sorted(reads.items(), reverse=True)
    assert many >= 10 * few
    assert one_each == by_plan and 0 < len(one_each) < many / 10, one_each
    a, b = graphs[1], graphs[None]  # batched otherwise, the rows round otherwise: the same graph to 1e-6
    for f in ("kind", "layer", "position", "feature"):
        np.testing.assert_array_equal(getattr(a.nodes, f), getattr(b.nodes, f))
    dense = a.adjacency.toarray()
    np.testing.assert_allclose(dense, b.adjacency.toarray(), rtol=0, atol=1e-6 * np.abs(dense).max())
    assert a.n_edges == b.n_edges > 0

"""Rows kept on the device (linear_backward.py step 8, device_rows.py), exercised on the CPU with a
GPU's budget: the rows equal the autograd engine's, influence equals the dense formula
`((I - A)^-1 - I)^T w` on the normalized matrix, the row loop never makes the host wait, and the
bf16 / tf32 precisions cost what they should."""

import math
from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attrgraph.engine.linear_backward as lb
from attrgraph.engine import host_copy
from attrgraph.engine.attribute import attribute
from attrgraph.engine.autograd_rows import backward_rows
from attrgraph.engine.batch_plan import device_budget
from attrgraph.engine.device_rows import DeviceRows, fold_rows, influence_of_sets
from attrgraph.engine.linear_backward import linear_rows
from attrgraph.engine.replacement import ReplacementModel
from attrgraph.engine.sources import build_sources, feature_injections
from attrgraph.errors import NonFiniteValueError, OptionError
from attrgraph.graph.streamed_influence import row_blocks
from tests.attrgraph.ag_helpers import (
    ARCHS,
    TRANSCODERS,
    random_graph,
    tiny_attn_saes,
    tiny_model,
    tiny_transcoders,
)
from tests.attrgraph.engine.test_linear_backward import TOKENS, injections_for
from tests.host_reads import count_host_reads

GPU = device_budget(8 << 30, 1 << 20, 6)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kind,skip", TRANSCODERS)
@pytest.mark.parametrize("attn", [False, True])
def test_resident_rows_equal_autograd_rows(arch, kind, skip, attn):
    model = tiny_model(arch)
    tc = tiny_transcoders(model, kind, skip)
    rm = ReplacementModel(model, [tc, tiny_attn_saes(model)] if attn else tc)
    state = rm.run(TOKENS)
    sources = build_sources(rm, state)
    inj = injections_for(rm, state)
    if attn:
        inj = feature_injections(rm, sources.features, sources.attn) + inj[-3:]
    ref = backward_rows(rm, state, sources, inj, batch_size=16).toarray()
    stats = {}
    kept = linear_rows(rm, state, sources, inj, budget=GPU, stats=stats, keep_on_device=True)
    assert isinstance(kept, DeviceRows) and stats["resident"] and stats["batches"] <= 2 * rm.cfg.n_layers + 2
    fast = kept.to_csr().toarray()
    np.testing.assert_allclose(fast, ref, rtol=0, atol=1e-9 * np.abs(ref).max())


def _dense_influence(adjacency: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The appendix's formula, densely: rows of |A| normalized to sum 1, then ((I - A)^-1 - I)^T w."""
    A = np.abs(adjacency)
    s = A.sum(1, keepdims=True)
    A = np.divide(A, s, out=np.zeros_like(A), where=s > 0)
    n = len(A)
    return (np.linalg.inv(np.eye(n) - A) - np.eye(n)).T @ w


@pytest.mark.parametrize("attn", [False, True])
def test_attribute_with_resident_rows_solves_influence_on_the_device(attn, monkeypatch):
    model = tiny_model("gpt2", torch.float32)  # rows, stored adjacency and device buffer all float32
    tc = tiny_transcoders(model, "clt", True)
    rm = ReplacementModel(model, [tc, tiny_attn_saes(model)] if attn else tc)
    host = attribute(model, rm, TOKENS)
    monkeypatch.setattr(lb, "budget_for", lambda *a: GPU)
    kept = attribute(model, rm, TOKENS)
    dense = kept.adjacency.toarray()
    np.testing.assert_allclose(dense, host.adjacency.toarray(), rtol=0, atol=1e-6 * np.abs(dense).max())
    expected = _dense_influence(dense, kept.logit_weights())
    # the dense formula in float64 on the stored float32 edges; the nodes table keeps float32 influence
    np.testing.assert_allclose(kept.nodes.influence, expected, rtol=1e-6, atol=1e-9)
    for score in ("unpruned_replacement_score", "unpruned_completeness_score"):
        assert kept.meta[score] == pytest.approx(host.meta[score], rel=1e-6)


@pytest.mark.parametrize("kind", ["plt", "clt"])
def test_the_row_loop_never_waits_for_the_device(kind, monkeypatch):
    """With a GPU's budget the row loop never reads from the device, however many batches (the rows
    are read when the graph is assembled, `DeviceRows.to_csr`); the CPU's plan copies every batch."""
    model = tiny_model("llama", torch.float32)
    rm = ReplacementModel(model, tiny_transcoders(model, kind, True))
    state = rm.run(TOKENS)
    sources = build_sources(rm, state)
    inj = injections_for(rm, state)
    waits, batches = {}, {}
    for batch_size in (1, 4, None):
        stats = {}

        def run(batch_size=batch_size, stats=stats):
            linear_rows(rm, state, sources, inj, batch_size, budget=GPU, stats=stats, keep_on_device=True)

        waits[batch_size] = count_host_reads(run).seen
        batches[batch_size] = stats["batches"]
    assert batches[1] == len(inj) > batches[4] > batches[None]
    assert waits[1] == waits[4] == waits[None] == []
    stats = {}
    on_cpu = count_host_reads(lambda: linear_rows(rm, state, sources, inj, batch_size=1, stats=stats)).n
    assert on_cpu >= stats["batches"] == len(inj)


def test_bf16_rows_cost_a_bounded_error_and_fp32_none(monkeypatch):
    """bfloat16 keeps 8 significant bits: its rows differ from fp32's by about 2^-8 of the largest
    edge (and never by more than a few per cent); "tf32" on the CPU computes fp32."""
    model = tiny_model("llama", torch.float32)
    rm = ReplacementModel(model, tiny_transcoders(model, "plt", True))
    state = rm.run(TOKENS)
    sources = build_sources(rm, state)
    inj = injections_for(rm, state)
    ref = backward_rows(rm, state, sources, inj, batch_size=16).toarray()
    scale = np.abs(ref).max()
    for budget in (None, GPU):
        fp32 = linear_rows(rm, state, sources, inj, budget=budget).toarray()
        tf32 = linear_rows(rm, state, sources, inj, budget=budget, precision="tf32").toarray()
        bf16 = linear_rows(rm, state, sources, inj, budget=budget, precision="bf16")
        assert bf16.dtype == np.float32
        assert np.abs(fp32 - ref).max() <= 1e-5 * scale and np.array_equal(tf32, fp32)
        err = np.abs(bf16.toarray() - fp32).max() / scale
        assert 2**-12 < err < 0.05


def test_precision_is_refused_where_it_does_not_apply():
    model = tiny_model("gpt2")
    rm = ReplacementModel(model, tiny_transcoders(model))
    with pytest.raises(OptionError, match="precision"):
        attribute(model, rm, TOKENS, precision="fp16")
    with pytest.raises(OptionError, match="linear engine"):
        attribute(model, rm, TOKENS, precision="bf16", backend="autograd")
    with pytest.raises(OptionError, match="standard"):
        attribute(model, rm, TOKENS, precision="bf16", method="adaptive", max_feature_nodes=4)


def _device_rows(
    blocks: list[tuple[np.ndarray, np.ndarray, np.ndarray]], n_rows: int, n_cols: int
) -> DeviceRows:
    """DeviceRows holding `(rows, columns, block)` batches, one after another in one buffer."""
    flat = [torch.from_numpy(block).reshape(-1) for _, _, block in blocks]
    starts = np.concatenate([[0], np.cumsum([len(x) for x in flat])])
    batches = [(rows, columns, int(at)) for (rows, columns, _), at in zip(blocks, starts)]
    return DeviceRows(n_rows, n_cols, torch.cat(flat) if flat else torch.zeros(0), batches)


@given(
    n_rows=st.integers(1, 24),
    n_cols=st.integers(1, 30),
    batch=st.integers(1, 6),
    shuffle=st.booleans(),
    stage=st.sampled_from([1, 5, host_copy.STAGE_ENTRIES]),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=60, deadline=None)
def test_rows_assembled_on_the_device_give_the_dense_matrix(n_rows, n_cols, batch, shuffle, stage, seed):
    """`to_csr` against a matrix written by hand: batches of rows in any order, each with its own
    ascending columns, zeros inside the blocks (merged positions) dropped, rows of no batch empty;
    copied to the host through staging buffers of `stage` entries (host_copy.py)."""
    rng = np.random.default_rng(seed)
    want = np.zeros((n_rows, n_cols), np.float32)
    order = rng.permutation(n_rows) if shuffle else np.arange(n_rows)
    order = order[: rng.integers(1, n_rows + 1)]
    blocks = []
    for i in range(0, len(order), batch):
        rows = order[i : i + batch]
        columns = np.sort(rng.choice(n_cols, size=rng.integers(1, n_cols + 1), replace=False))
        block = rng.standard_normal((len(rows), len(columns))).astype(np.float32)
        block[rng.random(block.shape) < 0.4] = 0
        want[np.ix_(rows, columns)] = block
        blocks.append((rows, columns, block))
    with mock.patch.object(host_copy, "STAGE_ENTRIES", stage):
        got = _device_rows(blocks, n_rows, n_cols).to_csr()
    np.testing.assert_array_equal(got.toarray(), want)
    assert got.nnz == np.count_nonzero(want) and got.has_sorted_indices
    assert got.indices.dtype == got.indptr.dtype == np.int32


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_rows_on_the_device_with_nan_or_inf_are_refused(bad):
    good = np.ones((2, 3), np.float32)
    worse = good.copy()
    worse[1, 2] = worse[0, 0] = bad
    rows = _device_rows([(np.arange(2), np.arange(3), good), (np.arange(2, 4), np.arange(3), worse)], 4, 3)
    with pytest.raises(
        NonFiniteValueError, match="gave 2 NaN or inf edge values in the rows of this graph"
    ) as e:
        rows.to_csr()
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("attn", [False, True])
def test_the_sources_are_read_from_the_device_a_fixed_number_of_times(attn, monkeypatch):
    """build_sources reads each feature group's layer and position in one read, not one per group:
    a prompt with twice the groups makes no more reads (on a GPU each read waits for the device)."""
    model = tiny_model("gpt2", torch.float32)
    tc = tiny_transcoders(model, "plt", True)
    rm = ReplacementModel(model, [tc, tiny_attn_saes(model)] if attn else tc)
    reads, groups = [], []
    for tokens in (TOKENS[:5], TOKENS):
        state = rm.run(tokens)
        found = []
        reads.append(count_host_reads(lambda s=state, f=found: f.append(build_sources(rm, s))).n)
        groups.append(len(found[0].groups) + len(found[0].attn_groups))
    # the active features (a nonzero per site), the groups' bounds (a nonzero), their firsts and bounds
    assert groups[1] >= 2 * groups[0] > 0 and reads[0] == reads[1] == 4 + attn


def _with_free_memory(monkeypatch, free: int) -> None:
    """The engine's device as one with `free` bytes free (batch_plan.device_budget on the CPU)."""
    monkeypatch.setattr(lb, "budget_for", lambda device, need, live: device_budget(free, need, live))


@pytest.mark.parametrize("attn", [False, True])
def test_rows_stay_on_the_device_when_their_blocks_fit(attn, monkeypatch):
    """The rows stay on the device when the blocks they take there fit in half of its free memory,
    not only when every row's every column would; with less free than that they go to the host batch
    by batch. Either way the rows are the autograd engine's."""
    model = tiny_model("llama", torch.float32)
    tc = tiny_transcoders(model, "plt", True)
    rm = ReplacementModel(model, [tc, tiny_attn_saes(model)] if attn else tc)
    tokens = torch.randint(1, 40, (24,), generator=torch.Generator().manual_seed(0))
    state = rm.run(tokens)
    sources = build_sources(rm, state)
    inj = feature_injections(rm, sources.features, sources.attn)
    ref = backward_rows(rm, state, sources, inj, batch_size=16).toarray()
    _with_free_memory(monkeypatch, 8 << 30)
    held = linear_rows(rm, state, sources, inj, keep_on_device=True).buffer.numel() * 4
    every_column = len(inj) * sources.n_columns * 4  # what the rule before counted
    assert every_column > 1.5 * held
    # 1.5x: half of it holds every row at its own position, not the plan's merged positions
    for free, resident in ((2 * held + 64, True), (3 * held // 2, False)):
        _with_free_memory(monkeypatch, free)
        stats = {}
        rows = linear_rows(rm, state, sources, inj, stats=stats)
        assert stats["resident"] is resident
        np.testing.assert_allclose(rows.toarray(), ref, rtol=0, atol=1e-6 * np.abs(ref).max())


@pytest.mark.parametrize("attn", [False, True])
def test_a_blocks_width_is_its_columns_count(attn):
    model = tiny_model("gpt2", torch.float32)
    tc = tiny_transcoders(model, "clt", False)
    rm = ReplacementModel(model, [tc, tiny_attn_saes(model)] if attn else tc)
    state = rm.run(TOKENS)
    sources = build_sources(rm, state)
    rows = lb._BatchRows(lb.LinearBackward(rm, state), sources, len(TOKENS))
    inj = feature_injections(rm, sources.features, sources.attn) + injections_for(rm, state)[-2:]
    for j in inj:
        for batch in ([j], [j, inj[-1]]):
            assert rows.width(batch) == len(rows.block_columns(*rows.reach(batch))[0])


@given(
    n_rows=st.integers(1, 12),
    n_cols=st.integers(1, 30),
    n_out=st.integers(1, 12),
    batch=st.integers(1, 5),
    n_sets=st.integers(1, 3),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=60, deadline=None)
def test_folded_rows_are_the_sums_of_their_columns_by_target(n_rows, n_cols, n_out, batch, n_sets, seed):
    """`fold_rows` against `np.add.at` on the dense matrix (float64): the rows of several sets, each
    sent to its row of the result, every column added into its target, in batches of any rows and
    columns; the folded batches have ascending columns, and the sets are freed as they are folded;
    nothing is read from the device (tests/host_reads.py)."""
    rng = np.random.default_rng(seed)
    target = rng.integers(0, n_out, n_cols)
    n_total = n_rows * n_sets + 2  # two rows of the result that no set fills
    rows_to = rng.permutation(n_total)[: n_rows * n_sets].reshape(n_sets, n_rows)
    want, sets = np.zeros((n_total, n_out)), []
    for s in range(n_sets):
        order, dense, blocks = rng.permutation(n_rows), np.zeros((n_rows, n_cols)), []
        for i in range(0, n_rows, batch):
            rows = order[i : i + batch]
            columns = np.sort(rng.choice(n_cols, size=rng.integers(0, n_cols + 1), replace=False))
            block = rng.standard_normal((len(rows), len(columns))).astype(np.float32)
            dense[np.ix_(rows, columns)] = block
            blocks.append((rows, columns, block))
        folded = np.zeros((n_rows, n_out))
        np.add.at(folded.T, target, dense.T)
        want[rows_to[s]] = folded
        sets.append((rows_to[s], _device_rows(blocks, n_rows, n_cols)))
    folded = []
    reads = count_host_reads(lambda: folded.append(fold_rows(sets, target, (n_total, n_out))))
    got = folded[0]
    assert reads.seen == []  # on a GPU the fold never waits for the device
    assert sets == [] and (got.n_rows, got.n_cols) == (n_total, n_out)
    assert all(np.all(np.diff(c) > 0) for _, c, _ in got.batches)
    np.testing.assert_allclose(got.to_csr().toarray(), want, rtol=1e-6, atol=1e-6)


@given(
    seed=st.integers(0, 2**16), n_feat=st.integers(1, 30), batch=st.integers(1, 6), n_sets=st.integers(1, 3)
)
@settings(max_examples=60, deadline=None)
def test_influence_of_row_sets_is_the_formula_with_rowless_nodes_as_leaves(seed, n_feat, batch, n_sets):
    """`influence_of_sets` on a random graph whose rows are split among sets, some features given no
    row (the adaptive graph's unexplored ones): the dense formula on the matrix with those rows zero."""
    rng = np.random.default_rng(seed)
    g = random_graph(seed, n_feat=n_feat)
    A = g.adjacency.toarray().astype(np.float32).astype(np.float64)
    kind, w = g.nodes.kind, g.logit_weights()
    blocks = row_blocks(g.adjacency)
    first = int(np.isin(kind, ("embedding", "error")).sum())
    has_row = np.arange(len(A)) >= first
    has_row[first:][rng.random(len(A) - first) < 0.3] = False  # features without a row
    has_row[kind == "logit"] = True
    A[~has_row] = 0
    owner = rng.integers(0, n_sets, len(A))
    sets = []
    for s in range(n_sets):
        nodes = np.flatnonzero(has_row & (owner == s))
        parts = []
        for b0, b1 in blocks:
            inside = nodes[(nodes >= b0) & (nodes < b1)]
            for r0 in range(0, len(inside), batch):
                r = inside[r0 : r0 + batch]
                columns = np.arange(b0)
                parts.append((np.searchsorted(nodes, r), columns, A[np.ix_(r, columns)].astype(np.float32)))
        sets.append((nodes, _device_rows(parts, len(nodes), len(A))))
    got = influence_of_sets(sets, w, blocks, kind == "error")
    np.testing.assert_allclose(got.influence, _dense_influence(A, w), rtol=1e-6, atol=1e-9)
    s = np.abs(A).sum(1)
    share = np.divide(np.abs(A[:, kind == "error"]).sum(1), s, out=np.zeros_like(s), where=s > 0)
    np.testing.assert_allclose(got.error_share, share, rtol=1e-6, atol=1e-9)

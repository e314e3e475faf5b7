"""The batch planner (batch_plan.py): cache-sized batches on the CPU, memory-sized bands on a GPU.

Expected batches are worked out by hand from the module's rules; the launch counts are measured
by counting every aten operation the engine dispatches (TorchDispatchMode), not taken from it."""

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from attrgraph.engine import batch_plan
from attrgraph.engine.batch_plan import BatchBudget, cpu_budget, device_budget, plan_batches
from attrgraph.engine.linear_backward import linear_rows
from attrgraph.engine.replacement import ReplacementModel
from attrgraph.engine.sources import build_sources, feature_injections
from tests.attrgraph.ag_helpers import tiny_model, tiny_transcoders


def _sorted(key):
    return sorted(range(len(key)), key=lambda i: key[i])


def _positions(batches, key):
    return [sorted({key[i][1] for i in b}) for b in batches]


def test_cpu_plan_splits_runs_at_the_cache_budget_and_merges_short_ones():
    # row_bytes 1 MiB: at position 1 a 4 MiB budget holds 2 rows, but never fewer than MIN_ROWS (16)
    key = [(0, 1)] * 40 + [(0, 2)] * 3 + [(0, 3)] * 4 + [(1, 3)] * 2
    batches = plan_batches(key, _sorted(key), 1 << 20, cpu_budget())
    # 40 rows at position 1: 3 even parts of at most 16; the two short runs of start 0 merge;
    # start 1 is its own batch
    assert [len(b) for b in batches] == [14, 13, 13, 7, 2]
    assert _positions(batches, key) == [[1], [1], [1], [2, 3], [3]]


def test_batch_size_caps_every_batch():
    key = [(0, 0)] * 10 + [(0, 1)] * 10
    for budget in (cpu_budget(), device_budget(1 << 30, 0, 4)):
        assert [len(b) for b in plan_batches(key, _sorted(key), 4, budget, batch_size=4)] == [
            4,
            3,
            3,
            4,
            3,
            3,
        ]


def test_device_budget_from_free_memory():
    GiB = 1 << 30
    b = device_budget(free_bytes=8 * GiB, resident_bytes=1 * GiB, live_tensors=7)
    assert b.resident and b.work_bytes == int(0.5 * 7 * GiB / 7)
    # rows above half the free memory go to the host batch by batch, and leave the memory to the work
    b = device_budget(free_bytes=8 * GiB, resident_bytes=5 * GiB, live_tensors=8)
    assert not b.resident and b.work_bytes == int(0.5 * 8 * GiB / 8)
    # a huge device: one working tensor never passes 512 MiB; a full one: never below the CPU's
    assert device_budget(1000 * GiB, 0, 1).work_bytes == GiB // 2
    assert device_budget(1 << 20, 0, 8).work_bytes == batch_plan.WORK_BYTES


def test_device_bands_by_hand():
    # one start, 64 rows at each position 0..7, slack 1.25, no minimum band:
    # [0] (adding 1 would cost 256 for 192 of own work), [1, 2] (384 <= 1.25 * 320),
    # [3, 4, 5] (1152 <= 1.25 * 960, adding 6 costs 1792 > 1760), [6, 7]
    key = [(0, p) for p in range(8) for _ in range(64)]
    budget = BatchBudget(1 << 40, 1, 1.25, resident=True, max_rows=1 << 30)
    batches = plan_batches(key, _sorted(key), 4, budget)
    assert _positions(batches, key) == [[0], [1, 2], [3, 4, 5], [6, 7]]


@pytest.mark.parametrize("seed", range(5))
def test_device_bands_keep_their_promises(seed):
    """Every row once, in key order; one start per batch; within budget; padded cost within the
    slack unless the band is below the minimum rows."""
    rng = np.random.default_rng(seed)
    key = [(int(s), int(p)) for s, p in zip(rng.integers(0, 4, 3000), rng.integers(0, 40, 3000))]
    order = _sorted(key)
    row_bytes = 1 << 12
    budget = BatchBudget(1 << 22, 64, 1.25, resident=True, max_rows=1 << 30)
    batches = plan_batches(key, order, row_bytes, budget)
    assert [i for b in batches for i in b] == order
    for b in batches:
        assert len({key[i][0] for i in b}) == 1
        P = max(key[i][1] for i in b) + 1
        own = sum(key[i][1] + 1 for i in b)
        assert len(b) * P * row_bytes <= budget.work_bytes or len(b) <= budget.min_rows
        assert len(b) * P <= 1.25 * own or len(b) < 2 * budget.min_rows


def test_llama_1b_shape_plans_a_tenth_of_the_batches_on_a_gpu():
    """The issue's Llama-3.2-1B-like case: 16 layers, d_model 2048, 32 tokens, 64 features per layer
    and position: the CPU plan makes over a thousand batches; a 60 GiB GPU's, under a tenth of them,
    about 10% more flops than the rows need (the slack, 1.1, but for each layer's first band, which
    must reach 256 rows); at a slack of 1.25, 81 batches cost 23% more."""
    key = [(l, p) for l in range(16) for p in range(1, 32) for _ in range(64)] + [(16, 31)] * 10
    order, row_bytes = _sorted(key), 2048 * 4
    cpu = plan_batches(key, order, row_bytes, cpu_budget())
    gpu = plan_batches(key, order, row_bytes, device_budget(60 << 30, 4 << 30, 6))
    assert len(cpu) > 1000 and len(gpu) * 10 < len(cpu)
    own = sum(key[i][1] + 1 for i in order)
    assert sum(len(b) * (max(key[i][1] for i in b) + 1) for b in gpu) <= 1.105 * own


class _CountOps(TorchDispatchMode):
    """Counts every aten operation dispatched: on a GPU, each is a kernel launch."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("kind", ["plt", "clt"])
def test_device_plan_launches_a_tenth_of_the_operations_per_row(kind):
    """At the same rows, the device plan (position bands, resident rows, one batched contraction
    per layer) dispatches under a tenth of the operations of the CPU plan scaled to this d_model
    (the CPU's 4 MiB at d_model 2048 is 128 KiB at d_model 64)."""
    model = tiny_model("llama", torch.float32, n_layers=4, d_model=64)
    rm = ReplacementModel(model, tiny_transcoders(model, kind, True, d_sae=128))
    tokens = torch.randint(0, 40, (30,), generator=torch.Generator().manual_seed(0))
    state = rm.run(tokens)
    sources = build_sources(rm, state)
    inj = feature_injections(rm, sources.features, sources.attn)
    cpu_like = BatchBudget(batch_plan.WORK_BYTES * 64 // 2048, 16, 1.0, resident=False, max_rows=256)
    counts, rows = {}, {}
    for name, budget in (("cpu", cpu_like), ("gpu", device_budget(8 << 30, 1 << 20, 6))):
        with _CountOps() as ops:
            rows[name] = linear_rows(rm, state, sources, inj, budget=budget).toarray()
        counts[name] = ops.n
    assert counts["gpu"] * 10 < counts["cpu"]
    np.testing.assert_allclose(rows["gpu"], rows["cpu"], rtol=0, atol=1e-6 * np.abs(rows["cpu"]).max())

"""Thread counts chosen for the work: one thread for small products unless waiting threads sleep
(then the linear engine runs as many batches at once as the caller has threads), the caller's
setting restored after."""

import numpy as np
import pytest
import torch

from attrgraph.engine.linear_backward import linear_rows
from attrgraph.engine.replacement import ReplacementModel
from attrgraph.engine.sources import build_sources
from attrgraph.engine.threads import PARALLEL_FLOPS, threads_for, torch_threads
from tests.attrgraph.ag_helpers import tiny_model, tiny_transcoders
from tests.attrgraph.engine.test_linear_backward import TOKENS, injections_for


@pytest.fixture
def two_threads():
    n = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(n)


def test_torch_threads_restores_the_callers_setting(two_threads):
    with torch_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    with pytest.raises(RuntimeError), torch_threads(1):
        raise RuntimeError("inside")
    assert torch.get_num_threads() == 2


def test_small_products_run_on_one_thread_unless_waits_sleep(two_threads, monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert threads_for(PARALLEL_FLOPS / 10) == 1
    assert threads_for(PARALLEL_FLOPS) == 2
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert threads_for(PARALLEL_FLOPS / 10) == 1
    monkeypatch.setenv("OMP_WAIT_POLICY", "passive")
    assert threads_for(PARALLEL_FLOPS / 10) == 2


def test_linear_rows_choose_one_thread_for_a_small_model(two_threads, monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    model = tiny_model("gpt2")
    rm = ReplacementModel(model, tiny_transcoders(model, "plt", True))
    state = rm.run(TOKENS)
    sources = build_sources(rm, state)
    inj = injections_for(rm, state)
    stats = {}
    one = linear_rows(rm, state, sources, inj, batch_size=7, stats=stats).toarray()
    # each batch on one thread, the caller's two threads running two batches at once
    assert stats["threads"] == 1 and stats["workers"] == 2 and stats["batches"] >= len(inj) // 7
    assert torch.get_num_threads() == 2
    # sleeping waits change nothing: batches side by side still wait on nothing
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    stats = {}
    passive = linear_rows(rm, state, sources, inj, batch_size=7, stats=stats).toarray()
    assert stats["threads"] == 1 and stats["workers"] == 2
    np.testing.assert_array_equal(passive, one)
    # products large enough to pay for parallel waits run on the caller's threads, one batch at a time
    monkeypatch.setattr("attrgraph.engine.linear_backward.PARALLEL_FLOPS", 0.0)
    stats = {}
    two = linear_rows(rm, state, sources, inj, batch_size=7, stats=stats).toarray()
    assert stats["threads"] == 2 and stats["workers"] == 1
    np.testing.assert_allclose(two, one, rtol=0, atol=1e-12 * np.abs(one).max())
    torch.set_num_threads(1)
    stats = {}
    alone = linear_rows(rm, state, sources, inj, batch_size=7, stats=stats).toarray()
    assert stats["workers"] == 1
    np.testing.assert_allclose(alone, one, rtol=0, atol=1e-12 * np.abs(one).max())

"""Coactivation statistics against brute force (Python loops over positions and pairs)."""

import numpy as np
import pytest
import torch

from tests.transcoders.tc_helpers import random_set, tiny_model
from transcoders.coactivation import (
    CoactivationAccumulator,
    compute_coactivation,
    flat_activations,
    flat_index,
)
from transcoders.errors import ConfigError


def _brute(acts: np.ndarray, pairs: np.ndarray):
    n_both, n_s, n_t, total = [], [], [], []
    for s, t in pairs:
        both = st = ss = 0
        tot = 0.0
        for row in acts:
            ss += row[s] > 0
            st += row[t] > 0
            both += (row[s] > 0) and (row[t] > 0)
            tot += row[s] if row[t] > 0 else 0.0
        n_both.append(both)
        n_s.append(ss)
        n_t.append(st)
        total.append(tot)
    return np.array(n_both), np.array(n_s), np.array(n_t), np.array(total)


def test_streamed_chunks_equal_brute_force():
    rng = np.random.default_rng(0)
    F = 30
    acts = np.where(rng.random((200, F)) < 0.2, rng.random((200, F)) + 0.1, 0.0)
    acts[:, 3] = 0.0  # a target that never fires
    acts[:, 4] = np.where(rng.random(200) < 0.1, -1.0, 0.0)  # negative values are not active
    pairs = np.array([(s, t) for s in (0, 1, 4, 7) for t in (2, 3, 5, 0)] + [(9, 9), (1, 0)])
    acc = CoactivationAccumulator(pairs, F)
    for chunk in np.array_split(acts, 7):
        acc.update(torch.tensor(chunk))
    got = acc.result()
    n_both, n_s, n_t, total = _brute(acts, pairs)
    np.testing.assert_array_equal(got.n_both, n_both)
    np.testing.assert_array_equal(got.n_source, n_s)
    np.testing.assert_array_equal(got.n_target, n_t)
    np.testing.assert_allclose(got.sum_source, total, rtol=1e-12)
    mean = got.mean_source_given_target
    assert np.all(np.isnan(mean[pairs[:, 1] == 3]))
    ok = n_t > 0
    np.testing.assert_allclose(mean[ok], total[ok] / n_t[ok], rtol=1e-12)
    assert got.n_positions == 200
    # memory: a few numbers per pair and per feature used, nothing per position
    assert acc.state_bytes() < 64 * len(pairs) + 64 * 8


def test_pass_over_a_corpus_with_two_sets_equals_brute_force():
    torch.manual_seed(0)
    model = tiny_model()
    sets = [random_set("plt", activation="relu"), random_set("sae", activation="relu", seed=1)]
    tokens = torch.randint(0, 50, (10, 12))
    pairs = np.array(
        [
            (flat_index(sets, 0, 0, f), flat_index(sets, t_set, 1, g))
            for f in range(0, 48, 5)
            for t_set in (0, 1)
            for g in range(0, 48, 7)
        ]
    )
    got = compute_coactivation(model, sets, tokens, pairs, chunk_seqs=3)
    acts = flat_activations(model, sets, tokens)[:, 1:].reshape(-1, 4 * 48).numpy()
    n_both, n_s, n_t, total = _brute(acts, pairs)
    assert n_both.sum() > 0 and (n_both == 0).any()
    np.testing.assert_array_equal(got.n_both, n_both)
    np.testing.assert_array_equal(got.n_target, n_t)
    np.testing.assert_allclose(got.sum_source, total, rtol=1e-6)
    assert got.n_positions == 10 * 11


def test_flat_activations_follow_each_sets_own_forward():
    model = tiny_model()
    sets = [random_set("plt", activation="relu"), random_set("sae", activation="relu", seed=1)]
    tokens = torch.randint(0, 50, (2, 5))
    flat = flat_activations(model, sets, tokens)
    _, cache = model.run_with_cache(tokens)
    z = cache["blocks.1.hook_attn_out"]
    a = torch.relu(z @ sets[1].W_enc[1] + sets[1].b_enc[1])
    i = flat_index(sets, 1, 1, 0)
    torch.testing.assert_close(flat[..., i : i + 48], a.float(), rtol=1e-5, atol=1e-6)


def test_bad_pairs_are_refused():
    with pytest.raises(ConfigError, match="outside"):
        CoactivationAccumulator([(0, 99)], 10)
    acc = CoactivationAccumulator([(0, 1)], 10)
    with pytest.raises(ConfigError, match="shape"):
        acc.update(torch.zeros(4, 9))

"""The interference analysis: each row's weight and coactivation against direct computation."""

import numpy as np
import torch

from attrgraph.analysis.global_weights import GlobalWeights, mean_norm_scales
from attrgraph.analysis.interference import bin_table, interference
from tests.attrgraph.ag_helpers import tiny_attn_saes, tiny_model, tiny_transcoders
from transcoders.coactivation import flat_activations


def test_rows_match_virtual_weights_and_brute_force_coactivation(one_torch_thread):
    model = tiny_model("gpt2", n_layers=3, dtype=torch.float32)
    sets = [tiny_transcoders(model, "clt"), tiny_attn_saes(model)]
    seqs = torch.randint(0, 40, (6, 10), generator=torch.Generator().manual_seed(0))
    r = interference(model, sets, seqs, n_per_layer=2, chunk_seqs=4)
    assert len(r.features) == 12  # 2 per (site, layer)
    assert set(r.direction) == {"input", "output"}
    gw = GlobalWeights(model, sets, mean_norm_scales(model, seqs.split(4)))
    acts = flat_activations(model, [sets[1], sets[0]], seqs)[:, 1:].reshape(-1, 3 * 20 + 3 * 24).numpy()
    sites = ("attn", "mlp")
    rng = np.random.default_rng(0)
    for i in rng.choice(len(r.weight), 40, replace=False):
        me = r.features[r.sampled[i]]
        other = (sites[r.other[i, 0]], int(r.other[i, 1]), int(r.other[i, 2]))
        src, tgt = (me, other) if r.direction[i] == "output" else (other, me)
        assert np.isclose(r.weight[i], gw.virtual_weight(src, tgt), rtol=1e-9)

        def col(f):
            return (0 if f[0] == "attn" else 60) + f[1] * (20 if f[0] == "attn" else 24) + f[2]

        both = int(((acts[:, col(src)] > 0) & (acts[:, col(tgt)] > 0)).sum())
        assert r.n_both[i] == both


def test_bin_table_by_hand():
    w = np.array([-1.0, -0.9, 0.0, 0.1, 1.0])
    ever = np.array([True, False, False, True, True])
    t = bin_table(w, ever, n_bins=4)  # bins [-1,-.5) [-.5,0) [0,.5) [.5,1]
    np.testing.assert_array_equal(t["count"], [2, 0, 2, 1])
    np.testing.assert_array_equal(t["coactive"], [1, 0, 1, 1])
    np.testing.assert_allclose(t["share"][[0, 2, 3]], [0.5, 0.5, 1.0])
    assert np.isnan(t["share"][1])

"""Attribution to an inactive feature: exact row, bias from the all-sources-zero model, and the
inhibitors' effects as finite differences."""

import numpy as np
import pytest
import torch

from attrgraph.analysis.inactive import attribute_inactive
from attrgraph.engine.replacement import ReplacementModel
from attrgraph.errors import TargetError
from tests.attrgraph.ag_helpers import tiny_model, tiny_transcoders

TOKENS = [3, 17, 5, 9, 17, 5, 22, 8]


@pytest.mark.parametrize(
    "arch,kind,skip", [("gpt2", "plt", True), ("gpt2", "clt", False), ("gemma2", "plt", False)]
)
def test_inactive_feature_row_is_exact(arch, kind, skip):
    model = tiny_model(arch, n_layers=3)
    tc = tiny_transcoders(model, kind, skip)
    rm = ReplacementModel(model, tc)
    state = rm.run(torch.tensor(TOKENS), exclude_bos=True)
    layer, pos = 2, 6
    inactive = torch.nonzero(state.pre_acts[layer, pos] < 0)[:, 0]
    assert len(inactive)
    f = int(inactive[0])
    res = attribute_inactive(model, rm, TOKENS, layer, pos, f, exclude_bos=True)
    assert res.pre_activation == pytest.approx(float(state.pre_acts[layer, pos, f]), rel=1e-12)
    assert res.gap > 0
    # bias: the frozen replacement with every source (embeddings, features, errors) at zero
    zero = rm.forward(
        state,
        acts=torch.zeros_like(state.acts),
        errors=torch.zeros_like(state.errors),
        embed=torch.zeros_like(state.embed),
    )
    assert res.bias == pytest.approx(float(zero.pre_acts[layer, pos, f]), rel=1e-7, abs=1e-9)
    assert res.contributions.sum() + res.bias == pytest.approx(res.pre_activation, rel=1e-9)
    # the strongest inhibiting feature: removing it raises h by exactly -A[h, s]
    g = res.graph
    feats = np.flatnonzero(g.nodes.kind == "feature")
    s = feats[np.argmin(res.contributions[feats])]
    assert res.contributions[s] < 0
    acts = state.acts.clone()
    acts[g.nodes.layer[s], g.nodes.position[s], g.nodes.feature[s]] = 0
    moved = float(rm.forward(state, acts=acts).pre_acts[layer, pos, f]) - res.pre_activation
    assert moved == pytest.approx(-res.contributions[s], rel=1e-7)
    assert res.inhibitors(3)[0][1] == pytest.approx(res.contributions.min())


def test_unknown_feature_is_refused():
    model = tiny_model("gpt2", n_layers=2)
    tc = tiny_transcoders(model)
    with pytest.raises(TargetError, match="does not exist"):
        attribute_inactive(model, tc, TOKENS, 1, 3, 10_000)


def test_a_set_whose_encoder_is_not_w_enc():
    """The target reads the set's encoder vectors, not `W_enc`: on a set whose features read
    `g * W_enc` the row is still exact (reading `W_enc` it was off by g, and refused)."""
    from tests.attrgraph.ag_helpers import gain_encoder_transcoders

    model = tiny_model("gpt2", n_layers=3)
    rm = ReplacementModel(model, gain_encoder_transcoders(model))
    state = rm.run(torch.tensor(TOKENS), exclude_bos=True)
    layer, pos = 2, 6
    f = int(torch.nonzero(state.pre_acts[layer, pos] < 0)[0, 0])
    res = attribute_inactive(model, rm, TOKENS, layer, pos, f, exclude_bos=True)
    assert res.pre_activation == pytest.approx(float(state.pre_acts[layer, pos, f]), rel=1e-12)
    assert res.contributions.sum() + res.bias == pytest.approx(res.pre_activation, rel=1e-9)

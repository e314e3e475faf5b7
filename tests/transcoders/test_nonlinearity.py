"""What a set answers about its nonlinearity, so callers need not know its name: where a feature turns
on (`onset_layer`), whether its tokens are independent (`per_token`), which kind of set it is."""

import pytest
import torch

from tests.transcoders.tc_helpers import random_set
from transcoders import build_transcoders, sites
from transcoders.config import TranscoderConfig
from transcoders.nonlinearity import NONLINEARITIES


@pytest.mark.parametrize("activation", ["relu", "jumprelu", "topk", "batchtopk"])
def test_onset_is_where_the_feature_turns_on(activation):
    """Just above the onset the feature is active, just below it is not, the other features fixed:
    checked through `activate_layer` (the per-token rule), for every inactive feature of a token."""
    tc = random_set("plt", activation, d_sae=24, seed=2).eval()
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        if tc.threshold is not None:  # distinct positive thresholds
            tc.threshold.copy_(torch.rand(tc.threshold.shape, generator=g) + 0.1)
    layer = 1
    pre = torch.randn(24, generator=g, dtype=torch.float32)
    inactive = (tc.activate_layer(pre, layer) == 0).nonzero().flatten().tolist()
    assert inactive
    for f in inactive:
        onset = tc.onset_layer(pre, layer, f)
        for delta, on in ((1e-3, True), (-1e-3, False)):
            h = pre.clone()
            h[f] = onset + delta
            assert bool(tc.activate_layer(h, layer)[f] > 0) == on, (f, onset, delta)


def test_onset_values_by_hand():
    pre = torch.tensor([0.5, -1.0, 2.0, 1.5, 0.2])
    assert random_set("plt", "relu", d_sae=5).onset_layer(pre, 0, 1) == 0.0
    jump = random_set("plt", "jumprelu", d_sae=5)
    with torch.no_grad():
        jump.threshold[1] = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5])
    assert jump.onset_layer(pre, 1, 3) == pytest.approx(0.4)
    topk = build_transcoders(
        TranscoderConfig(kind="plt", n_layers=1, d_model=4, d_sae=5, activation="topk", k=2)
    )
    assert topk.onset_layer(pre, 0, 0) == 1.5  # the 2nd largest pre-activation


def test_per_token_is_false_only_for_batchtopk_in_training():
    for activation in ("relu", "jumprelu", "topk", "batchtopk"):
        tc = random_set("plt", activation)
        assert tc.eval().per_token
        assert tc.train().per_token == (activation != "batchtopk")


def test_kind_properties():
    plt = TranscoderConfig(kind="plt", n_layers=1, d_model=4, d_sae=4)
    attn = TranscoderConfig(
        kind="sae",
        n_layers=1,
        d_model=4,
        d_sae=4,
        input_hook=sites.ATTN_OUTPUT,
        output_hook=sites.ATTN_OUTPUT,
    )
    resid = "blocks.{layer}.hook_resid_pre"
    other = TranscoderConfig(kind="sae", n_layers=1, d_model=4, d_sae=4, input_hook=resid, output_hook=resid)
    assert (plt.is_sae, attn.is_sae, other.is_sae) == (False, True, True)
    assert (plt.is_attention_sae, attn.is_attention_sae, other.is_attention_sae) == (False, True, False)


@pytest.mark.parametrize("name", sorted(NONLINEARITIES))
def test_extra_state_is_what_the_set_holds_besides_its_weights(name):
    """A foreign format reads and writes a nonlinearity's `extra_state` beside the encoder's and
    decoder's weights and biases: they must be the set's other tensors, and those of the nonlinearity
    it is stored as."""
    cls = NONLINEARITIES[name]
    widths = [4] if cls.nested else []
    cfg = TranscoderConfig(
        kind="plt", n_layers=2, d_model=4, d_sae=8, activation=name, k=2, matryoshka_widths=widths
    )
    tc = build_transcoders(cfg)
    assert set(tc.state_dict()) - {"W_enc", "b_enc", "W_dec", "b_dec"} == set(cls.extra_state)
    assert cls.stored_as().extra_state == cls.extra_state

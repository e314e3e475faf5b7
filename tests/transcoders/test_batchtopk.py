"""BatchTopK: the batch rule in training, a per-token threshold at inference, trained and stored."""

import pytest
import torch

from tests.transcoders.tc_helpers import random_set, tiny_model
from transcoders import load_transcoders, save_transcoders
from transcoders.activations import batch_topk
from transcoders.errors import ConfigError
from transcoders.nonlinearity import BATCHTOPK_MOMENTUM


def test_batch_rule_keeps_k_per_token_on_average_and_the_largest():
    h = torch.randn(6, 5, 2, 40, generator=torch.Generator().manual_seed(0))  # [batch, pos, layers, d_sae]
    out, smallest = batch_topk(h, 3)
    for l in range(2):
        kept = out[..., l, :]
        assert int((kept > 0).sum()) == 3 * 30  # k x tokens, shared by the tokens of the batch
        dropped = h[..., l, :][kept == 0].clamp(min=0)
        assert dropped.max() <= kept[kept > 0].min() == smallest[l]
        torch.testing.assert_close(kept[kept > 0], h[..., l, :][kept > 0])
    per_token = (out[..., 0, :] > 0).sum(-1)
    assert per_token.min() < per_token.max()  # not a per-token TopK


def test_all_negative_layer_keeps_nothing():
    out, smallest = batch_topk(-torch.rand(4, 1, 10), 2)
    assert out.abs().sum() == 0 and smallest.item() == 0


def test_training_estimates_the_threshold_and_eval_applies_it_per_token():
    tc = random_set("plt", "batchtopk", n_layers=2, seed=3)  # k = 8 of 48
    tc.train()
    x = torch.randn(64, 2, 32, generator=torch.Generator().manual_seed(1))
    _, smallest = batch_topk(tc.encode(x), tc.cfg.k)
    tc(x)  # first batch: the threshold is that batch's smallest kept activation
    torch.testing.assert_close(tc.threshold[:, 0], smallest)
    assert (tc.threshold == tc.threshold[:, :1]).all()  # one value per layer
    y = torch.randn(64, 2, 32, generator=torch.Generator().manual_seed(2))
    _, smallest_y = batch_topk(tc.encode(y), tc.cfg.k)
    tc(y)
    want = (1 - BATCHTOPK_MOMENTUM) * smallest + BATCHTOPK_MOMENTUM * smallest_y
    torch.testing.assert_close(tc.threshold[:, 0], want)

    tc.eval()
    h = tc.encode(x)
    acts = tc(x).acts
    torch.testing.assert_close(acts, h * (h > tc.threshold))
    torch.testing.assert_close(tc(x[:5]).acts, acts[:5])  # a token's features ignore the batch
    l0 = (acts > 0).float().sum(-1).mean()
    assert 0.5 * tc.cfg.k < l0 < 2 * tc.cfg.k


def test_k_is_checked():
    from transcoders import TranscoderConfig

    with pytest.raises(ConfigError, match="k is"):
        TranscoderConfig(kind="plt", n_layers=2, d_model=32, d_sae=48, activation="batchtopk", k=0)


@pytest.mark.parametrize("fmt", ["native", "circuit-tracer", "sae-lens", "gemmascope"])
def test_stored_sets_load_in_eval_mode_with_the_same_features(tmp_path, fmt):
    tc = random_set("plt", "batchtopk", n_layers=2, seed=4)
    tc.train()
    tc(torch.randn(128, 2, 32))  # estimate a threshold
    tc.eval()
    save_transcoders(tc, tmp_path / "set", format=fmt)
    back = load_transcoders(tmp_path / "set")
    assert not back.training
    x = torch.randn(7, 2, 32)
    torch.testing.assert_close(back(x).acts, tc(x).acts)
    torch.testing.assert_close(back(x).out, tc(x).out)


def test_replacement_model_refuses_a_set_in_training_mode():
    from attrgraph.engine.replacement import ReplacementModel
    from transcoders.errors import TranscoderMismatchError

    model = tiny_model()
    tc = random_set("plt", "batchtopk", n_layers=2)
    tc.train()
    with pytest.raises(TranscoderMismatchError, match="eval"):
        ReplacementModel(model, tc)
    ReplacementModel(model, tc.eval())

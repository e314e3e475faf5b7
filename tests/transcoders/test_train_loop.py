"""The training loop's rules, each against values worked out by hand from its documentation: the learning
rate schedule, the dead-feature rule at its boundary, and AuxK's loss, which must teach the dead features
to explain the residual without pulling the main reconstruction towards them."""

import pytest
import torch

from tests.transcoders.tc_helpers import random_set
from transcoders.losses import aux_mse, topk_aux_loss
from transcoders.sparse_topk import TopKStep
from transcoders.trainer import dead_features, lr_at

# `lr_at` (train.py): constant `lr`, then over the last 20% of the steps a linear decay
# `lr * (total - step) / (total - decay_start)` with `decay_start = int(0.8 * total)`.
LR_BY_HAND = [
    # total, step, lr_at / lr
    (100, 0, 1.0),
    (100, 79, 1.0),
    (100, 80, 1.0),  # 20 / 20: the decay starts from lr itself
    (100, 81, 19 / 20),
    (100, 90, 10 / 20),
    (100, 99, 1 / 20),  # the last step
    (10, 7, 1.0),
    (10, 8, 2 / 2),
    (10, 9, 1 / 2),
    (7, 4, 1.0),  # int(5.6) = 5
    (7, 5, 2 / 2),
    (7, 6, 1 / 2),
    (1, 0, 1.0),  # one step: decay_start 0, (1 - 0) / 1
]


@pytest.mark.parametrize("total,step,ratio", LR_BY_HAND)
def test_learning_rate_at_known_steps(total, step, ratio):
    assert lr_at(step, total, 3e-4) == pytest.approx(3e-4 * ratio, rel=1e-12)


def test_learning_rate_falls_linearly_to_one_decay_step_above_zero():
    total, lr = 1000, 1.0
    decay = [lr_at(s, total, lr) for s in range(800, 1000)]
    steps = [a - b for a, b in zip(decay, decay[1:])]
    assert steps == pytest.approx([1 / 200] * 199, rel=1e-9)  # equal decrements of lr / (total - start)
    assert decay[-1] == pytest.approx(1 / 200)


def test_dead_feature_rule_at_its_boundary():
    """Dead = silent for more than `dead_after` steps since the step it last fired: exactly `dead_after`
    steps later it is still alive, one more and it is dead."""
    dead_after = 97
    # silent for 101, 98, 97, 1 / 99, 98, 51, 0 steps at step 101
    last_fired = torch.tensor([[0.0, 3.0, 4.0, 100.0], [2.0, 3.0, 50.0, 101.0]])
    want = torch.tensor([[True, True, False, False], [True, True, False, False]])
    assert torch.equal(dead_features(101, last_fired, dead_after), want)
    assert not dead_features(97, torch.zeros(2, 4), dead_after).any()
    assert dead_features(98, torch.zeros(2, 4), dead_after).all()
    assert dead_features(5, last_fired, None) is None  # not tracked


def test_aux_mse_value_by_hand():
    aux = torch.tensor([[1.0, 2.0], [0.0, -1.0]])
    r = torch.tensor([[1.0, 0.0], [2.0, 1.0]])
    # ||aux - r||^2 = 0 + 4 + 4 + 4 = 12, ||r||^2 = 1 + 0 + 4 + 1 = 6
    assert aux_mse(aux, r).item() == pytest.approx(2.0)


def test_aux_mse_sends_no_gradient_into_the_residual():
    out = torch.randn(8, 2, 6, requires_grad=True)
    y = torch.randn(8, 2, 6)
    aux_out = torch.randn(8, 2, 6, requires_grad=True)
    aux_mse(aux_out, y - out).backward()
    assert out.grad is None
    assert aux_out.grad is not None and aux_out.grad.abs().sum() > 0


def _aux_gradient_into_out(aux_loss: torch.Tensor, out: torch.Tensor):
    """d aux_loss / d out, None when `out` is not on aux_loss's graph."""
    (grad,) = torch.autograd.grad(aux_loss, out, allow_unused=True)
    return grad


@pytest.mark.parametrize("kind", ["plt", "clt"])
def test_dense_auxk_leaves_the_main_reconstruction_alone(kind):
    """The dense step (`topk_aux_loss` on `y - out`): the aux term's gradient reaches the encoder of
    the dead features and the decoder, but not the main reconstruction `out`."""
    tc = random_set(kind, "topk", d_sae=32, seed=4)
    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(16, 2, 32, generator=g), torch.randn(16, 2, 32, generator=g)
    dead = torch.rand(2, 32, generator=g) < 0.5
    res = tc(x)
    aux = topk_aux_loss(tc, res.pre_acts, y - res.out, dead, 6)
    assert aux.item() > 0
    assert _aux_gradient_into_out(aux, res.out) is None
    (g_enc,) = torch.autograd.grad(aux, tc.W_enc, retain_graph=True)
    assert g_enc.abs().sum() > 0


def test_sparse_auxk_leaves_the_main_reconstruction_alone():
    """The sparse TopK step computes its aux loss on `y - out` inside its forward: the same rule."""
    tc = random_set("plt", "topk", d_sae=32, seed=4)
    g = torch.Generator().manual_seed(5)
    x, y = torch.randn(16, 2, 32, generator=g), torch.randn(16, 2, 32, generator=g)
    dead = torch.rand(2, 32, generator=g) < 0.5
    res = TopKStep(tc, 6)(x, y, dead)
    assert res.aux_loss.item() > 0
    assert _aux_gradient_into_out(res.aux_loss, res.out) is None

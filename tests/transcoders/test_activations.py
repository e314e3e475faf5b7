"""JumpReLU and Step against sae_lens's autograd functions (the oracle), a finite-difference check of the
threshold gradient on a smooth input distribution, the penalties' sign; TopK."""

import math

import pytest
import torch
from sae_lens.saes.jumprelu_sae import JumpReLU as SaeLensJumpReLU
from sae_lens.saes.jumprelu_sae import Step as SaeLensStep

from transcoders.activations import jumprelu, step, topk
from transcoders.config import TranscoderConfig
from transcoders.nonlinearity import JumpReLU, Penalty


def _inputs(seed: int):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(64, 3, 7, generator=g, dtype=torch.float64)
    theta = torch.rand(3, 7, generator=g, dtype=torch.float64) * 0.8 + 0.05
    grad = torch.randn(64, 3, 7, generator=g, dtype=torch.float64)
    return h, theta, grad


def _grads(fn, h, theta, grad, *args):
    h = h.clone().requires_grad_(True)
    theta = theta.clone().requires_grad_(True)
    out = fn(h, theta, *args)
    out.backward(grad)
    return out.detach(), h.grad, theta.grad


@pytest.mark.parametrize("bandwidth", [0.05, 0.3, 1.0, 2.0])
@pytest.mark.parametrize("ste_to_input", [False, True])
@pytest.mark.parametrize("fn", ["jumprelu", "step"])
def test_gradients_equal_sae_lens(bandwidth, ste_to_input, fn):
    ours, theirs = (jumprelu, SaeLensJumpReLU.apply) if fn == "jumprelu" else (step, SaeLensStep.apply)
    for seed in range(3):
        h, theta, grad = _inputs(seed)
        # sae_lens sums the threshold gradient over dim 0 only: flatten the batch dims for it
        o1, gh1, gt1 = _grads(ours, h, theta, grad, bandwidth, ste_to_input)
        o2, gh2, gt2 = _grads(theirs, h, theta, grad, bandwidth, ste_to_input)
        assert torch.equal(o1, o2)
        torch.testing.assert_close(gt1, gt2, rtol=0, atol=1e-9)
        if gh2 is None:
            assert gh1 is None or not gh1.any()
        else:
            torch.testing.assert_close(gh1, gh2, rtol=0, atol=1e-9)


def test_threshold_gradient_estimates_the_expected_loss_derivative():
    """For h ~ N(mu, 1) and loss `E[(a - y)^2]` with a fixed target y, `d/dtheta E[loss]` is known in closed
    form (the jump at theta removes `(theta - y)^2 - y^2` with density `p(theta)`); the straight-through
    estimate averaged over many samples must match it, within the kernel's bias at a small bandwidth."""
    torch.manual_seed(0)
    mu, y, theta0, eps = 0.2, 0.1, 0.5, 0.02
    n = 4_000_000
    h = mu + torch.randn(n, dtype=torch.float64)
    theta = torch.tensor([theta0], dtype=torch.float64, requires_grad=True)
    a = jumprelu(h[:, None], theta, eps)
    ((a - y) ** 2).mean().backward()
    density = math.exp(-((theta0 - mu) ** 2) / 2) / math.sqrt(2 * math.pi)
    # raising theta by d moves mass p(theta) d from a = theta (loss (theta - y)^2) to a = 0 (loss y^2)
    exact = density * (y**2 - (theta0 - y) ** 2)
    assert theta.grad.item() == pytest.approx(exact, rel=0.03)


@pytest.mark.parametrize("kind", ["tanh", "l0"])
def test_sparsity_penalty_never_pushes_a_threshold_down(kind):
    cfg = TranscoderConfig(kind="plt", n_layers=2, d_model=4, d_sae=6, bandwidth=1.0)
    nl = JumpReLU(cfg)
    g = torch.Generator().manual_seed(1)
    pre = torch.randn(200, 2, 6, generator=g) * 2
    theta = (torch.rand(2, 6, generator=g) + 0.01).requires_grad_(True)
    acts = nl(pre, theta)
    norms = torch.rand(2, 6, generator=g) + 0.5
    nl.sparsity(acts, pre, theta, norms, Penalty(kind, 1.0)).backward()
    assert (theta.grad <= 0).all()  # gradient descent raises thresholds (or leaves them)
    assert (theta.grad < 0).any()


def test_threshold_gradient_is_zero_outside_bandwidth():
    h = torch.tensor([[5.0, -5.0]], requires_grad=True)
    theta = torch.tensor([0.03, 0.03], requires_grad=True)
    jumprelu(h, theta, 1.0).sum().backward()
    assert torch.all(theta.grad == 0)
    assert h.grad.tolist() == [[1.0, 0.0]]


def test_topk_keeps_k_largest_positive():
    h = torch.tensor([[3.0, -1.0, 2.0, 0.5, -4.0]])
    assert topk(h, 2).tolist() == [[3.0, 0.0, 2.0, 0.0, 0.0]]
    assert topk(-h.abs(), 2).abs().sum() == 0  # all negative: ReLU zeroes them

"""JumpReLU's straight-through gradients against their formulas; TopK."""

import torch

from transcoders.activations import jumprelu, rectangle, step, topk


def test_jumprelu_forward_and_ste_gradients():
    torch.manual_seed(0)
    h = torch.randn(6, 2, 5, requires_grad=True)
    theta = torch.full((2, 5), 0.1, requires_grad=True)
    eps = 1.0
    a = jumprelu(h, theta, eps)
    torch.testing.assert_close(a, h * (h > theta))
    g = torch.randn_like(a)
    a.backward(g)
    K = rectangle((h - theta) / eps) / eps
    torch.testing.assert_close(h.grad, g * ((h > theta).float() + h * K))
    torch.testing.assert_close(theta.grad, -(g * h * K).sum(0))


def test_jumprelu_threshold_gradient_is_zero_outside_bandwidth():
    h = torch.tensor([[5.0, -5.0]], requires_grad=True)
    theta = torch.tensor([0.03, 0.03], requires_grad=True)
    jumprelu(h, theta, 1.0).sum().backward()
    assert torch.all(theta.grad == 0)
    assert h.grad.tolist() == [[1.0, 0.0]]


def test_step_pseudo_derivative():
    h = torch.tensor([0.0, 0.2, 2.0], requires_grad=True)
    theta = torch.tensor([0.1, 0.1, 0.1], requires_grad=True)
    s = step(h, theta, 0.5)
    assert s.tolist() == [0.0, 1.0, 1.0]
    s.sum().backward()
    assert theta.grad.tolist() == [-2.0, -2.0, 0.0]


def test_topk_keeps_k_largest_positive():
    h = torch.tensor([[3.0, -1.0, 2.0, 0.5, -4.0]])
    assert topk(h, 2).tolist() == [[3.0, 0.0, 2.0, 0.0, 0.0]]
    assert topk(-h.abs(), 2).abs().sum() == 0  # all negative: ReLU zeroes them

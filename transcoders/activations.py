"""Feature nonlinearities: ReLU, JumpReLU with a straight-through estimator, TopK.

JumpReLU (seed: circuit-tracing appendix, "ML details"; Rajamanoharan et al. 2024):

1. Forward: `a = h * H(h - theta)`, `H` the Heaviside step, `theta > 0` per feature.
2. Backward uses a pseudo-derivative of `H`: `dH/dh ~ K((h - theta)/eps) / eps` and
   `dH/dtheta ~ -K((h - theta)/eps) / eps`, with `K(u) = 1{|u| < 1/2}` the rectangle
   kernel and `eps` the bandwidth (the appendix uses 1.0, far above the original).
3. The appendix lets this gradient flow "to all model parameters, rather than only the
   threshold", so `da/dh = H(h - theta) + h K(...) / eps`, and `da/dtheta = -h K(...) / eps`.
   The tanh sparsity penalty (losses.py) therefore reaches the encoder through step 2.

TopK keeps, for each token and layer, the k largest pre-activations (after ReLU) and
zeroes the rest; its gradient is the ordinary one through the kept entries.
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor


def rectangle(u: Tensor) -> Tensor:
    """The kernel `K(u) = 1{|u| < 1/2}`."""
    return (u.abs() < 0.5).to(u.dtype)


class _JumpReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: Tensor, threshold: Tensor, bandwidth: float) -> Tensor:
        ctx.save_for_backward(h, threshold)
        ctx.bandwidth = bandwidth
        return h * (h > threshold).to(h.dtype)

    @staticmethod
    def backward(ctx, grad: Tensor):
        h, threshold = ctx.saved_tensors
        eps = ctx.bandwidth
        kernel = rectangle((h - threshold) / eps) / eps
        grad_h = grad * ((h > threshold).to(h.dtype) + h * kernel)
        grad_theta = -(grad * h * kernel)
        # threshold broadcasts over the leading (batch) dims of h: sum them away
        while grad_theta.dim() > threshold.dim():
            grad_theta = grad_theta.sum(0)
        return grad_h, grad_theta, None


def jumprelu(
    h: Float[Tensor, "... n_layers d_sae"], threshold: Float[Tensor, "n_layers d_sae"], bandwidth: float = 1.0
) -> Float[Tensor, "... n_layers d_sae"]:
    """`h * (h > threshold)`, with the straight-through gradient of the module docstring."""
    return _JumpReLU.apply(h, threshold, bandwidth)


def step(h: Tensor, threshold: Tensor, bandwidth: float = 1.0) -> Tensor:
    """`H(h - threshold)` with the pseudo-derivative of step 2 (for L0-style penalties)."""
    return _Step.apply(h, threshold, bandwidth)


class _Step(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: Tensor, threshold: Tensor, bandwidth: float) -> Tensor:
        ctx.save_for_backward(h, threshold)
        ctx.bandwidth = bandwidth
        return (h > threshold).to(h.dtype)

    @staticmethod
    def backward(ctx, grad: Tensor):
        h, threshold = ctx.saved_tensors
        kernel = rectangle((h - threshold) / ctx.bandwidth) / ctx.bandwidth
        grad_theta = -(grad * kernel)
        while grad_theta.dim() > threshold.dim():
            grad_theta = grad_theta.sum(0)
        return grad * kernel, grad_theta, None


def topk(h: Float[Tensor, "... n_layers d_sae"], k: int) -> Float[Tensor, "... n_layers d_sae"]:
    """ReLU of the k largest entries of the last dim; zeros elsewhere."""
    values, idx = h.topk(k, dim=-1)
    return torch.zeros_like(h).scatter(-1, idx, values.relu())


def apply_activation(
    h: Float[Tensor, "... n_layers d_sae"],
    activation: str,
    threshold: Tensor | None = None,
    k: int = 32,
    bandwidth: float = 1.0,
) -> Float[Tensor, "... n_layers d_sae"]:
    """Dispatch on a `TranscoderConfig.activation` name."""
    if activation == "relu":
        return h.relu()
    if activation == "jumprelu":
        assert threshold is not None, "jumprelu needs a threshold"
        return jumprelu(h, threshold, bandwidth)
    if activation == "topk":
        return topk(h, k)
    raise ValueError(f"unknown activation {activation!r}")

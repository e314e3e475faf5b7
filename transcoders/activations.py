"""Feature nonlinearities: ReLU, JumpReLU with a straight-through estimator, TopK, BatchTopK.

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

BatchTopK (Bussmann et al. 2024, "BatchTopK Sparse Autoencoders"):
4. Training: per layer, keep the `k * n_tokens` largest ReLU'd pre-activations of the whole batch
   (tokens share the budget, so L0 varies per token and averages k); gradient as for TopK.
5. Inference: a per-token rule is needed (a feature must not depend on the other tokens of the
   batch), so the set keeps a threshold per layer, the running mean of the smallest activation
   kept in training batches (base.py), and applies `h * (h > threshold)`: a JumpReLU with one
   threshold per layer, which is also how it is saved for other libraries.
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


def batch_topk(
    h: Float[Tensor, "... n_layers d_sae"], k: int
) -> tuple[Float[Tensor, "... n_layers d_sae"], Float[Tensor, " n_layers"]]:
    """Step 4: per layer, the `k * n_tokens` largest ReLU'd entries over all leading dims (the
    batch); zeros elsewhere. Also returns, per layer, the smallest positive value kept (0 if none)."""
    L, S = h.shape[-2:]
    flat = h.relu().reshape(-1, L, S).transpose(0, 1).reshape(L, -1)  # [L, n_tokens * S]
    n_tokens = flat.shape[1] // S
    values, idx = flat.topk(min(k * n_tokens, flat.shape[1]), dim=-1)
    out = torch.zeros_like(flat).scatter(-1, idx, values)
    with torch.no_grad():
        smallest = values.masked_fill(values <= 0, float("inf")).min(-1).values
        smallest = torch.where(torch.isfinite(smallest), smallest, torch.zeros_like(smallest))
    return out.reshape(L, n_tokens, S).transpose(0, 1).reshape(h.shape), smallest


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
    if activation == "batchtopk":  # inference form (step 5); training goes through `batch_topk`
        assert threshold is not None, "batchtopk needs its threshold"
        return h * (h > threshold).to(h.dtype)
    raise ValueError(f"unknown activation {activation!r}")

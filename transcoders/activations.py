"""Feature nonlinearities as functions: ReLU, JumpReLU with its straight-through estimator, TopK, BatchTopK.

The classes that own them (threshold, penalty, save / load) are in nonlinearity.py.

JumpReLU (Rajamanoharan et al. 2024, "Jumping Ahead", eqs. 10-11; circuit-tracing appendix, "ML details"):

1. Forward: `a = h * H(h - theta)`, `H` the Heaviside step, `theta > 0` per feature.
2. The step has no useful derivative, so the backward uses a kernel density estimate with the
   rectangle kernel `K(u) = 1{|u| < 1/2}` and bandwidth `eps`:
   `d a / d theta = -(theta / eps) * K((h - theta) / eps)`      (eq. 11: the jump of height theta)
   `d H / d theta = -(1 / eps) * K((h - theta) / eps)`          (the step, for an L0 penalty)
3. The input gradient is the paper's `d a / d h = H(h - theta)` (the default), or, with
   `ste_to_input=True`, `H(h - theta) + (theta / eps) K((h - theta) / eps)`: the appendix's choice
   ("we pass the straight-through gradient to all model parameters, rather than only the
   threshold"), where the estimator of step 2 also reaches the pre-activation and so the encoder.
   For the step, `ste_to_input=True` gives `d H / d h = (1 / eps) K(...)`, else 0.
   These are sae_lens's `JumpReLU` and `Step` autograd functions (`jumprelu_sae.py`), the tests'
   oracle.

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


def _sum_to(grad: Tensor, like: Tensor) -> Tensor:
    """`grad` summed over the leading (batch) dims that `like` (a threshold) broadcasts over."""
    while grad.dim() > like.dim():
        grad = grad.sum(0)
    return grad


class _JumpReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: Tensor, threshold: Tensor, bandwidth: float, ste_to_input: bool) -> Tensor:
        ctx.save_for_backward(h, threshold)
        ctx.bandwidth, ctx.ste_to_input = bandwidth, ste_to_input
        return h * (h > threshold).to(h.dtype)

    @staticmethod
    def backward(ctx, grad: Tensor):
        h, threshold = ctx.saved_tensors
        eps = ctx.bandwidth
        ste = (threshold / eps) * rectangle((h - threshold) / eps) * grad  # step 2, eq. 11
        grad_h = (h > threshold).to(h.dtype) * grad
        if ctx.ste_to_input:  # step 3, the appendix's variant
            grad_h = grad_h + ste
        return grad_h, _sum_to(-ste, threshold), None, None


class _Step(torch.autograd.Function):
    @staticmethod
    def forward(ctx, h: Tensor, threshold: Tensor, bandwidth: float, ste_to_input: bool) -> Tensor:
        ctx.save_for_backward(h, threshold)
        ctx.bandwidth, ctx.ste_to_input = bandwidth, ste_to_input
        return (h > threshold).to(h.dtype)

    @staticmethod
    def backward(ctx, grad: Tensor):
        h, threshold = ctx.saved_tensors
        eps = ctx.bandwidth
        ste = rectangle((h - threshold) / eps) / eps * grad
        return (ste if ctx.ste_to_input else None), _sum_to(-ste, threshold), None, None


def jumprelu(
    h: Float[Tensor, "... n_layers d_sae"],
    threshold: Float[Tensor, "n_layers d_sae"],
    bandwidth: float = 1.0,
    ste_to_input: bool = False,
) -> Float[Tensor, "... n_layers d_sae"]:
    """`h * (h > threshold)`, with the straight-through gradients of steps 2-3."""
    return _JumpReLU.apply(h, threshold, bandwidth, ste_to_input)


def step(h: Tensor, threshold: Tensor, bandwidth: float = 1.0, ste_to_input: bool = False) -> Tensor:
    """`H(h - threshold)` with the pseudo-derivative of steps 2-3 (for the L0 penalty)."""
    return _Step.apply(h, threshold, bandwidth, ste_to_input)


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


def threshold_gate(h: Tensor, threshold: Tensor) -> Tensor:
    """Step 5's inference rule `h * (h > threshold)`, no gradient to the threshold."""
    return h * (h > threshold).to(h.dtype)

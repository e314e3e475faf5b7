"""Training losses, as plain functions (seed: circuit-tracing appendix, "ML details").

All act on normalized activations (train.py divides inputs and targets of layer l by
their RMS scale, so that `E ||x[l]||^2 = d_model`):

1. Reconstruction: `mse = mean_tokens sum_l ||y[l] - y_hat[l]||^2 / d_model` (about `n_layers`
   for the all-zero prediction, about `sum_l FVU[l]` in general).
2. JumpReLU: tanh sparsity penalty `lambda * mean_tokens sum_{l,f} tanh(c * a[l,f] * ||W_dec[l,f]||)`,
   `||W_dec[l,f]||` the norm of feature (l, f)'s decoder (for a CLT, all its decoders concatenated);
   `lambda` ramps linearly from 0 to its final value over all of training (`sparsity_schedule`).
3. ReLU: the L1 penalty of the seed's eq. 1, weighted by decoder norms the same way
   (`lambda * sum a * ||W_dec||`), so that shrinking decoders cannot game it.
4. Optional pre-activation loss against dead features: the appendix's `mean_tokens sum_{l,f} ReLU(-h[l,f])`
   (at 3e-6 there), or sae_lens's `ReLU(theta - h) * ||W_dec||` over dead features only.
5. TopK: auxiliary loss (Gao et al. 2024): the `k_aux` largest pre-activations among dead
   features reconstruct the main residual `y - y_hat`; its MSE over the residual's is added.
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor, nn


def mse_loss(
    out: Float[Tensor, "batch n_layers d_model"], target: Float[Tensor, "batch n_layers d_model"]
) -> Tensor:
    """Step 1: squared error summed over layers and dims, averaged over tokens, over d_model."""
    return (out - target).pow(2).sum(dim=(-1, -2)).mean() / out.shape[-1]


def tanh_sparsity(
    acts: Float[Tensor, "batch n_layers d_sae"],
    decoder_norms: Float[Tensor, "n_layers d_sae"],
    c: float = 1.0,
) -> Tensor:
    """Step 2 without lambda: `mean_tokens sum_{l,f} tanh(c * a * ||W_dec||)`."""
    return torch.tanh(c * acts * decoder_norms).sum(dim=(-1, -2)).mean()


def l1_sparsity(
    acts: Float[Tensor, "batch n_layers d_sae"], decoder_norms: Float[Tensor, "n_layers d_sae"]
) -> Tensor:
    """Step 3 without lambda: `mean_tokens sum_{l,f} a * ||W_dec||`."""
    return (acts.abs() * decoder_norms).sum(dim=(-1, -2)).mean()


PREACT_FORMS = ("appendix", "sae_lens")


def preact_loss(
    pre_acts: Float[Tensor, "batch n_layers d_sae"],
    form: str = "appendix",
    threshold: Tensor | None = None,
    decoder_norms: Tensor | None = None,
    dead: Tensor | None = None,
) -> Tensor:
    """Step 4: "appendix" `mean_tokens sum_{l,f} ReLU(-h)`; "sae_lens" (its `calculate_pre_act_loss`)
    `mean_tokens sum_{l,f} ReLU(theta - h) * ||W_dec|| * dead`, 0 while no feature is dead."""
    if form == "appendix":
        return (-pre_acts).relu().sum(dim=(-1, -2)).mean()
    if dead is None or not bool(dead.any()):
        return pre_acts.new_zeros(())
    theta = threshold if threshold is not None else torch.zeros_like(decoder_norms)
    return ((theta - pre_acts).relu() * decoder_norms * dead).sum(dim=(-1, -2)).mean()


def sparsity_schedule(step: int, total_steps: int, final: float) -> float:
    """Step 2's linear ramp: 0 at step 0, `final` at the last step."""
    return final * min(1.0, step / max(1, total_steps - 1))


def topk_aux_loss(
    tc: nn.Module,  # a SparseCoder (base.py imports this module through nonlinearity.py)
    pre_acts: Float[Tensor, "batch n_layers d_sae"],
    residual: Float[Tensor, "batch n_layers d_model"],
    dead: Float[Tensor, "n_layers d_sae"],
    k_aux: int,
) -> Tensor:
    """Step 5: normalized MSE of the dead features' best `k_aux` reconstruction of `residual`."""
    if not bool(dead.any()):
        return pre_acts.new_zeros(())
    k = min(k_aux, int(dead.sum(-1).max()))
    masked = torch.where(dead.bool(), pre_acts, torch.full_like(pre_acts, -torch.inf))
    values, idx = masked.topk(k, dim=-1)
    aux_acts = torch.zeros_like(pre_acts).scatter(-1, idx, values.relu().nan_to_num(0.0, 0.0, 0.0))
    return aux_mse(tc.decode(aux_acts) - tc.b_dec, residual)


def aux_mse(
    aux_out: Float[Tensor, "batch n_layers d_model"], residual: Float[Tensor, "batch n_layers d_model"]
) -> Tensor:
    """Step 5's normalized MSE `||aux_out - r||^2 / ||r||^2`, the residual `r` detached."""
    residual = residual.detach()
    return (aux_out - residual).pow(2).sum() / residual.pow(2).sum().clamp_min(1e-12)

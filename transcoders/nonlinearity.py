"""Feature nonlinearities as small classes: each knows its forward, its straight-through backward, its
sparsity penalty and the threshold tensor it keeps. `SparseCoder` asks its nonlinearity; nothing
outside `transcoders/` switches on an activation name.

A nonlinearity of a set with `n_layers` layers and `d_sae` features per layer:

1. `make_threshold(n_layers, d_sae)`: the tensor saved as `threshold` ([n_layers, d_sae]): a trained
   `nn.Parameter` (JumpReLU), an estimated buffer (BatchTopK) or None (ReLU, TopK).
2. `__call__(h, threshold)`: the per-token rule on pre-activations `[..., d_sae]` or
   `[..., n_layers, d_sae]`, with the matching threshold (one layer's row, or all of it).
3. `train_call(coder, h)`: the rule in training (BatchTopK: the batch budget, and its threshold is
   re-estimated; everything else: step 2).
4. `sparsity(acts, pre_acts, threshold, decoder_norms, penalty)`: the penalty without its lambda,
   `mean_tokens sum_{l,f}` of the per-feature term (losses.py gives the terms).
5. `begin_training` / `end_training`: JumpReLU trains `log(theta)` (Rajamanoharan et al. 2024,
   section 4: "we parametrise the threshold via its logarithm"), so theta stays positive with no
   clamp that could pin it at 0; the set saved afterwards holds theta itself.
6. `onset(h, threshold, feature)`: on one token's pre-activations `h` [d_sae] of one layer, the value
   feature `feature`'s pre-activation must exceed for the feature to be active, the others fixed
   (ReLU 0, JumpReLU and BatchTopK (inference) its threshold, TopK the k-th largest of `h`).
7. `batch_rule_in_training`: whether, in training mode, a token's activations depend on the other
   tokens of the batch (BatchTopK), so that a set must be in eval mode to be used per token.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from transcoders import losses
from transcoders.activations import batch_topk, jumprelu, step, threshold_gate, topk

if TYPE_CHECKING:
    from transcoders.config import TranscoderConfig

Coder = nn.Module
"""The `SparseCoder` a nonlinearity serves (base.py imports this module, so it is not named here)."""

THRESHOLD_INIT = 0.03
"""JumpReLU's initial threshold (the appendix's 0.03)."""
PENALTIES = ("tanh", "l0")
LOG_THRESHOLD = "parametrizations.threshold.original"
"""The state-dict key of log(theta) while a JumpReLU set trains (step 5)."""


@dataclass(frozen=True)
class Penalty:
    """How a JumpReLU's sparsity is penalized (ReLU always takes the weighted L1)."""

    kind: str = "tanh"
    """"tanh" (the appendix: `tanh(c * a * ||W_dec||)`) or "l0" (Rajamanoharan et al.: `H(h - theta)`
    through the step's straight-through estimator)."""
    c: float = 1.0
    """The c inside tanh(c * a * ||W_dec||)."""


class Nonlinearity:
    """Base class; see the module docstring for the contract."""

    name: ClassVar[str] = ""
    trained_threshold: ClassVar[bool] = False
    """Whether `threshold` is a parameter the optimizer trains."""

    def __init__(self, cfg: TranscoderConfig):
        self.k = cfg.k
        self.bandwidth = cfg.bandwidth
        self.ste_to_input = cfg.ste_to_input

    batch_rule_in_training: ClassVar[bool] = False
    """Step 7: a token's activations depend on its batch in training mode (BatchTopK)."""

    def make_threshold(self, n_layers: int, d_sae: int) -> Tensor | None:
        return None

    def onset(self, h: Tensor, threshold: Tensor | None, feature: int) -> float:
        """Step 6: the pre-activation above which `feature` is active at this token (ReLU: 0)."""
        return 0.0

    def __call__(self, h: Tensor, threshold: Tensor | None) -> Tensor:
        raise NotImplementedError

    def train_call(self, coder: Coder, h: Tensor) -> Tensor:
        return self(h, coder.threshold)

    def sparsity(
        self,
        acts: Tensor,
        pre_acts: Tensor,
        threshold: Tensor | None,
        decoder_norms: Tensor,
        penalty: Penalty,
    ) -> Tensor:
        return acts.new_zeros(())

    def begin_training(self, coder: Coder) -> None:
        """Prepare `coder` for the optimizer (step 5); a no-op unless the threshold is trained."""

    def end_training(self, coder: Coder) -> None:
        """Undo `begin_training`: the set again holds its plain `threshold`."""

    def adapt_state(self, coder: Coder, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """`state` (a checkpoint's, or a saved set's) with its keys as `coder` holds them now."""
        return state


class ReLU(Nonlinearity):
    """`a = ReLU(h)`, penalized with the decoder-norm-weighted L1 (linear-computation-graphs eq. 1)."""

    name = "relu"

    def __call__(self, h, threshold):
        return h.relu()

    def sparsity(self, acts, pre_acts, threshold, decoder_norms, penalty):
        return losses.l1_sparsity(acts, decoder_norms)


class _LogThreshold(nn.Module):
    """`theta = exp(log_theta)`: the parametrization of step 5."""

    def forward(self, log_theta: Tensor) -> Tensor:
        return log_theta.exp()

    def right_inverse(self, theta: Tensor) -> Tensor:
        return theta.log()


class JumpReLU(Nonlinearity):
    """`a = h * H(h - theta)`, straight-through gradients as in activations.py; the tanh or L0 penalty."""

    name = "jumprelu"
    trained_threshold = True

    def make_threshold(self, n_layers, d_sae):
        return nn.Parameter(torch.full((n_layers, d_sae), THRESHOLD_INIT))

    def onset(self, h, threshold, feature):
        return float(threshold[feature].detach())

    def __call__(self, h, threshold):
        return jumprelu(h, threshold, self.bandwidth, self.ste_to_input)

    def sparsity(self, acts, pre_acts, threshold, decoder_norms, penalty):
        if penalty.kind == "l0":
            return step(pre_acts, threshold, self.bandwidth, self.ste_to_input).sum(dim=(-1, -2)).mean()
        return losses.tanh_sparsity(acts, decoder_norms, penalty.c)

    def begin_training(self, coder):
        if not bool((coder.threshold > 0).all()):
            raise ValueError("JumpReLU trains log(threshold): every threshold must be positive to start.")
        parametrize.register_parametrization(coder, "threshold", _LogThreshold())

    def end_training(self, coder):
        if parametrize.is_parametrized(coder, "threshold"):
            parametrize.remove_parametrizations(coder, "threshold", leave_parametrized=True)

    def adapt_state(self, coder, state):
        state = dict(state)
        training = parametrize.is_parametrized(coder, "threshold")
        if training and "threshold" in state:
            state[LOG_THRESHOLD] = state.pop("threshold").log()
        elif not training and LOG_THRESHOLD in state:
            state["threshold"] = state.pop(LOG_THRESHOLD).exp()
        return state


class TopK(Nonlinearity):
    """The k largest ReLU'd pre-activations per token and layer; no penalty (AuxK is in train.py)."""

    name = "topk"

    def __call__(self, h, threshold):
        return topk(h, self.k)

    def onset(self, h, threshold, feature):
        return float(h.detach().topk(self.k).values[-1])


class BatchTopK(Nonlinearity):
    """Training: the `k * n_tokens` largest of the batch per layer; inference: its estimated threshold."""

    name = "batchtopk"
    batch_rule_in_training = True

    def make_threshold(self, n_layers, d_sae):
        return torch.zeros(n_layers, d_sae)  # a buffer: estimated, not trained

    def onset(self, h, threshold, feature):
        return float(threshold[feature].detach())  # the per-token rule's estimated threshold

    def __call__(self, h, threshold):
        return threshold_gate(h, threshold)

    def train_call(self, coder, h):
        if not coder.training:
            return self(h, coder.threshold)
        acts, smallest = batch_topk(h, self.k)
        coder.update_batchtopk_threshold(smallest)
        return acts


NONLINEARITIES: dict[str, type[Nonlinearity]] = {cls.name: cls for cls in (ReLU, JumpReLU, TopK, BatchTopK)}

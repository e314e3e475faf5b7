"""Feature nonlinearities as small classes: each knows its forward, its straight-through backward, its
sparsity penalty, the threshold tensor it keeps and how foreign formats hold it. `SparseCoder` and the
readers and writers of formats/ ask the nonlinearity; no module besides this one, activations.py and
base.py switches on an activation name (tests/transcoders/test_no_activation_switches.py).

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
8. On a rank of a distributed run (`d`, distributed.py): `spread(h, threshold, d)` is step 2 on a
   rank holding a slice of the features (TopK: this rank's entries among the k largest of all
   ranks', `distributed.global_top`), `spread_train_call(coder, h, d)` step 3 (BatchTopK: the budget
   of the global batch, over all ranks' tokens or features). Each gives this rank's part of what one
   process gives on the whole.
9. `aux_loss(coder, h, residual, dead, d)`: the nonlinearity's auxiliary loss without its coefficient,
   or None (TopK and BatchTopK: AuxK, Gao et al. 2024, the `2k` largest dead pre-activations
   reconstructing the residual, losses.py step 5; `needs_dead` says the trainer must track dead
   features for it).
10. `uses_k`: whether `cfg.k` means something (TopK, BatchTopK), so the config checks it;
   `sparse_step`: whether a per-layer set of it may train with sparse_topk.py's step (TopK).
11. `nested_loss(coder, acts, out, y, d, pre_acts)`: reconstruction terms besides the MSE, weighted 1
   like it, or None (Matryoshka BatchTopK: every nested prefix of the features reconstructs the target,
   `nested` says the config must give its widths; Gated: the auxiliary reconstruction of the gate).
12. `make_params(n_layers, d_sae)`: parameters besides the threshold the nonlinearity adds to the set
   (Gated: `r_mag`, `b_mag`); `layer_params(coder, layer)` is what steps 2, 4, 6 and 8 take as their
   second argument (the threshold's row, or all of it with `layer` None; Gated: its gate bias and
   magnitude parameters); `encoder(coder, layer)` the weight and bias of the pre-activation that
   attribution reads (`W_enc`, `b_enc`; Gated: its magnitude path).
13. Foreign formats (formats/ asks these, and never names an activation): `stored_as()` is the
   nonlinearity they store it as (itself; BatchTopK and Matryoshka BatchTopK: JumpReLU with their
   inference threshold, as sae_lens saves its own), whose `extra_state` are the tensors they hold
   besides `W_enc`, `b_enc`, `W_dec`, `b_dec` and `W_skip` (JumpReLU: `threshold`; Gated: `r_mag`,
   `b_mag`). `sae_lens` gives its sae_lens architecture for an SAE, a transcoder and a skip
   transcoder (None where sae_lens has none) and sae_lens's name of `b_enc` (Gated: `b_gate`);
   `circuit_tracer` and `gemmascope` whether those files hold it (circuit-tracer: a ReLU with an
   optional threshold; GemmaScope: JumpReLU); `sparsify` its name in EleutherAI sparsify's
   `cfg.json` "activation" (TopK: "topk"; None where sparsify has none); `label` names it in their refusals;
   `fold_input_offset(state, offset)` rewrites a layer reading `x - offset` to read `x` (sae_lens's
   `apply_b_dec_to_input`). A foreign file tells its nonlinearity by registry lookup:
   `sae_lens_architectures()` (which nonlinearity reads sae_lens architecture X),
   `sparsify_activations()` (which reads sparsify activation X), `stored_with(extra,
   held)` (of those a format holds, the one whose `extra_state` the file has: a circuit-tracer file
   with a threshold is JumpReLU, without one ReLU).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from transcoders import distributed as tdist
from transcoders import losses
from transcoders.activations import batch_topk, jumprelu, step, threshold_gate, topk

Coder = nn.Module
"""The `SparseCoder` a nonlinearity serves (base.py imports this module, so it is not named here)."""

BATCHTOPK_MOMENTUM = 0.01
"""BatchTopK's inference threshold: the running mean, with this momentum, of the smallest kept value."""
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


class SaeLens(NamedTuple):
    """How sae_lens holds a nonlinearity (step 13): its architecture per role, None where it has none."""

    sae: str | None = None
    transcoder: str | None = None
    skip_transcoder: str | None = None
    """A transcoder with a skip connection (sae_lens adds `x @ W_skip.T`)."""
    b_enc: str = "b_enc"
    """sae_lens's name of our `b_enc` (Gated: the gate's bias `b_gate`)."""

    def architectures(self) -> dict[str, str]:
        """`{role: architecture}` for the roles ("sae", "transcoder", "skip_transcoder") sae_lens has."""
        roles = ("sae", "transcoder", "skip_transcoder")
        return {role: arch for role in roles if (arch := getattr(self, role)) is not None}


class Nonlinearity:
    """Base class; see the module docstring for the contract."""

    name: ClassVar[str] = ""
    trained_threshold: ClassVar[bool] = False
    """Whether `threshold` is a parameter the optimizer trains."""

    def __init__(self, cfg):
        """`cfg`: the set's `TranscoderConfig` (not named here: config.py reads this module's one list
        of nonlinearities, `NONLINEARITIES`, and the layering test refuses import cycles)."""
        self.k = cfg.k
        self.bandwidth = cfg.bandwidth
        self.ste_to_input = cfg.ste_to_input

    batch_rule_in_training: ClassVar[bool] = False
    """Step 7: a token's activations depend on its batch in training mode (BatchTopK)."""
    needs_dead: ClassVar[bool] = False
    """Step 9: its auxiliary loss reads which features are dead (TopK, BatchTopK)."""
    uses_k: ClassVar[bool] = False
    """Step 10: `cfg.k` is its budget (TopK, BatchTopK)."""
    sparse_step: ClassVar[bool] = False
    """Step 10: the k active features per token are all a training step needs (TopK)."""
    nested: ClassVar[bool] = False
    """Step 11: trains nested prefixes of the features (`cfg.matryoshka_widths`)."""
    label: ClassVar[str] = ""
    """Step 13: its name in messages ("TopK", "gated": "circuit-tracer has no TopK activation")."""
    extra_state: ClassVar[tuple[str, ...]] = ()
    """Step 13: the tensors its set holds besides the encoder's and decoder's weights and biases (and
    `W_skip`), which a foreign format reads and writes with them."""
    sae_lens: ClassVar[SaeLens] = SaeLens()
    """Step 13: its sae_lens architectures (none: sae_lens cannot hold it, or holds its `stored_as`)."""
    circuit_tracer: ClassVar[bool] = False
    """Step 13: circuit-tracer's files hold it (they know a ReLU, with a threshold or without)."""
    gemmascope: ClassVar[bool] = False
    """Step 13: GemmaScope's params.npz files hold it (they hold JumpReLU's threshold)."""
    sparsify: ClassVar[str | None] = None
    """Step 13: its name in EleutherAI sparsify's `cfg.json` "activation", None where sparsify has none."""

    @classmethod
    def stored_as(cls) -> type[Nonlinearity]:
        """Step 13: the nonlinearity foreign formats store this one as (and read it back as)."""
        return cls

    @classmethod
    def fold_input_offset(cls, state: dict[str, Tensor], offset: Tensor) -> dict[str, Tensor]:
        """Step 13: one layer's `state` whose pre-activations read `x - offset`, rewritten to read `x`:
        `b_enc - offset @ W_enc`."""
        return state | {"b_enc": state["b_enc"] - offset @ state["W_enc"]}

    def make_threshold(self, n_layers: int, d_sae: int) -> Tensor | None:
        return None

    def make_params(self, n_layers: int, d_sae: int) -> dict[str, nn.Parameter]:
        """Step 12: trained parameters besides the threshold, zero at initialization."""
        return {}

    def layer_params(self, coder: Coder, layer: int | None):
        """Step 12: the threshold's row of `layer` (all rows for None), or None without a threshold."""
        if coder.threshold is None:
            return None
        return coder.threshold if layer is None else coder.threshold[layer]

    def encoder(self, coder: Coder, layer: int | None) -> tuple[Tensor, Tensor]:
        """Step 12: `(W [.., d_model, d_sae], b [.., d_sae])` with pre-activations `x @ W + b` (all
        layers for `layer` None)."""
        if layer is None:
            return coder.W_enc, coder.b_enc
        return coder.W_enc[layer], coder.b_enc[layer]

    def feature_dims(self) -> dict[str, int | None]:
        """The feature axis of each tensor this nonlinearity adds to the set (`threshold`
        [n_layers, d_sae]: 1), declared for sharding (base.py `declare_features`)."""
        return {} if self.make_threshold(1, 1) is None else {"threshold": 1}

    def onset(self, h: Tensor, threshold: Tensor | None, feature: int) -> float:
        """Step 6: the pre-activation above which `feature` is active at this token (ReLU: 0)."""
        return 0.0

    def __call__(self, h: Tensor, threshold: Tensor | None) -> Tensor:
        raise NotImplementedError

    def train_call(self, coder: Coder, h: Tensor) -> Tensor:
        return self(h, self.layer_params(coder, None))

    def spread(self, h: Tensor, threshold: Tensor | None, d: tdist.Dist) -> Tensor:
        """Step 8: `__call__` on a rank of `d`; a per-feature rule needs nothing from the others."""
        return self(h, threshold)

    def spread_train_call(self, coder: Coder, h: Tensor, d: tdist.Dist) -> Tensor:
        """Step 8: `train_call` on a rank of `d`."""
        return self.spread(h, self.layer_params(coder, None), d)

    def aux_loss(
        self, coder: Coder, h: Tensor, residual: Tensor, dead: Tensor | None, d: tdist.Dist
    ) -> Tensor | None:
        """Step 9: the auxiliary loss (no coefficient), or None when the nonlinearity has none."""
        return None

    def nested_loss(
        self,
        coder: Coder,
        acts: Tensor,
        out: Tensor,
        y: Tensor,
        d: tdist.Dist,
        pre_acts: Tensor | None = None,
    ) -> Tensor | None:
        """Step 11: reconstruction terms besides the MSE (weighted 1), or None."""
        return None

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
    label = "ReLU"
    sae_lens = SaeLens("standard", "transcoder", "skip_transcoder")
    circuit_tracer = True

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
    label = "JumpReLU"
    extra_state = ("threshold",)
    sae_lens = SaeLens("jumprelu", "jumprelu_transcoder", "jumprelu_skip_transcoder")
    """sae_lens computes `ReLU(h) * (h > threshold)`: ours for thresholds >= 0 (the writer checks)."""
    circuit_tracer = True
    gemmascope = True

    def make_threshold(self, n_layers, d_sae):
        return nn.Parameter(torch.full((n_layers, d_sae), THRESHOLD_INIT))

    def feature_dims(self):
        return {"threshold": 1, LOG_THRESHOLD: 1}  # log(theta) while training (step 5)

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


class _AuxK(Nonlinearity):
    """AuxK (step 9), shared by TopK and BatchTopK: the `2k` largest dead pre-activations per token and
    layer reconstruct the residual (losses.py step 5; over all ranks' features when they are sharded)."""

    needs_dead = True
    uses_k = True

    @property
    def k_aux(self) -> int:
        """Dead features AuxK takes per token and layer: 2k (TrainConfig.auxk_coef)."""
        return 2 * self.k

    def aux_loss(self, coder, h, residual, dead, d):
        if d.shards_features:
            return tdist.sharded_topk_aux_loss(coder, h, residual, dead, self.k_aux, d)
        return losses.topk_aux_loss(coder, h, residual, dead, self.k_aux)


class TopK(_AuxK):
    """The k largest ReLU'd pre-activations per token and layer; no penalty, AuxK (step 9)."""

    name = "topk"
    sparse_step = True
    label = "TopK"
    sae_lens = SaeLens("topk")
    """sae_lens has TopK SAEs only; circuit-tracer and GemmaScope have no per-token top-k rule."""
    sparsify = "topk"
    """sparsify's TopK keeps the k largest of ReLU(h): the same activations as the ReLU of the k largest."""

    def __call__(self, h, threshold):
        return topk(h, self.k)

    def spread(self, h, threshold, d):
        """Features sharded: this rank's entries among the k largest of all ranks' (ReLU'd)."""
        if not d.shards_features:
            return self(h, threshold)
        mask, _ = tdist.global_top(h, tdist.feature_index(h.shape, d, h.device), self.k, d)
        return torch.where(mask, h.relu(), torch.zeros_like(h))

    def onset(self, h, threshold, feature):
        return float(h.detach().topk(self.k).values[-1])


class BatchTopK(_AuxK):
    """Training: the `k * n_tokens` largest of the batch per layer; inference: its estimated threshold."""

    name = "batchtopk"
    batch_rule_in_training = True
    label = "BatchTopK"
    extra_state = ("threshold",)

    @classmethod
    def stored_as(cls):
        """Its inference rule `h * (h > threshold)` is JumpReLU's, so foreign formats hold it as one."""
        return JumpReLU

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
        self.update_threshold(coder, smallest)
        return acts

    def spread_train_call(self, coder, h, d):
        """Per layer, the `k * n_tokens` largest ReLU'd entries of the global batch, over every rank's
        features (sharded) or tokens (data parallel).

        This rank's `h` [..., L, s] are tokens `token0 + t` and features `feature0 + f` of a batch
        `token_ranks` times its own token count and `n_features` features; global index `token *
        n_features + feature` is the flat order of `activations.batch_topk`, and each rank offers its
        local top `k * n_tokens` (no rank holds more of the global top). The running threshold takes
        the smallest positive kept value (0 if none), the same on every rank."""
        if not coder.training:
            return self(h, coder.threshold)
        L, s = h.shape[-2:]
        flat = h.relu().reshape(-1, L, s)
        n = flat.shape[0]
        feature0, n_features = (d.rank * s, s * d.world) if d.shards_features else (0, s)
        token0, token_ranks = (d.rank * n, d.world) if d.shards_batch else (0, 1)
        token = (torch.arange(n, device=h.device) + token0)[:, None, None] * n_features
        feature = torch.arange(s, device=h.device) + feature0
        gidx = (feature.expand(flat.shape) + token).transpose(0, 1).reshape(L, -1)
        values = flat.transpose(0, 1).reshape(L, -1)
        mask, top = tdist.global_top(values, gidx, self.k * n * token_ranks, d)
        with torch.no_grad():
            smallest = top.masked_fill(top <= 0, float("inf")).min(-1).values
            smallest = torch.where(torch.isfinite(smallest), smallest, torch.zeros_like(smallest))
        self.update_threshold(coder, smallest)
        mask = mask.reshape(L, n, s).transpose(0, 1).reshape(h.shape)
        return torch.where(mask, h.relu(), torch.zeros_like(h))

    @staticmethod
    @torch.no_grad()
    def update_threshold(coder: Coder, smallest: Tensor) -> None:
        """The running mean of a training batch's smallest kept activation, per layer (the first batch
        sets it). Both are computed and the device picks one: asking whether this is the first batch
        would make the host wait for a GPU every step."""
        new = smallest.to(coder.threshold)[:, None].expand_as(coder.threshold)
        mean = coder.threshold * (1 - BATCHTOPK_MOMENTUM) + BATCHTOPK_MOMENTUM * new
        coder.threshold.copy_(torch.where((coder.threshold == 0).all(), new, mean))


class MatryoshkaBatchTopK(BatchTopK):
    """BatchTopK whose nested prefixes of the features each reconstruct the target too (Bussmann et al.
    2025, "Learning Multi-Level Features with Matryoshka Sparse Autoencoders"; sae_lens's
    `matryoshka_batchtopk`): for every width `w` of `cfg.matryoshka_widths` (below `d_sae`), the
    reconstruction from features `[0, w)` of each layer alone adds its MSE to the loss, weight 1.
    Its activation, threshold, AuxK and everything after training are BatchTopK's."""

    name = "matryoshka_batchtopk"
    nested = True
    label = "Matryoshka BatchTopK"

    def __init__(self, cfg):
        super().__init__(cfg)
        self.widths = tuple(cfg.matryoshka_widths)

    def nested_loss(self, coder, acts, out, y, d, pre_acts=None):
        """`sum_w mse(out - decoded(features >= w), y)`: the whole reconstruction less the outer
        features' part (b_dec and any skip stay, as in `out`); feature-sharded, the outer part is
        summed over ranks, the global feature index deciding inner or outer."""
        s = acts.shape[-1]
        index = torch.arange(s, device=acts.device) + (d.rank * s if d.shards_features else 0)  # global
        total = None
        for w in self.widths:
            outer = coder.decode(torch.where(index >= w, acts, torch.zeros_like(acts))) - coder.b_dec
            if d.shards_features:
                outer = tdist.reduce_sum(outer)
            term = losses.mse_loss(out - outer, y)
            total = term if total is None else total + term
        return total


class GateParams(NamedTuple):
    """A gated set's per-layer parameters besides `W_enc` (one layer's rows, or all layers')."""

    b_gate: Tensor
    """The gate's bias: the set's `b_enc` (sae_lens `b_gate`)."""
    r_mag: Tensor
    """Log-scale of the magnitude path's encoder: `W_mag = W_enc * exp(r_mag)`."""
    b_mag: Tensor
    """The magnitude path's bias."""


class Gated(Nonlinearity):
    """Gated SAE (Rajamanoharan et al. 2024, "Improving Dictionary Learning with Gated Sparse
    Autoencoders", eqs. 6-8; sae_lens `GatedTrainingSAE`): the gate `pi_gate = x @ W_enc + b_enc > 0`
    decides which features fire, the magnitude path `pi_mag = x @ (W_enc * exp(r_mag)) + b_mag` how
    much: `a = 1[pi_gate > 0] * ReLU(pi_mag)`.

    The set's pre-activations are `pi_mag` (what attribution reads: with the gate frozen, an active
    feature is linear in it); the gate is recovered from them exactly in the reals,
    `pi_gate = (pi_mag - b_mag) * exp(-r_mag) + b_gate`. Losses: the L1 of `ReLU(pi_gate)` weighted by
    decoder norms (its gradient trains the gate), and the auxiliary reconstruction of the target from
    `ReLU(pi_gate)` through the decoder and `b_dec` (eq. 8; the decoder learns from it, as in sae_lens:
    `nested_loss` says why), weighted 1 like the MSE.
    """

    name = "gated"
    label = "gated"
    extra_state = ("r_mag", "b_mag")
    sae_lens = SaeLens("gated", b_enc="b_gate")
    """sae_lens has gated SAEs only; circuit-tracer's and GemmaScope's files have no magnitude path."""

    @classmethod
    def fold_input_offset(cls, state, offset):
        """The gate's bias as step 13's, and the magnitude path's `b_mag - (offset @ W_enc) * exp(r_mag)`."""
        shift = offset @ state["W_enc"]
        return state | {
            "b_enc": state["b_enc"] - shift,
            "b_mag": state["b_mag"] - shift * state["r_mag"].exp(),
        }

    def make_params(self, n_layers, d_sae):
        return {name: nn.Parameter(torch.zeros(n_layers, d_sae)) for name in ("r_mag", "b_mag")}

    def feature_dims(self):
        return {"r_mag": 1, "b_mag": 1}

    def layer_params(self, coder, layer):
        at = slice(None) if layer is None else layer
        return GateParams(coder.b_enc[at], coder.r_mag[at], coder.b_mag[at])

    def encoder(self, coder, layer):
        at = slice(None) if layer is None else layer
        return coder.W_enc[at] * coder.r_mag[at].exp().unsqueeze(-2), coder.b_mag[at]

    @staticmethod
    def gate_pre(h: Tensor, p: GateParams) -> Tensor:
        """`pi_gate` from the magnitude pre-activations `h`."""
        return (h - p.b_mag) * (-p.r_mag).exp() + p.b_gate

    def __call__(self, h, p):
        with torch.no_grad():  # the gate is a step: no gradient (the L1 and auxiliary losses train it)
            gate = (self.gate_pre(h, p) > 0).to(h.dtype)
        return gate * h.relu()

    def onset(self, h, p, feature):
        """Active iff `pi_mag > 0` and `pi_gate > 0`, i.e. `pi_mag > b_mag - b_gate * exp(r_mag)`."""
        gate = p.b_mag[feature] - p.b_gate[feature] * p.r_mag[feature].exp()
        return max(0.0, float(gate.detach()))

    def sparsity(self, acts, pre_acts, p, decoder_norms, penalty):
        return losses.l1_sparsity(self.gate_pre(pre_acts, p).relu(), decoder_norms)

    def nested_loss(self, coder, acts, out, y, d, pre_acts=None):
        """Eq. 8's auxiliary term as sae_lens trains it: `mse(decode(ReLU(pi_gate)), y)`, the decoder
        learning from it too (feature-sharded: summed over ranks).

        The paper stops its gradient into the decoder, whose columns it keeps at unit norm. With the
        L1 weighted by decoder norms instead (sae_lens, and this trainer), a frozen decoder in this
        term leaves nothing to resist the penalty shrinking the decoder: on the bundled model's layer
        1 (400 steps of 512 tokens, lambda ramped to 3e-2) the decoder norms fell from 0.1 to 0.008
        and the set ended at L0 219 and FVU 0.23; trained by this term they grew to 0.5, L0 27, FVU 0.05."""
        via_gate = self.gate_pre(pre_acts, self.layer_params(coder, None)).relu()
        recon = coder.decode(via_gate)
        if d.shards_features:
            recon = tdist.reduce_sum(recon - coder.b_dec) + coder.b_dec
        return losses.mse_loss(recon, y)


NONLINEARITIES: dict[str, type[Nonlinearity]] = {
    cls.name: cls for cls in (ReLU, JumpReLU, TopK, BatchTopK, MatryoshkaBatchTopK, Gated)
}


def sae_lens_architectures() -> dict[str, tuple[type[Nonlinearity], str]]:
    """Step 13: `{architecture: (nonlinearity, role)}` for every sae_lens architecture a nonlinearity
    reads (role: "sae", "transcoder" or "skip_transcoder")."""
    return {
        arch: (cls, role)
        for cls in NONLINEARITIES.values()
        for role, arch in cls.sae_lens.architectures().items()
    }


def sparsify_activations() -> dict[str, type[Nonlinearity]]:
    """Step 13: `{sparsify activation name: the nonlinearity that reads it}`."""
    return {cls.sparsify: cls for cls in NONLINEARITIES.values() if cls.sparsify is not None}


def stored_with(extra_state: Iterable[str], held: Callable[[type[Nonlinearity]], bool]) -> type[Nonlinearity]:
    """Step 13: the nonlinearity a foreign file holds: of those its format holds (`held(cls)`), the one
    whose `extra_state` the file has (circuit-tracer with a threshold: JumpReLU; without: ReLU)."""
    (cls,) = [c for c in NONLINEARITIES.values() if held(c) and set(c.extra_state) == set(extra_state)]
    return cls

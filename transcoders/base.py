"""What every transcoder set shares: the encoder, the nonlinearity, the skip, the output.

For a set covering `n_layers` layers, on the read-site activations `x[l]`:

1. `h[l] = x[l] @ W_enc[l] + b_enc[l]`                          (encode: pre-activations)
   (a gated set: its magnitude path `x[l] @ (W_enc[l] * exp(r_mag[l])) + b_mag[l]`, the nonlinearity's
   `encoder`; `b_enc` is then the gate's bias)
2. `a[l] = act(h[l])`  (ReLU, JumpReLU with `threshold[l]`, TopK, BatchTopK, Gated) (nonlinearity.py)
3. `y[l] = decode(a)[l] + x[l] @ W_skip[l]`                     (decode: per class; skip optional)

`decode` differs by class: an SAE / per-layer transcoder writes layer l from layer l's
features only; a cross-layer transcoder writes layer l from every source layer <= l
(seed: circuit-tracing appendix; linear-computation-graphs section 2, eqs. 1 and 3).

Initialization follows the appendix ("ML details"): encoder ~ U(+-1/sqrt(n_features)),
decoder ~ U(+-1/sqrt(n_out_layers * d_model)), biases zero, JumpReLU thresholds 0.03.

BatchTopK trains with the batch rule in training mode (`.train()`) and updates its inference
threshold, a buffer, as a running mean (momentum nonlinearity.py `BATCHTOPK_MOMENTUM`) of the smallest kept
activation; in eval mode (what `load_transcoders` returns) it applies the threshold per token.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor, nn

from transcoders import distributed as tdist
from transcoders.config import TranscoderConfig
from transcoders.losses import mse_loss, preact_loss
from transcoders.nonlinearity import NONLINEARITIES, THRESHOLD_INIT, Penalty

ONE_PROCESS = tdist.Dist()


class TranscoderOutput(NamedTuple):
    """What `forward` returns."""

    pre_acts: Float[Tensor, "... n_layers d_sae"]
    """Encoder pre-activations `x @ W_enc + b_enc`."""
    acts: Float[Tensor, "... n_layers d_sae"]
    """Feature activations after the nonlinearity."""
    out: Float[Tensor, "... n_layers d_model"]
    """Reconstruction at the write site: decoder output, `b_dec` and the skip term."""


class LossWeights(NamedTuple):
    """How a training step weighs the coder's loss terms besides the MSE (TrainConfig's options)."""

    penalty: Penalty = Penalty()
    """The sparsity penalty's form (its lambda ramps with the step: `train_forward`'s `lam`)."""
    preact_coef: float = 0.0
    """Weight of the pre-activation loss (0: off)."""
    preact_form: str = "appendix"
    """Its form, losses.py `preact_loss`."""
    auxk_coef: float = 0.0
    """Weight of the nonlinearity's auxiliary loss (AuxK; 0: off, and dead features need not be tracked)."""


class StepOutput(NamedTuple):
    """What a training step's forward returns (`SparseCoder.train_forward`, sparse_topk.py)."""

    out: Float[Tensor, "batch n_layers d_model"]
    """The whole set's reconstruction of the normalized target."""
    loss: Tensor
    """The loss the step minimizes: MSE and every weighted term."""
    mse: Tensor
    """Its reconstruction term (losses.py step 1)."""
    fired: Bool[Tensor, "n_layers d_sae"]
    """This rank's features active for some token of the batch."""
    l0: Tensor
    """Active features (of this rank) per token and layer, averaged."""


class SparseCoder(nn.Module):
    """Base of `SAE`, `PerLayerTranscoder` and `CrossLayerTranscoder`; subclasses give the decoder."""

    cfg: TranscoderConfig
    kind: str = ""

    def __init__(self, cfg: TranscoderConfig):
        super().__init__()
        if self.kind and cfg.kind != self.kind:
            raise ValueError(f"{type(self).__name__} needs cfg.kind={self.kind!r}, got {cfg.kind!r}")
        self.cfg = cfg
        self._feature_dims: dict[str, int | None] = {}
        L, D, S = cfg.n_layers, cfg.d_model, cfg.d_sae
        self.W_enc = nn.Parameter(torch.zeros(L, D, S))
        self.b_enc = nn.Parameter(torch.zeros(L, S))
        self.b_dec = nn.Parameter(torch.zeros(L, D))
        self.declare_features(W_enc=2, b_enc=1, b_dec=None)
        self.nonlinearity = NONLINEARITIES[cfg.activation](cfg)
        threshold = self.nonlinearity.make_threshold(L, S)
        if isinstance(threshold, nn.Parameter) or threshold is None:
            self.threshold = threshold
        else:  # estimated, not trained (BatchTopK): a buffer
            self.register_buffer("threshold", threshold)
        for name, param in self.nonlinearity.make_params(L, S).items():
            self.register_parameter(name, param)
        self.declare_features(**self.nonlinearity.feature_dims())
        self.W_skip = nn.Parameter(torch.zeros(L, D, D)) if cfg.skip else None
        self.declare_features(W_skip=None)

    # --------------------------------------------------------------- properties
    @property
    def n_layers(self) -> int:
        return self.cfg.n_layers

    @property
    def d_model(self) -> int:
        return self.cfg.d_model

    @property
    def d_sae(self) -> int:
        return self.cfg.d_sae

    @property
    def device(self) -> torch.device:
        return self.b_enc.device

    @property
    def per_token(self) -> bool:
        """Whether each token's features depend on that token alone; False for BatchTopK in training
        mode, whose batch rule couples the tokens of a batch (call `.eval()` for its threshold)."""
        return not (self.training and self.nonlinearity.batch_rule_in_training)

    @property
    def dtype(self) -> torch.dtype:
        return self.b_enc.dtype

    # --------------------------------------------------------------- feature axes, for sharding
    def declare_features(self, **dims: int | None) -> None:
        """Declare, where a tensor is created, which of its axes indexes features (None: it has none,
        and a feature-sharded run replicates it). A name may be declared before its tensor exists
        (JumpReLU's log-threshold, present only while it trains)."""
        self._feature_dims.update(dims)

    def feature_dims(self) -> dict[str, int | None]:
        """The declared feature axis of every tensor name of this set (its state dict's and more)."""
        return dict(self._feature_dims)

    def feature_dim(self, name: str) -> int | None:
        """The feature axis of tensor `name` (a state-dict key); `UndeclaredFeatureAxisError` for a
        name nobody declared, so that sharding never copies an unknown tensor to every rank."""
        return tdist.feature_dim(name, self._feature_dims)

    # --------------------------------------------------------------- init
    n_features_init: int
    n_out_init: int

    one_decoder_per_layer: bool = False
    """Layer l's features write layer l alone through `W_dec[l]` [d_sae, d_model] (PLT, SAE)."""
    decoder_feature_axis: int
    """The feature axis of every tensor of `decoder_weights()` (`W_enc`'s is 2)."""

    @torch.no_grad()
    def init_weights(
        self, generator: torch.Generator | None = None, shard: tuple[int, int] = (0, 1)
    ) -> SparseCoder:
        """Initialize as the appendix gives; returns self.

        `shard=(r, n)`: this set is slice r of n equal feature slices of a set n times as wide
        (feature-sharded training), and gets exactly that set's initialization of its slice
        (`uniform_slice`: the wide set's random stream drawn in chunks, the other slices' values
        dropped), without ever holding the wide set.
        """
        rank, world = shard

        def uniform_(p: Tensor, bound: float, axis: int):
            draw = uniform_slice(p.shape, axis, rank, world, generator)
            p.copy_((draw * 2 - 1).mul_(bound).to(p))

        uniform_(self.W_enc, (self.n_features_init * world) ** -0.5, 2)
        for W in self.decoder_weights():
            uniform_(W, (self.n_out_init * self.d_model) ** -0.5, self.decoder_feature_axis)
        self.b_enc.zero_()
        self.b_dec.zero_()
        if self.threshold is not None:
            self.threshold.fill_(THRESHOLD_INIT if self.nonlinearity.trained_threshold else 0.0)
        if self.W_skip is not None:
            self.W_skip.zero_()
        for name in self.nonlinearity.make_params(1, 1):
            getattr(self, name).zero_()
        return self

    # --------------------------------------------------------------- the map
    def encode(self, x: Float[Tensor, "... n_layers d_model"]) -> Float[Tensor, "... n_layers d_sae"]:
        """Pre-activations `x @ W_enc + b_enc`, per layer (the nonlinearity's `encoder`: a gated set's
        magnitude path)."""
        W, b = self.nonlinearity.encoder(self, None)
        return torch.einsum("...ld,lds->...ls", x, W) + b

    def activation(
        self, pre_acts: Float[Tensor, "... n_layers d_sae"]
    ) -> Float[Tensor, "... n_layers d_sae"]:
        """The feature nonlinearity of `cfg.activation` (BatchTopK in training mode: the batch rule,
        and the running threshold is updated)."""
        return self.nonlinearity.train_call(self, pre_acts)

    def encode_layer(self, x: Float[Tensor, "... d_model"], layer: int) -> Float[Tensor, "... d_sae"]:
        """Step 1 for one layer: `x . v_f + b_enc[layer, f]` for every feature's encoder vector `v_f`."""
        return x @ self.encoder_vectors(layer).T + self.encoder_bias(layer)

    def encoder_bias(self, layer: int) -> Float[Tensor, " d_sae"]:
        """The bias of `layer`'s pre-activations, `b_enc[layer]` (a gated set: its magnitude bias)."""
        return self.nonlinearity.encoder(self, layer)[1]

    def activate_layer(self, pre_acts: Float[Tensor, "... d_sae"], layer: int) -> Float[Tensor, "... d_sae"]:
        """Step 2 for one layer, the per-token rule (BatchTopK: its estimated threshold)."""
        return self.nonlinearity(pre_acts, self.nonlinearity.layer_params(self, layer))

    def onset_layer(self, pre_acts: Float[Tensor, " d_sae"], layer: int, feature: int) -> float:
        """The pre-activation above which `feature` of `layer` is active, on one token's `pre_acts`
        of that layer (the others fixed): 0 for ReLU, the threshold, or TopK's k-th largest."""
        return self.nonlinearity.onset(pre_acts, self.nonlinearity.layer_params(self, layer), feature)

    def decode_layer(self, acts: list[Tensor | None], layer: int) -> Float[Tensor, "... d_model"]:
        """Step 3 for one output layer, from per-layer activations `acts[l]` [..., d_sae] (None: all
        zero): `b_dec[layer]` plus every source layer's decoder into `layer` (no skip)."""
        out = self.b_dec[layer]
        for source, W in self.decoders_into(layer):
            if acts[source] is not None:
                out = out + acts[source] @ W
        return out

    def decoders_into(self, layer: int) -> list[tuple[int, Float[Tensor, "d_sae d_model"]]]:
        """`(source layer, W [d_sae, d_model])` for every decoder writing `layer`."""
        raise NotImplementedError

    def decode(self, acts: Float[Tensor, "... n_layers d_sae"]) -> Float[Tensor, "... n_layers d_model"]:
        raise NotImplementedError

    def skip(self, x: Float[Tensor, "... n_layers d_model"]) -> Float[Tensor, "... n_layers d_model"]:
        """`x[l] @ W_skip[l]`, or zeros when the set has no skip."""
        if self.W_skip is None:
            return torch.zeros_like(x)
        return torch.einsum("...ld,lde->...le", x, self.W_skip)

    def forward(self, x: Float[Tensor, "... n_layers d_model"]) -> TranscoderOutput:
        """Encode, nonlinearity, decode, skip."""
        pre_acts = self.encode(x)
        acts = self.activation(pre_acts)
        out = self.decode(acts)
        if self.W_skip is not None:
            out = out + self.skip(x)
        return TranscoderOutput(pre_acts, acts, out)

    def rank_forward(self, x: Float[Tensor, "... n_layers d_model"], d: tdist.Dist) -> TranscoderOutput:
        """`forward` on a rank of a distributed run `d` (distributed.py): this rank's pre-activations and
        activations (its nonlinearity over the ranks, nonlinearity.py step 8) and the whole set's
        reconstruction (feature-sharded: the partial decodes summed over ranks, differentiably)."""
        if not d.active:
            return self(x)  # through __call__: module hooks see the set's forward
        pre_acts = self.encode(x)
        acts = self.nonlinearity.spread_train_call(self, pre_acts, d)
        out = self.decode(acts)
        if d.shards_features:
            out = tdist.reduce_sum(out - self.b_dec) + self.b_dec
        if self.W_skip is not None:
            out = out + self.skip(x)
        return TranscoderOutput(pre_acts, acts, out)

    def train_forward(
        self,
        x: Float[Tensor, "batch n_layers d_model"],
        y: Float[Tensor, "batch n_layers d_model"],
        weights: LossWeights,
        lam: float,
        dead: Bool[Tensor, "n_layers d_sae"] | None = None,
        d: tdist.Dist = ONE_PROCESS,
    ) -> StepOutput:
        """A training step's forward and its loss, on normalized `x` -> `y` (losses.py):
        `mse + lam * sparsity [+ preact_coef * pre-activation loss] [+ auxk_coef * auxiliary loss]`, the
        sparsity penalty and the auxiliary loss (AuxK of TopK / BatchTopK) as the nonlinearity gives
        them, `dead` the features that count as dead. The same on one process and on every rank of `d`
        (each rank's sparsity and pre-activation terms on its own features: their gradients are the
        whole terms')."""
        res = self.rank_forward(x, d)
        mse = mse_loss(res.out, y)
        decoder_norms = self.decoder_norms()
        penalty = self.nonlinearity.sparsity(
            res.acts, res.pre_acts, self.nonlinearity.layer_params(self, None), decoder_norms, weights.penalty
        )
        loss = mse + lam * penalty
        nested = self.nonlinearity.nested_loss(self, res.acts, res.out, y, d, res.pre_acts)
        if nested is not None:  # Matryoshka's nested prefixes, Gated's auxiliary: weighted as the MSE
            loss = loss + nested
        if weights.preact_coef:
            form = (weights.preact_form, self.threshold, decoder_norms, dead)
            loss = loss + weights.preact_coef * preact_loss(res.pre_acts, *form)
        if weights.auxk_coef and self.nonlinearity.needs_dead:
            loss = (
                loss
                + self.nonlinearity.aux_loss(self, res.pre_acts, y - res.out, dead, d) * weights.auxk_coef
            )
        active = res.acts > 0
        return StepOutput(res.out, loss, mse, active.any(0), active.float().sum(-1).mean())

    # --------------------------------------------------------------- vectors for attribution
    def encoder_vectors(
        self, layer: int, features: Int[Tensor, " n"] | None = None
    ) -> Float[Tensor, "n d_model"]:
        """The vectors `v_f` that features of `layer` read, `h_f = x . v_f + b_enc[layer, f]` (all of the
        layer's features when `features` is None): here columns of `W_enc[layer]`.

        Attribution and analysis ask for these and never read `W_enc`, so that a set whose encoder
        is stored otherwise (e.g. as directions and gains) overrides this and `encode` alone."""
        W = self.nonlinearity.encoder(self, layer)[0]
        return (W if features is None else W[:, features]).T

    def decoder_vectors(self, layer: int, features: Int[Tensor, " n"]) -> Float[Tensor, "n n_out d_model"]:
        raise NotImplementedError

    def decoder_weights(self) -> list[Tensor]:
        """The decoder parameters, for init and optimizer bookkeeping."""
        raise NotImplementedError

    def decoder_norms(self) -> Float[Tensor, "n_layers d_sae"]:
        """Norm of each feature's whole decoder (concatenated over the layers it writes)."""
        raise NotImplementedError

    # --------------------------------------------------------------- normalization folding
    @torch.no_grad()
    def fold_scales(self, s_in: Float[Tensor, " n_layers"], s_out: Float[Tensor, " n_layers"]) -> None:
        """Make a set trained on `x / s_in[l]` -> `y / s_out[l]` act on raw `x` -> raw `y`.

        `h = (x / s_in) @ W_enc + b_enc`, so `W_enc /= s_in` leaves pre-activations (and hence
        thresholds) unchanged; every decoder vector and `b_dec` writing layer l is scaled by
        `s_out[l]`; `W_skip[l] *= s_out[l] / s_in[l]`.
        """
        s_in = s_in.to(self.W_enc)
        s_out = s_out.to(self.W_enc)
        self.W_enc.div_(s_in[:, None, None])
        self.b_dec.mul_(s_out[:, None])
        if self.W_skip is not None:
            self.W_skip.mul_((s_out / s_in)[:, None, None])
        self._scale_decoder(s_out)

    def _scale_decoder(self, s_out: Tensor) -> None:
        raise NotImplementedError

    def extra_repr(self) -> str:
        c = self.cfg
        return f"n_layers={c.n_layers}, d_model={c.d_model}, d_sae={c.d_sae}, activation={c.activation}, skip={c.skip}"


RAND_CHUNK = 1 << 20
"""Values `uniform_slice` draws at a time."""


def uniform_slice(
    shape: tuple[int, ...], axis: int, rank: int, world: int, generator: torch.Generator | None = None
) -> Float[Tensor, "..."]:
    """Slice `rank` of `world` equal slices along `axis` of `torch.rand(full, generator=generator)`,
    `full` being `shape` with `shape[axis] * world` at `axis`; the generator ends where that draw
    would leave it.

    CPU `torch.rand` draws float32 values one after another from the generator's stream (the same
    values whatever the split into calls, tests/transcoders/test_shard_memory.py), so the full
    draw is walked in C order in chunks of at most `RAND_CHUNK` values, keeping this slice's.
    """
    shape = tuple(shape)
    outer, local = math.prod(shape[:axis]), math.prod(shape[axis:])
    out = torch.empty(outer, local)

    def draw(n: int, into: Tensor | None = None) -> None:
        for start in range(0, n, RAND_CHUNK):
            values = torch.rand(min(RAND_CHUNK, n - start), generator=generator)
            if into is not None:
                into[start : start + values.numel()] = values

    for row in out:
        draw(rank * local)
        draw(local, row)
        draw((world - rank - 1) * local)
    return out.reshape(shape)

"""Global (virtual) weights between transcoder features, independent of any prompt.

Seed: circuit-tracing appendix, "Interference Weights over More Features" (virtual weights of a
feature's input and output connections), "Number Output Weights for Select Features" (a feature's
output weights over the vocabulary) and "Residual Stream Norms Growth" (why the normalization
between two features matters); DESIGN.md "Global weights".

The residual stream is a sum of writes, read through a norm. With the norm's denominator frozen,
every read is linear, so the weight of the residual path from a source feature s to a target t is

1. Writes of s (vectors added to the residual stream, in stream order):
   an MLP-set feature of layer l writes `W_dec^{l'}` at the MLP output of every layer it decodes to
   (PLT: l' = l; CLT: every l' >= l), through a post-MLP norm (Gemma-2 `ln2_post`, when the set
   writes before it) as `w_post * P(W_dec^{l'}) / s_post`; an attention-set feature writes
   `W_dec` at `hook_attn_out` of its layer (after any post-attention norm).
2. Reads of t (a vector `u_t` with `pre_t = u_t . resid + const`):
   an MLP feature of layer l reads `ln2(resid_mid)` (`ln2(resid_pre)` on a parallel block, which
   its own layer's attention does not reach): `u_t = P(w_ln2 * v_t) / s_ln2`, `v_t` the set's
   encoder vector of t (`encoder_vectors`: `W_enc[:, t]` for our sets);
   an attention feature of layer l reads the attention output, which reads `ln1(resid_pre)` through
   each head's OV circuit: `u_t = sum_h P(w_ln1 * W_V^h W_O^h P(w_post * v_t) / s_post) / s_ln1`
   (every head attending to the source's position with pattern 1, which is what position 0 sees;
   elsewhere head h's term is scaled by its pattern `A_h[q, k]`); a logit reads
   `ln_final(resid_final)`: `u_tok = P(w_f * W_U[:, tok]) / s_f`. `P` centers (LayerNorm only).
3. `V[s, t] = sum over writes of s before t's read of  write . u_t`  -- for a CLT, the decoders
   into every layer between add up (DESIGN.md). Attention paths between different positions, the
   transcoders' skip and the MLPs' own nonlinearity are not part of the residual path.
4. Normalization ("Residual Stream Norms Growth"): the residual norm grows over the layers, so a raw
   `W_dec . W_enc` overstates early-to-early and understates late connections. `scales` fixes each
   norm's denominator `s` (TransformerLens `*.hook_scale`): `norm_scales_at(state, p)` takes them
   from one prompt position (then `a_s * V[s, t]` is exactly the graph's edge when the residual
   stream is the only path: same position, attention outputs replaced, no skip), and
   `mean_norm_scales` from a corpus (`1 / mean(1 / s)`, so a weight is the expected effect per
   unit of source activation). Without `scales` every `s` is 1: the raw weights.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from attrgraph.bundled.loading import check_model
from attrgraph.engine.sets import TranscoderSets, transcoder_sets
from attrgraph.errors import OptionError
from transcoders import sites
from transcoders.arguments import shown
from transcoders.block_layout import RESID_MID, BlockLayout, is_residual_norm_scale
from transcoders.config import is_whole
from transcoders.model_state import check_no_hooks

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

SITES = ("attn", "mlp")
"""Feature sites in their order within a layer (attention runs before the MLP)."""


@dataclass(frozen=True)
class Connections:
    """One feature's virtual weights to (output) or from (input) other features, one entry per
    feature the residual path reaches (`V[s, t]` of the module docstring, step 3)."""

    site: np.ndarray
    """"attn" or "mlp" of each connected feature."""
    layer: np.ndarray
    """Layer of each connected feature."""
    feature: np.ndarray
    """Index of each connected feature in its set and layer."""
    weight: np.ndarray
    """The virtual weight (float64)."""

    def __len__(self) -> int:
        return len(self.weight)

    def top(self, k: int, sign: str = "abs") -> Connections:
        """The `k` strongest connections, by `|weight|` (sign="abs"), largest ("pos") or most negative ("neg")."""
        if k < 0:
            raise OptionError(f"k is {k}; pass k >= 0.")
        key = {"abs": -np.abs(self.weight), "pos": -self.weight, "neg": self.weight}.get(sign)
        if key is None:
            raise OptionError(f"sign is {sign!r}; pass 'abs', 'pos' or 'neg'.")
        order = np.argsort(key, kind="stable")[:k]
        return Connections(self.site[order], self.layer[order], self.feature[order], self.weight[order])

    def to_records(self) -> list[dict]:
        """Plain dicts (JSON-able), in this order."""
        return [
            dict(site=str(s), layer=int(l), feature=int(f), weight=float(w))
            for s, l, f, w in zip(self.site, self.layer, self.feature, self.weight)
        ]


def _is_layernorm(norm) -> bool:
    return type(norm).__name__.startswith("LayerNorm")


def _norm_T(norm, u: Tensor, scale: float) -> Tensor:
    """Transpose of a frozen norm's linear part `x -> w * P(x) / s` applied to read vectors `u` [..., d]."""
    w = getattr(norm, "w", None)
    if w is not None:
        u = u * w.detach().to(u)
    if _is_layernorm(norm):
        u = u - u.mean(-1, keepdim=True)
    return u / scale


def _norm(norm, v: Tensor, scale: float) -> Tensor:
    """A frozen norm's linear part `x -> w * P(x) / s` on write vectors `v` [..., d] (bias dropped)."""
    if _is_layernorm(norm):
        v = v - v.mean(-1, keepdim=True)
    v = v / scale
    w = getattr(norm, "w", None)
    return v if w is None else v * w.detach().to(v)


@torch.no_grad()
def norm_scales_at(state, position: int) -> dict[str, float]:
    """Every norm denominator (`*.hook_scale`) a `ReplacementState` recorded, at one position."""
    return {
        name: float(value[0, position].reshape(-1)[0])
        for name, value in state.frozen.items()
        if is_residual_norm_scale(name) and value.dim() >= 2
    }


@torch.no_grad()
def mean_norm_scales(
    model: HookedTransformer, batches: Iterable[Tensor], skip_first: int = 1
) -> dict[str, float]:
    """Typical norm denominators over a corpus: `1 / mean(1 / s)` per `*.hook_scale`, over every
    position from `skip_first` on (position 0, the BOS, has an outsized residual norm)."""
    check_no_hooks(model, "change the norm scales read from the corpus")
    sums: dict[str, float] = {}
    count = 0
    for tokens in batches:
        tokens = torch.as_tensor(tokens, device=model.cfg.device)
        tokens = tokens[None] if tokens.dim() == 1 else tokens
        _, cache = model.run_with_cache(tokens, names_filter=is_residual_norm_scale, return_type=None)
        for name, s in cache.items():
            s = s[:, skip_first:].reshape(tokens.shape[0], -1, s.shape[-1])[..., 0].double()
            sums[name] = sums.get(name, 0.0) + float((1.0 / s).sum())
        count += tokens.shape[0] * max(tokens.shape[1] - skip_first, 0)
    if count == 0:
        raise OptionError("the corpus gave no positions to average norm scales over; pass longer sequences.")
    return {name: count / v for name, v in sums.items()}


class GlobalWeights:
    """The read and write vectors of every feature of a model's sets (module docstring), built once;
    `input_weights`, `output_weights`, `vocab_weights` and `virtual_weight` read them.

    `transcoders` is an MLP set, `[mlp_set, attn_set]` or `TranscoderSets`; `scales` maps
    `*.hook_scale` names to a fixed denominator (missing names: 1; step 4)."""

    def __init__(self, model: HookedTransformer, transcoders, scales: dict[str, float] | None = None):
        check_model(model)
        if scales is not None and not isinstance(scales, Mapping):
            raise OptionError(
                f"scales is a {type(scales).__name__} ({shown(scales)}); pass a dict from hook_scale names to "
                "denominators (mean_norm_scales), or None."
            )
        sets = transcoders if isinstance(transcoders, TranscoderSets) else transcoder_sets(model, transcoders)
        self.model, self.sets, self.scales = model, sets, dict(scales or {})
        self.mlp, self.attn = sets.mlp, sets.attn
        cfg = self.mlp.cfg
        if cfg.input_hook not in (sites.MLP_INPUT, RESID_MID):
            raise OptionError(
                f"global weights need MLP transcoders that read the residual stream before the MLP "
                f"({sites.MLP_INPUT!r} or {RESID_MID!r}), not {cfg.input_hook!r}."
            )
        if cfg.output_hook != sites.MLP_OUTPUT:
            raise OptionError(f"global weights need MLP transcoders writing {sites.MLP_OUTPUT!r}.")
        self.n_layers = model.cfg.n_layers
        self.layout = BlockLayout.of(model.cfg)
        self.dtype = torch.float64
        self._cache: dict = {}
        with torch.no_grad():
            self.reads = {("mlp", l): self._mlp_reads(l) for l in range(self.n_layers)}
            if self.attn is not None:
                self.reads.update({("attn", l): self._attn_reads(l) for l in range(self.n_layers)})

    # ------------------------------------------------------------------ step 2: reads
    def _scale(self, name: str) -> float:
        return float(self.scales.get(name, 1.0))

    def _mlp_reads(self, layer: int) -> Float[Tensor, "d_model d_sae"]:
        enc = self.mlp.encoder_vectors(layer).detach().to(self.dtype)  # [S, d]
        if self.mlp.cfg.input_hook == sites.MLP_INPUT:
            name = self.layout.norm_scale("ln2", layer)
            enc = _norm_T(self.model.blocks[layer].ln2, enc, self._scale(name))
        return enc.T.contiguous()

    def _attn_reads(self, layer: int) -> Float[Tensor, "d_model d_attn"]:
        block = self.model.blocks[layer]
        e = self.attn.encoder_vectors(layer).detach().to(self.dtype)  # [S, d] at hook_attn_out
        post = getattr(block, "ln1_post", None)
        if post is not None:
            e = _norm_T(post, e, self._scale(self.layout.norm_scale("ln1_post", layer)))
        W_V = block.attn.W_V.detach().to(self.dtype)  # [H, d, dh] (GQA: repeated per query head)
        W_O = block.attn.W_O.detach().to(self.dtype)  # [H, dh, d]
        ov = torch.einsum("hmk,hkd->md", W_V, W_O)  # sum over heads of W_V^h W_O^h
        u = e @ ov.T  # [S, d]
        u = _norm_T(block.ln1, u, self._scale(self.layout.norm_scale("ln1", layer)))
        return u.T.contiguous()

    def logit_reads(self) -> Float[Tensor, "d_model d_vocab"]:
        """Read vectors of the logits (step 2), columns by token."""
        W_U = self.model.W_U.detach().to(self.dtype).T  # [V, d]
        ln = getattr(self.model, "ln_final", None)
        if ln is not None:
            W_U = _norm_T(ln, W_U, self._scale(self.layout.norm_scale("ln_final")))
        return W_U.T.contiguous()

    # ------------------------------------------------------------------ step 1: writes
    def writes(self, site: str, layer: int, features: Tensor) -> list[tuple[int, Tensor]]:
        """The residual writes of features (site, layer): (stream slot, vectors [n, d]) in stream
        order; slot `2 l` is layer l's attention output, `2 l + 1` its MLP output."""
        self._check(site, layer)
        features = torch.as_tensor(features, device=self.mlp.device).reshape(-1)
        with torch.no_grad():
            if site == "attn":
                return [(2 * layer, self.attn.W_dec[layer][features].detach().to(self.dtype))]
            dec = self.mlp.decoder_vectors(layer, features).detach().to(self.dtype)  # [n, n_out, d]
            out = []
            for j in range(dec.shape[1]):
                l = layer + j
                v = dec[:, j]
                if sites.raw_output_needed(self.model, self.mlp.cfg, l):
                    v = _norm(
                        sites.post_norm(self.model, l), v, self._scale(self.layout.norm_scale("ln2_post", l))
                    )
                out.append((2 * l + 1, v))
            return out

    def read_slot(self, site: str, layer: int) -> int:
        """Writes at slots below this reach the read of (site, layer); logits read slot 2 n_layers.
        On a parallel block the MLP reads resid_pre, as attention does: not its layer's attention."""
        return 2 * layer + (1 if site == "mlp" and not self.layout.parallel else 0)

    def _check(self, site: str, layer: int, feature: int | None = None) -> None:
        if site not in SITES:
            raise OptionError(f"site is {site!r}; pass 'mlp' or 'attn'.")
        if site == "attn" and self.attn is None:
            raise OptionError("site 'attn' needs an attention set; pass [mlp_set, attn_set].")
        if not 0 <= layer < self.n_layers:
            raise OptionError(f"layer is {layer}; pass a layer in [0, {self.n_layers}).")
        width = (self.attn if site == "attn" else self.mlp).cfg.d_sae
        if feature is not None and not 0 <= feature < width:
            raise OptionError(f"feature is {feature}; the {site} set has {width} features per layer.")

    # ------------------------------------------------------------------ step 3
    def _summed_write(self, writes, slot: int) -> Tensor | None:
        parts = [v for s, v in writes if s < slot]
        return None if not parts else torch.stack(parts).sum(0)

    def _all_writes(self, site: str, layer: int, slot: int) -> Tensor:
        """Summed writes of every feature of (site, layer) before `slot` [d_sae, d_model] (cached)."""
        key = (site, layer, slot)
        if key not in self._cache:
            coder = self.attn if site == "attn" else self.mlp
            self._cache[key] = self._summed_write(
                self.writes(site, layer, torch.arange(coder.cfg.d_sae, device=self.mlp.device)), slot
            )
        return self._cache[key]

    def output_weights(self, site: str, layer: int, feature: int) -> Connections:
        """`V[s, t]` from feature s = (site, layer, feature) to every feature its writes reach."""
        self._check(site, layer, feature)
        writes = self.writes(site, layer, torch.tensor([feature], device=self.mlp.device))
        parts = []
        for (t_site, t_layer), U in sorted(self.reads.items(), key=lambda kv: (kv[0][1], kv[0][0])):
            w = self._summed_write(writes, self.read_slot(t_site, t_layer))
            if w is not None:
                parts.append((t_site, t_layer, (w @ U)[0]))
        return _connections(parts)

    def input_weights(self, site: str, layer: int, feature: int) -> Connections:
        """`V[s, t]` into feature t = (site, layer, feature) from every feature whose writes reach it."""
        self._check(site, layer, feature)
        u = self.reads[(site, layer)][:, feature]
        slot = self.read_slot(site, layer)
        parts = []
        for s_layer in range(layer + 1):
            for s_site in SITES:
                coder = self.attn if s_site == "attn" else self.mlp
                if coder is None:
                    continue
                if 2 * s_layer + (1 if s_site == "mlp" else 0) >= slot:
                    continue
                parts.append((s_site, s_layer, self._all_writes(s_site, s_layer, slot) @ u))
        return _connections(parts)

    def vocab_weights(self, site: str, layer: int, feature: int) -> Float[Tensor, " d_vocab"]:
        """Output weights over the vocabulary: every write of the feature through the unembedding."""
        self._check(site, layer, feature)
        w = self._summed_write(
            self.writes(site, layer, torch.tensor([feature], device=self.mlp.device)), 2 * self.n_layers
        )
        return (w @ self.logit_reads())[0]

    def virtual_weight(self, source: tuple[str, int, int], target: tuple[str, int, int]) -> float:
        """`V[s, t]` for one pair, each given as (site, layer, feature); 0 when s cannot reach t."""
        self._check(*source)
        self._check(*target)
        w = self._summed_write(
            self.writes(source[0], source[1], torch.tensor([source[2]], device=self.mlp.device)),
            self.read_slot(*target[:2]),
        )
        return 0.0 if w is None else float(w[0] @ self.reads[target[:2]][:, target[2]])


def _connections(parts: list[tuple[str, int, Tensor]]) -> Connections:
    if not parts:
        e = np.zeros(0)
        return Connections(e.astype(str), e.astype(int), e.astype(int), e)
    return Connections(
        site=np.concatenate([np.full(len(w), s) for s, _, w in parts]),
        layer=np.concatenate([np.full(len(w), l) for _, l, w in parts]),
        feature=np.concatenate([np.arange(len(w)) for *_, w in parts]),
        weight=np.concatenate([w.cpu().numpy() for *_, w in parts]),
    )


def feature_key(feature) -> tuple[str, int, int]:
    """`feature` as (site, layer, index), or `OptionError` naming what it is instead."""
    ok = isinstance(feature, tuple | list) and len(feature) == 3 and isinstance(feature[0], str)
    ok = ok and all(map(is_whole, feature[1:]))
    if not ok:
        raise OptionError(
            f"feature is {feature!r}; pass (site, layer, index) such as ('mlp', 1, 42), layer and index integers."
        )
    return str(feature[0]), int(feature[1]), int(feature[2])


def virtual_weights(
    model: HookedTransformer,
    transcoders,
    feature: tuple[str, int, int],
    *,
    direction: str = "output",
    top_k: int | None = None,
    scales: dict[str, float] | None = None,
) -> Connections:
    """A feature's global (virtual) weights through the residual stream (module docstring).

    `feature` is (site, layer, index), site "mlp" (the MLP set, PLT or CLT) or "attn" (the
    attention set of `transcoders = [mlp_set, attn_set]`). `direction="output"`: its weights to
    every feature it writes to; "input": from every feature that writes to it. `top_k` keeps the
    strongest by |weight| (None: every reachable feature, the full sparse form). `scales` fixes the
    norm denominators (`norm_scales_at`, `mean_norm_scales`; step 4); None uses 1 everywhere.
    Sources: circuit-tracing appendix, "Interference Weights over More Features" and "Residual
    Stream Norms Growth". Build a `GlobalWeights` once to query many features."""
    if direction not in ("output", "input"):
        raise OptionError(f"direction is {direction!r}; pass 'output' or 'input'.")
    site, layer, index = feature_key(feature)
    gw = GlobalWeights(model, transcoders, scales)
    got = (gw.output_weights if direction == "output" else gw.input_weights)(site, layer, index)
    return got if top_k is None else got.top(top_k)


def output_logit_weights(
    model: HookedTransformer,
    transcoders,
    feature: tuple[str, int, int],
    *,
    scales: dict[str, float] | None = None,
) -> Float[Tensor, " d_vocab"]:
    """A feature's output weights over the vocabulary: its decoders (every layer, for a CLT) through
    the final norm and the unembedding (circuit-tracing appendix, "Number Output Weights for Select
    Features"). Subtract the mean to get its effect on the graph's demeaned logits."""
    site, layer, index = feature_key(feature)
    gw = GlobalWeights(model, transcoders, scales)
    return gw.vocab_weights(site, layer, index)


__all__ = [
    "Connections",
    "feature_connections_json",
    "GlobalWeights",
    "mean_norm_scales",
    "norm_scales_at",
    "output_logit_weights",
    "virtual_weights",
]


def feature_connections_json(
    gw: GlobalWeights, feature: tuple[str, int, int], k: int = 10, n_both=None, n_logits: int = 10
) -> dict:
    """A feature's strongest global connections as plain JSON (for the viewer): the `k` strongest
    input and output weights, each marked `used` when `n_both(source, target)` (a callable giving
    the pair's coactivation count, e.g. from `transcoders.compute_coactivation`) is > 0 (None: not
    known), and its top and bottom demeaned vocabulary weights (token ids)."""
    site, layer, index = feature
    out: dict = dict(feature=dict(site=site, layer=int(layer), feature=int(index)))
    for direction in ("input", "output"):
        conn = (gw.input_weights if direction == "input" else gw.output_weights)(site, int(layer), int(index))
        rows = conn.top(k).to_records()
        for r in rows:
            other = (r["site"], r["layer"], r["feature"])
            pair = (other, tuple(feature)) if direction == "input" else (tuple(feature), other)
            r["used"] = None if n_both is None else bool(n_both(*pair) > 0)
        out[direction] = rows
    v = gw.vocab_weights(site, int(layer), int(index))
    v = v - v.mean()
    out["logits_top"] = [[int(i), float(v[i])] for i in v.topk(n_logits).indices.tolist()]
    out["logits_bottom"] = [[int(i), float(v[i])] for i in (-v).topk(n_logits).indices.tolist()]
    return out

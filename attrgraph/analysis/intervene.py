"""Interventions on the underlying model through its transcoders: constrained and iterative patching.

Seed: circuit-tracing appendix, "Nuances of Steering with Cross-Layer Features", "Iterative
Patching" and "Details of Interventions".

1. Record: one clean forward (`ReplacementModel.run`, every position has features) gives the MLP
   inputs `x`, the MLP outputs `y`, the features `a` and the errors `e = y - tc(x)`; with
   `freeze_attention` also every attention pattern and normalization scale, which later forwards
   reuse (circuit-tracer's `freeze_attention` freezes both as well).
2. Edits: an intervention names a feature `(layer, position, feature)`, an error node
   (`error_node(layer, position)`) or a supernode (all its members), and sets the activation
   (`SetTo(v)` or a plain number), multiplies it (`Scale(m)`, e.g. -2 to inhibit) or adds to it
   (`Add(d)`). An error node takes `Scale(m)` (or 0 to ablate it). Position `None` means every
   position. Every edit must lie in the patch range `layers=(start, end)` (inclusive).
3. Constrained patching: the perturbed MLP outputs are computed once from the *clean* values,
       `w[l] = y[l] - skip(x)[l] + sum_edits (a' - a) W_dec^(l) + (m - 1) e[l] + skip(x_live)[l]`,
   and the MLP output of every layer in [start, end], at every position, is clamped to `w[l]`.
   Features inside the range are not recomputed, so an edit reaches a later feature only along
   direct paths (residual stream, frozen attention): with `end` at the target's layer this
   reproduces the graph's direct edges exactly ("guaranteed effects").
4. Iterative patching: for l = start..end in order, the transcoder re-encodes the live MLP input,
   the edits of layer l act on the live activations (`Scale` multiplies the live value), and the
   MLP output becomes `decode(a)[l] + e[l] + skip(x_live)[l]`: knock-on effects inside the range
   are kept (CLT sources below `start` keep their clean values).
5. Outside [start, end] the real MLPs run on whatever the residual stream holds.
6. Reported activations are the transcoder's on the live MLP input of every layer, with the edits
   put on top inside the range.
7. `generate`: steered sampling; each new token runs the intervened forward on the sequence so
   far, for the first `hold` new tokens, then the plain model.
8. Attention features (`transcoders=[mlp_set, attn_set]`): an edit may name an attention feature
   (`attn_feature(layer, position, feature)`) or an attention error (`error_node(layer, position,
   "attn")`). Inside [start, end] the attention outputs are patched like the MLP outputs: clamped
   to the clean output plus `(a' - a) W_dec_attn + (m - 1) e_attn` (constrained), or
   `decode_attn(a_live with edits) + e_attn` (iterative); outside, the real attention runs.
   Attention features are reported on the live attention outputs (`attn_pre_acts`, `attn_acts`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from attrgraph.engine.frozen import frozen_forward
from attrgraph.engine.replacement import ReplacementModel, ReplacementState
from attrgraph.engine.sources import to_tokens
from attrgraph.errors import InterventionError
from attrgraph.graph.supernodes import NodeKey, Supernode
from transcoders.arguments import shown
from transcoders.config import is_real, is_whole

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from transcoders.base import SparseCoder

MODES = ("constrained", "iterative")


class SetTo(NamedTuple):
    """Set the activation to `value`."""

    value: float


class Scale(NamedTuple):
    """Multiply the activation (or an error vector) by `factor`."""

    factor: float


class Add(NamedTuple):
    """Add `delta` to the activation."""

    delta: float


def error_node(layer: int, position: int | None, site: str = "mlp") -> NodeKey:
    """The key of the error node at (layer, position) of `site` ("mlp" or "attn"), for `interventions`."""
    layer, position = _index(layer, "layer"), _index(position, "position", none=True)
    if site not in ("mlp", "attn"):
        raise InterventionError(f"site is {shown(site)}; pass 'mlp' or 'attn'.")
    return NodeKey("error", layer, position, -1, site)


def attn_feature(layer: int, position: int | None, feature: int) -> NodeKey:
    """The key of an attention-output SAE feature (step 8), for `interventions`."""
    layer, position = _index(layer, "layer"), _index(position, "position", none=True)
    return NodeKey("feature", layer, position, _index(feature, "feature"), "attn")


def _index(value, what: str, none: bool = False) -> int | None:
    """A node key's field: a whole number (None for a position: every position), else one line."""
    if none and value is None:
        return None
    if not is_whole(value):
        also = " or None (every position)" if none else ""
        raise InterventionError(f"{what} is {shown(value)}; pass a whole number{also}.")
    return int(value)


@dataclass(frozen=True)
class Edit:
    """One resolved edit: a feature or an error vector at (layer, position), and an operation."""

    kind: str
    """"feature" or "error"."""
    layer: int
    position: int | None
    """None: every position."""
    feature: int
    op: str
    """"set", "scale" or "add"."""
    value: float
    site: str = "mlp"
    """"mlp", or "attn" for an attention feature or error (step 8)."""

    def apply(self, a: Tensor) -> Tensor:
        if self.op == "set":
            return torch.full_like(a, self.value)
        if self.op == "scale":
            return a * self.value
        return a + self.value


class InterventionOutput(NamedTuple):
    """What `intervene` returns."""

    logits: Float[Tensor, "n_pos d_vocab"]
    """Logits of the intervened model."""
    probs: Float[Tensor, "n_pos d_vocab"]
    """Their softmax."""
    pre_acts: Float[Tensor, "n_layers n_pos d_sae"]
    """Encoder pre-activations on the live MLP inputs."""
    acts: Float[Tensor, "n_layers n_pos d_sae"]
    """Feature activations on the live MLP inputs, with the edits applied inside the range."""
    attn_pre_acts: Float[Tensor, "n_layers n_pos d_attn"] | None = None
    """Attention SAE pre-activations on the live attention outputs (None without an attention set)."""
    attn_acts: Float[Tensor, "n_layers n_pos d_attn"] | None = None
    """Attention feature activations, with the edits applied inside the range (step 8)."""


class PatchedRun(NamedTuple):
    """A batched patched forward (`patched_forward`): one batch row per edit list."""

    logits: Float[Tensor, "batch n_pos d_vocab"]
    pre_acts: Tensor
    """[batch, n_layers, n_pos, d_sae], or [batch, n_select] with `select`."""
    acts: Tensor
    """Same shape as `pre_acts`."""
    captured: dict[str, Tensor]
    """Values of the `capture` hooks, [batch, ...]."""
    attn_pre_acts: Tensor | None = None
    """[batch, n_layers, n_pos, d_attn] (step 8; None without an attention set)."""
    attn_acts: Tensor | None = None


# ---------------------------------------------------------------------------------- edits
def _op(value) -> tuple[str, float]:
    if isinstance(value, SetTo):
        op, v = "set", value.value
    elif isinstance(value, Scale):
        op, v = "scale", value.factor
    elif isinstance(value, Add):
        op, v = "add", value.delta
    else:
        op, v = "set", value
    try:  # a number: Python's, numpy's or a one-element tensor
        if isinstance(v, bool | str | bytes):
            raise TypeError
        v = float(v)
    except (TypeError, ValueError, RuntimeError):
        raise InterventionError(
            f"intervention value {value!r} is not a number, SetTo, Scale or Add; pass one of them."
        ) from None
    if not math.isfinite(v):
        raise InterventionError(
            f"intervention value {value!r} is not finite; it would make every later activation NaN. "
            "Pass a finite number."
        )
    return op, v


def _members(key) -> list[NodeKey]:
    if isinstance(key, Supernode):
        return list(key.members)
    if isinstance(key, NodeKey):
        return [key]
    if isinstance(key, tuple) and len(key) in (3, 4) and key[0] == "error":
        return [error_node(*key[1:])]
    if isinstance(key, tuple) and len(key) == 3:
        layer, pos, feat = key
        return [NodeKey("feature", int(layer), None if pos is None else int(pos), int(feat))]
    raise InterventionError(
        f"intervention key {key!r} is not a (layer, position, feature) tuple, a NodeKey, "
        "error_node(layer, position) or a Supernode; pass one of them."
    )


def resolve_edits(
    interventions: dict, n_layers: int, n_pos: int, d_sae: int, d_attn: int | None = None
) -> list[Edit]:
    """The edits of an `interventions` mapping (module docstring, step 2), checked against the sizes
    (`d_attn`: features per layer of the attention set, None without one)."""
    if not isinstance(interventions, Mapping):
        raise InterventionError(
            f"interventions is a {type(interventions).__name__}; pass a dict from nodes to values, such as "
            "{(layer, position, feature): 0.0} ({} for none)."
        )
    edits = []
    for key, value in interventions.items():
        op, v = _op(value)
        for m in _members(key):
            if m.kind not in ("feature", "error"):
                raise InterventionError(
                    f"node {m} is a {m.kind} node; only feature and error nodes can be patched."
                )
            if not 0 <= m.layer < n_layers:
                raise InterventionError(
                    f"node {m} has layer {m.layer}; the model has layers 0..{n_layers - 1}."
                )
            if m.position is not None and not -n_pos <= m.position < n_pos:
                raise InterventionError(f"node {m} has position {m.position}; the prompt has {n_pos} tokens.")
            if m.site == "attn" and d_attn is None:
                raise InterventionError(
                    f"node {m} is an attention node but there is no attention set; pass [mlp_set, attn_set]."
                )
            width = d_attn if m.site == "attn" else d_sae
            if m.kind == "feature" and not 0 <= m.feature < width:
                raise InterventionError(
                    f"node {m} has feature {m.feature}; the {'attention SAEs' if m.site == 'attn' else 'transcoders'} "
                    f"have {width} per layer."
                )
            if m.kind == "error" and not (op == "scale" or (op == "set" and v == 0.0)):
                raise InterventionError(f"error node {m} is a vector; pass Scale(m) or 0 to ablate it.")
            eop, ev = ("scale", 0.0) if m.kind == "error" and op == "set" else (op, v)
            pos = None if m.position is None else m.position % n_pos
            feature = m.feature if m.kind == "feature" else -1
            edits.append(Edit(m.kind, m.layer, pos, feature, eop, ev, "attn" if m.site == "attn" else "mlp"))
    return edits


def _layer_range(layers, edits: list[Edit], n_layers: int) -> tuple[int, int]:
    if layers is None:
        start = min((e.layer for e in edits), default=0)
        return start, n_layers - 1
    if (
        isinstance(layers, str | bytes)
        or not hasattr(layers, "__len__")
        or len(layers) != 2
        or not all(is_whole(x) for x in layers)
    ):  # a tuple, list or array of two layer indices
        raise InterventionError(
            f"layers is {shown(layers)}; pass (start, end), two layer indices inside 0..{n_layers - 1}."
        )
    start, end = int(layers[0]), int(layers[1])
    if not 0 <= start <= end < n_layers:
        raise InterventionError(
            f"layers={tuple(layers)} is not a range inside 0..{n_layers - 1}; pass (start, end) with start <= end."
        )
    for e in edits:
        if not start <= e.layer <= end:
            raise InterventionError(
                f"an edit at layer {e.layer} is outside layers=({start}, {end}); widen the range."
            )
    return start, end


# ---------------------------------------------------------------------------------- forward
@torch.no_grad()
def patched_forward(
    rm: ReplacementModel,
    state: ReplacementState,
    batch_edits: list[list[Edit]],
    mode: str = "constrained",
    layers: tuple[int, int] | None = None,
    freeze_patterns: bool = True,
    freeze_norms: bool = True,
    select: Int[Tensor, "n_select 3"] | None = None,
    hooks: list = (),
    capture: tuple[str, ...] = (),
) -> PatchedRun:
    """Steps 3-6 for a batch of edit lists on the prompt `state` was recorded on (`n_excluded` 0).

    `select` ((layer, position, feature) rows) returns only those activations; `hooks` are extra
    TransformerLens forward hooks (e.g. a residual perturbation); `capture` hook values come back."""
    if mode not in MODES:
        raise InterventionError(f"mode is {mode!r}; pass one of {MODES}.")
    model, tc, cfg = rm.model, rm.tc, rm.tc.cfg
    L, P, S = state.acts.shape
    B = max(1, len(batch_edits))
    batch_edits = list(batch_edits) or [[]]
    start, end = _layer_range(layers, [e for es in batch_edits for e in es], L)
    dtype = state.y_out.dtype
    tcd = tc.dtype

    # step 3: the clamped outputs, computed once from the clean values
    delta = torch.zeros(B, L, P, state.y_out.shape[-1], dtype=dtype, device=state.y_out.device)
    if mode == "constrained":
        for b, edits in enumerate(batch_edits):
            for e in edits:
                if e.site == "attn":  # step 8: the attention hooks
                    continue
                pos = slice(None) if e.position is None else e.position
                if e.kind == "error":
                    delta[b, e.layer, pos] += (e.value - 1.0) * state.errors[e.layer, pos]
                    continue
                a0 = state.acts[e.layer, pos, e.feature]
                da = (e.apply(a0) - a0).to(dtype)
                dec = tc.decoder_vectors(e.layer, torch.tensor([e.feature], device=tc.device))[0].to(
                    dtype
                )  # [n_out, d]
                for j in range(dec.shape[0]):
                    lo = e.layer + j
                    if start <= lo <= end:
                        delta[b, lo, pos] += da[..., None] * dec[j]
    clamp = state.y_out - state.skip  # decode(a) + e at every position (nothing excluded)

    live_acts: list[Tensor | None] = [state.acts[l].to(tcd).expand(B, P, S) for l in range(L)]
    pre_out: list[Tensor | None] = [None] * L
    act_out: list[Tensor | None] = [None] * L
    reads: list[Tensor | None] = [None] * L
    by_layer = [
        [(b, e) for b, es in enumerate(batch_edits) for e in es if e.layer == l and e.site == "mlp"]
        for l in range(L)
    ]
    attn = _AttentionPatch(rm, state, batch_edits, mode, start, end) if rm.attn is not None else None
    if attn is not None:
        hooks = [*hooks, *attn.hooks()]

    def on_read(l: int, x: Tensor) -> None:
        x = x.expand(B, P, x.shape[-1])
        reads[l] = x
        pre = tc.encode_layer(x.to(tcd), l)
        act = tc.activate_layer(pre, l)
        if start <= l <= end and by_layer[l]:
            act = act.clone()
            for b, e in by_layer[l]:
                if e.kind != "feature":
                    continue
                pos = slice(None) if e.position is None else e.position
                base = (
                    state.acts[l, pos, e.feature].to(tcd) if mode == "constrained" else act[b, pos, e.feature]
                )
                act[b, pos, e.feature] = e.apply(base)
        pre_out[l], act_out[l] = pre, act
        if mode == "iterative" and start <= l <= end:
            live_acts[l] = act

    def write(l: int) -> Tensor:
        x = reads[l]
        skip = (x.to(tcd) @ tc.W_skip[l]).to(dtype) if tc.W_skip is not None else 0.0
        if mode == "constrained":
            return clamp[l] + delta[:, l] + skip
        err = state.errors[l].expand(B, P, -1).clone()
        for b, e in by_layer[l]:
            if e.kind == "error":
                pos = slice(None) if e.position is None else e.position
                err[b, pos] = err[b, pos] * e.value
        return tc.decode_layer(live_acts, l).to(dtype) + err + skip

    with frozen_forward(
        model,
        cfg,
        state.frozen,
        read=on_read,
        write=write,
        layers=range(start, end + 1),
        freeze_patterns=freeze_patterns,
        freeze_norms=freeze_norms,
        capture=capture,
        hooks=hooks,
    ) as captured:
        logits = model(state.tokens[None].expand(B, P))
    pre = torch.stack(pre_out, 1)  # [B, L, P, S]
    act = torch.stack(act_out, 1)
    if select is not None:
        l, p, f = select.T
        pre, act = pre[:, l, p, f], act[:, l, p, f]
    attn_pre = attn_act = None
    if attn is not None:
        attn_pre, attn_act = (torch.stack(x, 1).to(dtype) for x in (attn.pre_out, attn.act_out))
    return PatchedRun(logits, pre.to(dtype), act.to(dtype), captured, attn_pre, attn_act)


class _AttentionPatch:
    """Step 8: the attention-output hooks of one patched forward (edits of site "attn")."""

    def __init__(
        self, rm: ReplacementModel, state: ReplacementState, batch_edits, mode: str, start: int, end: int
    ):
        self.sae, self.state, self.mode, self.start, self.end = rm.attn, state, mode, start, end
        L, P = state.attn_acts.shape[:2]
        self.B, self.P = len(batch_edits), P
        self.by_layer = [
            [(b, e) for b, es in enumerate(batch_edits) for e in es if e.layer == l and e.site == "attn"]
            for l in range(L)
        ]
        self.pre_out: list[Tensor | None] = [None] * L
        self.act_out: list[Tensor | None] = [None] * L
        dtype = state.attn_out.dtype
        self.delta = torch.zeros(
            self.B, L, P, state.attn_out.shape[-1], dtype=dtype, device=state.attn_out.device
        )
        if mode == "constrained":  # clean output plus the edits' change (step 3's rule)
            for l in range(L):
                for b, e in self.by_layer[l]:
                    pos = slice(None) if e.position is None else e.position
                    if e.kind == "error":
                        self.delta[b, l, pos] += (e.value - 1.0) * state.attn_errors[l, pos]
                        continue
                    a0 = state.attn_acts[l, pos, e.feature]
                    dec = self.sae.W_dec[l, e.feature].to(dtype)
                    self.delta[b, l, pos] += (e.apply(a0) - a0).to(dtype)[..., None] * dec

    def hooks(self) -> list:
        return [
            (self.sae.cfg.hook_out(l), lambda x, hook, l=l: self.patch(l, x))
            for l in range(len(self.by_layer))
        ]

    def patch(self, l: int, x: Tensor) -> Tensor:
        sae, state = self.sae, self.state
        x = x.expand(self.B, self.P, x.shape[-1])
        pre = sae.encode_layer(x.to(sae.dtype), l)
        act = sae.activate_layer(pre, l)
        inside = self.start <= l <= self.end
        if inside and self.by_layer[l]:
            act = act.clone()
            for b, e in self.by_layer[l]:
                if e.kind != "feature":
                    continue
                pos = slice(None) if e.position is None else e.position
                base = (
                    state.attn_acts[l, pos, e.feature].to(act)
                    if self.mode == "constrained"
                    else act[b, pos, e.feature]
                )
                act[b, pos, e.feature] = e.apply(base)
        self.pre_out[l], self.act_out[l] = pre, act
        if not inside:
            return x
        if self.mode == "constrained":
            return (state.attn_out[l] + self.delta[:, l]).to(x.dtype)
        err = state.attn_errors[l].expand(self.B, self.P, -1).clone()
        for b, e in self.by_layer[l]:
            if e.kind == "error":
                pos = slice(None) if e.position is None else e.position
                err[b, pos] = err[b, pos] * e.value
        return (act @ sae.W_dec[l] + sae.b_dec[l]).to(x.dtype) + err.to(x.dtype)


def _context(model, transcoders, prompt) -> tuple[ReplacementModel, ReplacementState]:
    rm = ReplacementModel.of(model, transcoders)
    return rm, rm.run(to_tokens(model, prompt), exclude_bos=False, hooks_allowed=True)


def intervene(
    model: HookedTransformer,
    transcoders: SparseCoder | ReplacementModel,
    prompt: str | list[int] | Tensor | np.ndarray,
    interventions: dict,
    mode: str = "constrained",
    layers: tuple[int, int] | None = None,
    freeze_attention: bool = True,
) -> InterventionOutput:
    """Run `model` on `prompt` with `interventions` (module docstring, steps 1-6).

    `interventions` maps `(layer, position, feature)`, `error_node(layer, position)`,
    `attn_feature(layer, position, feature)`, `error_node(layer, position, "attn")` (step 8) or a
    `Supernode` to a number / `SetTo(v)`, `Scale(m)` or `Add(d)`. `layers=(start, end)` is the
    inclusive patch range (default: from the lowest edited layer to the last layer).
    `freeze_attention` holds attention patterns and normalization scales at their clean values.
    Hooks on the model (a `with model.hooks(...)` block around the call) run in the clean run and
    the intervened one alike: the intervention is on the model as it is, hooks included.
    """
    if mode not in MODES:
        raise InterventionError(f"mode is {mode!r}; pass one of {MODES}.")
    rm, state = _context(model, transcoders, prompt)
    L, P, S = state.acts.shape
    edits = resolve_edits(interventions, L, P, S, _attn_width(rm))
    run = patched_forward(rm, state, [edits], mode, layers, freeze_attention, freeze_attention)
    logits = run.logits[0]
    attn = () if run.attn_acts is None else (run.attn_pre_acts[0], run.attn_acts[0])
    return InterventionOutput(
        logits, torch.softmax(logits.double(), -1).to(logits.dtype), run.pre_acts[0], run.acts[0], *attn
    )


def _attn_width(rm: ReplacementModel) -> int | None:
    return None if rm.attn is None else rm.attn.cfg.d_sae


@torch.no_grad()
def generate(
    model: HookedTransformer,
    transcoders: SparseCoder | ReplacementModel,
    prompt: str | list[int] | Tensor | np.ndarray,
    interventions: dict,
    n_tokens: int = 10,
    hold: int | None = None,
    mode: str = "iterative",
    layers: tuple[int, int] | None = None,
    temperature: float = 0.0,
    seed: int = 0,
) -> Int[Tensor, " n_out"]:
    """Steered sampling (step 7): `n_tokens` new tokens, the intervention held for the first `hold`
    (default all). Temperature 0 is greedy. Attention is not frozen (the sequence grows); positions
    index the full sequence, and position None acts on every position, new ones included.
    Returns the prompt and the new tokens."""
    if not is_whole(n_tokens) or n_tokens < 0:
        raise InterventionError(f"n_tokens is {shown(n_tokens)}; pass 0 or more.")
    if not is_real(temperature) or not temperature >= 0 or temperature == math.inf:  # NaN too
        raise InterventionError(
            f"temperature is {shown(temperature)}; pass 0 (greedy) or a finite number above it."
        )
    if hold is not None and (not is_whole(hold) or hold < 0):
        raise InterventionError(
            f"hold is {shown(hold)}; pass 0 or more new tokens to hold the intervention for."
        )
    if not is_whole(seed):
        raise InterventionError(f"seed is {shown(seed)}; pass a whole number.")
    if mode not in MODES:  # also without interventions, where no patched forward would check it
        raise InterventionError(f"mode is {mode!r}; pass one of {MODES}.")
    rm = ReplacementModel.of(model, transcoders)
    tokens = to_tokens(model, prompt)
    hold = n_tokens if hold is None else hold
    g = torch.Generator(device=tokens.device).manual_seed(seed)  # multinomial samples on the model's device
    L, S = rm.cfg.n_layers, rm.tc.cfg.d_sae
    if layers is not None:
        _layer_range(layers, [], L)
    for step in range(n_tokens):
        if tokens.numel() >= model.cfg.n_ctx:
            break
        if step < hold and interventions:
            state = rm.run(tokens, exclude_bos=False, hooks_allowed=True)
            edits = resolve_edits(interventions, L, len(tokens), S, _attn_width(rm))
            logits = patched_forward(rm, state, [edits], mode, layers, False, False).logits[0, -1]
        else:
            logits = model(tokens[None])[0, -1]
        if temperature == 0:
            nxt = logits.argmax()
        else:
            nxt = torch.multinomial(torch.softmax(logits.double() / temperature, -1), 1, generator=g)[0]
        tokens = torch.cat([tokens, nxt.view(1).to(tokens)])
    return tokens

"""Attribution to an inactive feature: which upstream nodes hold it below threshold.

Seed: circuit-tracing appendix, "Attribution Graph Computation" (a feature's pre-activation is a
linear target like any other) and linear-computation-graphs section 4 (attributing intermediate
features). No peer offers this for features that did not fire.

1. The target is the chosen feature's encoder pre-activation `h = x[l, p] . v_f + b_enc` at its read
   site, `v_f` the set's encoder vector (`encoder_vectors`; `W_enc[l][:, f]` for our sets). For the
   MLP-input read site `x = ln2.hook_normalized * w + b`, so the target direction on
   `blocks.{l}.ln2.hook_normalized` is `v_f * w` and `b_enc + v_f . b` is a constant offset; other
   read sites are read literally.
2. `attribute` with that one target gives the exact row `A[h, s]` over every source (embeddings,
   errors, active features) in the frozen replacement model; `bias = h - sum_s A[h, s]` is what the
   frozen model gives with every source at zero.
3. The feature is held off by the sources with the most negative `A[h, s]`: removing one of them
   (in the frozen model) raises `h` by exactly `-A[h, s]`; `gap = threshold - h` says how much
   excitation it lacks (the set's `onset_layer`: 0 for ReLU, the JumpReLU or BatchTopK threshold, or
   the k-th largest pre-activation of its layer and position for TopK).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch

from attrgraph.engine.attribute import attribute
from attrgraph.engine.replacement import ReplacementModel
from attrgraph.engine.sources import to_tokens
from attrgraph.engine.targets import Target, direction
from attrgraph.errors import TargetError
from attrgraph.graph.graph import Graph
from transcoders import sites
from transcoders.config import is_whole

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from transcoders.base import SparseCoder


class InactiveAttribution(NamedTuple):
    """What `attribute_inactive` returns."""

    graph: Graph
    """The attribution graph whose single target node (last node) is the pre-activation direction."""
    pre_activation: float
    """The feature's encoder pre-activation `h` on the prompt."""
    threshold: float
    """The value `h` must exceed to fire (step 3)."""
    bias: float
    """`h - sum_s A[h, s]`: the part no source accounts for (biases, excluded positions)."""
    contributions: np.ndarray
    """[n_nodes] `A[h, s]` for every node of the graph (0 for the target itself)."""

    @property
    def gap(self) -> float:
        """`threshold - pre_activation` (> 0 for an inactive feature)."""
        return self.threshold - self.pre_activation

    def inhibitors(self, k: int = 10) -> list[tuple[str, float]]:
        """The `k` most negative sources, (label, contribution)."""
        order = np.argsort(self.contributions)[:k]
        return [
            (self.graph.label(int(i)), float(self.contributions[i]))
            for i in order
            if self.contributions[i] < 0
        ]

    def exciters(self, k: int = 10) -> list[tuple[str, float]]:
        """The `k` most positive sources, (label, contribution)."""
        order = np.argsort(-self.contributions)[:k]
        return [
            (self.graph.label(int(i)), float(self.contributions[i]))
            for i in order
            if self.contributions[i] > 0
        ]


def preactivation_target(
    model: HookedTransformer,
    transcoders: SparseCoder | ReplacementModel,
    layer: int,
    position: int,
    feature: int,
) -> tuple[Target, float]:
    """The target of step 1 and its constant offset (`h = target value + offset`)."""
    cfg = transcoders.cfg
    given = dict(layer=layer, position=position, feature=feature)
    for name, value in given.items():
        if not is_whole(value):
            raise TargetError(f"{name} is {value!r}; pass an integer index.")
    if not 0 <= layer < cfg.n_layers or not 0 <= feature < cfg.d_sae:
        raise TargetError(
            f"feature L{layer}/F{feature} does not exist; the transcoders have {cfg.n_layers} layers of {cfg.d_sae}."
        )
    with torch.no_grad():
        feat = torch.tensor([feature], device=transcoders.device)
        w_enc = transcoders.encoder_vectors(layer, feat)[0].detach().to(model.cfg.dtype)
        offset = float(transcoders.encoder_bias(layer)[feature])
        vector = w_enc
        if cfg.input_hook == sites.MLP_INPUT:
            ln2 = model.blocks[layer].ln2
            if getattr(ln2, "w", None) is not None:
                vector = w_enc * ln2.w.detach()
            if getattr(ln2, "b", None) is not None:
                offset += float(w_enc @ ln2.b.detach())
            hook = sites.MLP_INPUT.format(layer=layer)
        else:
            hook = cfg.hook_in(layer)
    name = f"pre L{layer}/F{feature}@{position}"
    return direction(hook, position, vector.clone(), name=name, weight=1.0), offset


def attribute_inactive(
    model: HookedTransformer,
    transcoders: SparseCoder | ReplacementModel,
    prompt,
    layer: int,
    position: int,
    feature: int,
    **options,
) -> InactiveAttribution:
    """Attribute the pre-activation of feature `feature` of `layer` at `position` (module docstring).

    `options` go to `attribute` (e.g. `exclude_bos`, `embedding`, `batch_size`)."""
    rm = ReplacementModel.of(model, transcoders)
    tokens = to_tokens(model, prompt)
    target, offset = preactivation_target(model, rm.tc, layer, position, feature)
    graph = attribute(model, rm, tokens, targets=[target], **options)
    row = graph.adjacency[[graph.n_nodes - 1]].toarray()[0].astype(np.float64)
    h = float(graph.nodes.activation[-1]) + offset
    with torch.no_grad():
        x = tokens.to(model.cfg.device)
        pre = rm.run(x, exclude_bos=False).pre_acts[layer, position % len(tokens)]
    exact_h = float(pre[feature])
    # the two reads round differently in a half-precision model: allow a few of its ulps
    tol = max(1e-3, 4 * torch.finfo(model.cfg.dtype).eps)
    if abs(exact_h - h) > tol * max(1.0, abs(h)):
        raise TargetError(
            f"the pre-activation read through the target ({h:.6g}) differs from the encoder's ({exact_h:.6g}); "
            "the transcoders' read site is not one this function understands."
        )
    threshold = rm.tc.onset_layer(pre, layer, feature)
    return InactiveAttribution(graph, exact_h, threshold, exact_h - float(row.sum()), row)

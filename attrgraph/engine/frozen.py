"""One frozen forward of a TransformerLens model: the context that attribution, interventions and
validation all run the model in.

Seed: circuit-tracing appendix, "Attribution Graph Computation" (freezing) and "Details of
Interventions" (clamping MLP outputs).

1. Attention patterns (`attn.hook_pattern`) and normalization scales (`*.hook_scale`) are replaced
   by their recorded values; patterns and norms can be frozen separately (`freeze_patterns`,
   `freeze_norms`).
2. The transcoders' read value of every layer is handed to `read(l, x)` as the forward passes it:
   from inside the MLP stand-in when the transcoders read the MLP input, else from the read hook
   `cfg.hook_in(l)`.
3. For each layer in `layers`, the MLP output becomes `write(l)`: the stand-in returns it at the
   raw write site, or, when the transcoders write the hook `cfg.hook_out(l)`, that hook returns it
   (and the stand-in returns zeros, so the MLP's nonlinearity is never run nor differentiated).
   Layers outside `layers` run the real MLP.
4. `capture` hook values come back in the yielded dict; `hooks` are further forward hooks.
5. On exit the MLPs and hooks are restored, whatever happened inside the block.
6. Hooks already on the model (a session's `add_hook`, a `with model.hooks(...)` around the call)
   run in every frozen forward as in the recorded one: interventions and generation act on the
   model as it is, hooks included. What computes a graph refuses them first
   (`ReplacementModel.run` without `hooks_allowed`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from transcoders import sites
from transcoders.block_layout import is_frozen

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer


class _MLPStandIn(nn.Module):
    """Takes the place of `blocks[l].mlp` for one frozen forward (steps 2-3)."""

    def __init__(self, mlp: nn.Module, layer: int, read, write, replaced: bool, raw: bool):
        super().__init__()
        self.layer, self.read, self.write, self.replaced, self.raw = layer, read, write, replaced, raw
        self.__dict__["mlp"] = mlp  # not a submodule: the real MLP stays owned by its block

    def forward(self, x: Tensor) -> Tensor:
        if self.read is not None:
            self.read(self.layer, x)
        if not self.replaced:
            return self.mlp(x)
        return self.write(self.layer) if self.raw else torch.zeros_like(x)


def recorded_like(v: Tensor, x: Tensor) -> Tensor:
    """The recorded value `v` (batch 1) in the shape of the live `x` (batch B). A QK-norm scale
    (`attn.q_norm.hook_scale`) is `[batch pos heads, 1]`, batch folded into its first axis, so the batch
    is repeated there; every other frozen hook has a batch axis of 1 to expand."""
    if v.dim() == 2 and v.shape[0] != x.shape[0] and x.shape[0] % v.shape[0] == 0:
        return v.repeat(x.shape[0] // v.shape[0], 1)
    return v.expand(x.shape)


@contextmanager
def frozen_forward(
    model: HookedTransformer,
    tc_cfg,
    frozen: dict[str, Tensor],
    *,
    read: Callable[[int, Tensor], None] | None = None,
    write: Callable[[int], Tensor] | None = None,
    layers: Iterable[int] = (),
    freeze_patterns: bool = True,
    freeze_norms: bool = True,
    capture: Iterable[str] = (),
    hooks: Iterable = (),
) -> Iterator[dict[str, Tensor]]:
    """Install the frozen forward on `model` for the `with` block (module docstring, steps 1-5).

    `frozen` maps hook names to recorded values (batch 1; expanded to the batch run);
    `tc_cfg` says where the transcoders read and write. Yields the dict of captured values."""
    layers = set(layers)
    if layers and write is None:
        raise ValueError("frozen_forward replaces the MLP outputs of `layers`, so it needs `write`.")
    read_in_mlp = tc_cfg.input_hook == sites.MLP_INPUT
    fwd = [
        (name, lambda x, hook, v=value: recorded_like(v, x))
        for name, value in frozen.items()
        if is_frozen(name) and (freeze_patterns if name.endswith("hook_pattern") else freeze_norms)
    ]
    if read is not None and not read_in_mlp:
        fwd += [
            (tc_cfg.hook_in(l), lambda x, hook, l=l: (read(l, x), x)[1]) for l in range(len(model.blocks))
        ]
    raw = [sites.raw_output_needed(model, tc_cfg, l) for l in range(len(model.blocks))]
    fwd += [(tc_cfg.hook_out(l), lambda x, hook, l=l: write(l)) for l in sorted(layers) if not raw[l]]
    captured: dict[str, Tensor] = {}
    for name in capture:

        def keep(x, hook, name=name):
            captured[name] = x
            return x

        fwd.append((name, keep))
    fwd += list(hooks)
    originals = [block.mlp for block in model.blocks]
    try:
        for l, block in enumerate(model.blocks):
            block.mlp = _MLPStandIn(
                originals[l], l, read if read_in_mlp else None, write, l in layers, raw[l]
            )
        with model.hooks(fwd_hooks=fwd):
            yield captured
    finally:
        for block, mlp in zip(model.blocks, originals):
            block.mlp = mlp

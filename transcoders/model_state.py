"""What a session may leave on a model that changes what attrgraph computes from it without a word.

A notebook keeps one model across cells, and a cell that tried something leaves it behind. Each
case below ran quietly and gave a wrong result, or failed deep inside torch, before these checks:

1. Hooks: TransformerLens's `add_hook` / `add_perma_hook`, a `with model.hooks(...)` block around the
   call, or torch's `register_forward_hook` (and pre- and backward hooks) on any submodule. They
   enter every forward the model runs, but not what attrgraph differentiates by hand (the linear
   rows engine, the component graph's residual sums): with `x * 2` on `blocks.0.hook_resid_mid` the
   linear and autograd rows of one graph were 1.8 apart, a graph of neither model; an activation
   store fills with the hooked model's activations. `check_no_hooks` refuses them by name, before
   any of attrgraph's own hooks are attached (those it removes itself). torch's global module hooks
   (`register_module_forward_hook`) are left alone: tools that observe every module use them
   (`torch.utils.flop_counter`, device checks), and a hook on one model is what a cell leaves.
2. Weights whose dtype is not `cfg.dtype`: `.half()`, `.float()`, `.bfloat16()` are torch's and
   leave TransformerLens's config behind (`model.to(dtype)` keeps it), and TransformerLens's own
   forward then fails inside the attention with "mat1 and mat2 must have the same dtype".
   `check_dtype` names the call that converts both.
3. Gradients: a call that differentiates the model (the autograd rows engine, head loadings, EAP,
   edge pruning) made inside `torch.no_grad()` or `torch.inference_mode()` failed with "element 0
   of tensors does not require grad". `grad_mode()` runs such a step with gradients on whatever
   block the caller is in; parameters made under `torch.inference_mode()` (a model or set loaded
   inside the block) cannot be saved for backward at all, and `check_differentiable` refuses them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
from torch import nn

from transcoders.errors import ModelStateError

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
"""Where torch keeps a module's hooks (TransformerLens's `HookPoint.add_hook` registers there too)."""


def attached_hooks(model: nn.Module) -> list[str]:
    """Step 1: the submodules of `model` (hook points by their TransformerLens names) that carry a
    forward, pre-forward or backward hook."""
    return [
        name or "the model itself"
        for name, module in model.named_modules()
        if any(getattr(module, d, None) for d in HOOK_DICTS)
    ]


def check_no_hooks(model: nn.Module, effect: str) -> None:
    """Step 1: `ModelStateError` when hooks are attached to `model`; `effect` says what they would do
    to the result ("enter the recorded run but not what is differentiated")."""
    found = attached_hooks(model)
    if not found:
        return
    shown = ", ".join(found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")
    raise ModelStateError(
        f"hooks are attached to the model at {shown}: they would {effect}; remove them with "
        "model.reset_hooks(including_permanent=True) (torch hooks: their handle's .remove()), or make "
        "the call outside the `with model.hooks(...)` block."
    )


def check_dtype(model: HookedTransformer) -> None:
    """Step 2: `ModelStateError` when a floating parameter of `model` is not of `model.cfg.dtype`."""
    want = getattr(model.cfg, "dtype", None)
    if want is None:
        return
    for name, p in model.named_parameters():
        if p.is_floating_point() and p.dtype != want:
            got = str(p.dtype).replace("torch.", "")
            raise ModelStateError(
                f"the model's weights are {got} ({name}) but model.cfg.dtype is "
                f"{str(want).replace('torch.', '')}: .half(), .float() and .bfloat16() convert the weights "
                f"and leave TransformerLens's config behind; convert with model.to(torch.{got}), or load "
                f"it so (load_model(..., dtype='{got}'))."
            )


def check_differentiable(modules: dict[str, nn.Module | None], doing: str) -> None:
    """Step 3: `ModelStateError` when a parameter of one of `modules` (by the name the sentence
    gives it: "the model", "the transcoders") was made under `torch.inference_mode()`."""
    for what, module in modules.items():
        if module is None:
            continue
        for name, p in module.named_parameters():
            if p.is_inference():
                raise ModelStateError(
                    f"{doing} differentiates {what}, but its parameters were made under "
                    f"torch.inference_mode() ({name} is an inference tensor, which autograd cannot "
                    "save); load it outside that block, or use torch.no_grad() there instead."
                )


@contextmanager
def grad_mode() -> Iterator[None]:
    """Step 3: gradients on for the block, inside a caller's `torch.no_grad()` or
    `torch.inference_mode()` as well; tensors made in it are ordinary ones."""
    with torch.inference_mode(False), torch.enable_grad():
        yield

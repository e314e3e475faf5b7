"""Which sparse coders replace what: an MLP transcoder set, optionally with attention-output SAEs.

Seed: linear-computation-graphs, section 2 (SAEs on the attention outputs, transcoders on the MLPs).

1. `TranscoderSets(mlp, attn)`: `mlp` replaces every MLP (a PLT or CLT set, as alone); `attn`, when
   given, is an SAE set (`kind="sae"`) reading and writing `blocks.{layer}.hook_attn_out`
   (`sites.ATTN_OUTPUT`), whose features and errors replace every attention output.
2. `transcoder_sets(model, x)` is the one normalisation: `x` is a single set (MLP only), a
   sequence `[mlp_set, attn_set]`, or a `TranscoderSets`; it checks that the attention set fits the
   model and the MLP set (width, layers, hooks, kind, the model it was trained for) and raises
   `TranscoderMismatchError` in one line naming the mismatch. The MLP set's own checks stay in
   `ReplacementModel`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from transcoders import sites
from transcoders.block_layout import ATTN_OUTPUT
from transcoders.errors import TranscoderMismatchError

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from transcoders.base import SparseCoder


@dataclass(frozen=True)
class TranscoderSets:
    """An MLP transcoder set and, optionally, an attention-output SAE set for one model."""

    mlp: SparseCoder
    """Replaces the MLPs (PLT or CLT; MLP input -> MLP output)."""
    attn: SparseCoder | None = None
    """Replaces the attention outputs (SAE on `blocks.{layer}.hook_attn_out`), or None."""


def _is_attention_set(tc) -> bool:
    cfg = tc.cfg
    return cfg.is_sae and sites.ATTN_OUTPUT in (cfg.input_hook, cfg.output_hook)


def transcoder_sets(model: HookedTransformer, sets) -> TranscoderSets:
    """Step 2: `sets` (one set, `[mlp_set, attn_set]` or `TranscoderSets`) as checked `TranscoderSets`."""
    if isinstance(sets, TranscoderSets):
        mlp, attn = sets.mlp, sets.attn
    elif isinstance(sets, Sequence) and not isinstance(sets, (str, bytes)):
        if not 1 <= len(sets) <= 2:
            raise TranscoderMismatchError(
                f"got {len(sets)} transcoder sets; pass one MLP set or [mlp_set, attn_set]."
            )
        mlp, attn = sets[0], (sets[1] if len(sets) == 2 else None)
    else:
        mlp, attn = sets, None
    for name, tc in (("MLP", mlp), ("attention", attn)):
        if (tc is not None or name == "MLP") and not hasattr(tc, "cfg"):
            raise TranscoderMismatchError(
                f"the {name} set is a {type(tc).__name__}, not a transcoder set; load one with load_transcoders."
            )
    if _is_attention_set(mlp):
        raise TranscoderMismatchError(
            f"the first set is an attention-output SAE ({mlp.cfg.input_hook!r}); pass [mlp_set, attn_set] "
            "with the MLP transcoders first."
        )
    if attn is not None:
        check_attention_set(model, attn, mlp)
    return TranscoderSets(mlp, attn)


def check_attention_set(model: HookedTransformer, attn: SparseCoder, mlp: SparseCoder | None = None) -> None:
    """Raise `TranscoderMismatchError` unless `attn` is an attention-output SAE set for `model`
    (and was trained for the same model as `mlp`, when both name one)."""
    cfg, mcfg = attn.cfg, model.cfg
    if not cfg.is_attention_sae:
        raise TranscoderMismatchError(
            f"the attention set is a {cfg.kind!r} set on {cfg.input_hook!r} -> {cfg.output_hook!r}; it must "
            f"be an SAE set (kind 'sae') reading and writing {sites.ATTN_OUTPUT!r}."
        )
    if cfg.d_model != mcfg.d_model:
        raise TranscoderMismatchError(
            f"the attention SAEs have d_model {cfg.d_model} but the model has d_model {mcfg.d_model}; "
            "load the attention SAEs trained for this model."
        )
    if cfg.n_layers != mcfg.n_layers:
        raise TranscoderMismatchError(
            f"the attention SAEs cover {cfg.n_layers} layers but the model has {mcfg.n_layers}; "
            "a set must cover every layer of its model."
        )
    if ATTN_OUTPUT.format(layer=0) not in model.hook_dict:
        raise TranscoderMismatchError(f"this model has no {ATTN_OUTPUT!r} hooks to replace.")
    if not attn.per_token:
        raise TranscoderMismatchError(
            f"the attention SAE set ({cfg.activation}) is in training mode; call .eval() on it first."
        )
    if mlp is not None and cfg.model_name and mlp.cfg.model_name and cfg.model_name != mlp.cfg.model_name:
        raise TranscoderMismatchError(
            f"the attention SAEs were trained for model {cfg.model_name!r} but the MLP transcoders for "
            f"{mlp.cfg.model_name!r}; load both sets for the same model."
        )

"""Where a transcoder reads and writes in a TransformerLens model (docs/transcoder_interface.md, "Sites").

One convention, implemented once here and used by the trainer and the replacement model:

1. Read site `blocks.{l}.ln2.hook_normalized` means the MLP's input: ln2's output *including*
   its weight and bias, `normalized * ln2.w + ln2.b`, exactly what `blocks.{l}.mlp` receives
   (TransformerLens' hook fires before the weight; on `fold_ln` models the two are equal).
   Any other read hook means the literal hook value.
2. Write site `blocks.{l}.hook_mlp_out` is what the MLP block adds to the residual stream.
   With `output_before_post_norm=True` on a model with a post-MLP norm (Gemma-2 `ln2_post`)
   the transcoder's output is the MLP's raw output `mlp.hook_post @ W_out + b_out`, and it
   reaches `hook_mlp_out` through `ln2_post` with its scale frozen (`to_write_site`).
   Without a post-MLP norm the flag changes nothing. Any other write hook is literal.
3. `collect` runs the model once and returns the read values and write targets of every
   layer, stacked `[..., n_layers, d_model]`, ready for `tc(x)`.
4. A set records whether its model's norms were folded (`TranscoderConfig.folded_norms`):
   TransformerLens's `from_pretrained` folds them by default (and centers the writing weights),
   circuit-tracer and GemmaScope load the model without that processing. Both compute the same
   function, but the MLP input of one is `normalized`, of the other `normalized * w + b`: a set on
   the other kind reads other vectors (on the bundled model the graph's replacement score fell
   from 0.94 to 0.85, without a word). `check_fits` refuses the pair (`norms_folded`).
5. A set records its model's name (`TranscoderConfig.model_name`: its trainer's model, a
   sae_lens SAE's `metadata.model_name`, a circuit-tracer config's `model_name`). `check_fits`
   warns (`ModelNameWarning`) when both names are known and name other models after
   TransformerLens's aliases (`gpt2-small` is `gpt2`, `google/gemma-2-2b` is `gemma-2-2b`):
   another model of the same shape and hooks runs without any other sign. A warning, not a
   refusal: a base model's set on its instruction-tuned twin is a common, deliberate choice.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float, Int
from torch import Tensor

from transcoders.arguments import shown
from transcoders.block_layout import ATTN_OUTPUT as ATTN_OUTPUT  # defined there, re-exported
from transcoders.block_layout import MLP_INPUT as MLP_INPUT
from transcoders.block_layout import MLP_OUTPUT as MLP_OUTPUT
from transcoders.block_layout import BlockLayout
from transcoders.config import TranscoderConfig, is_whole
from transcoders.errors import ConfigError, ModelNameWarning, TranscoderMismatchError
from transcoders.model_state import check_dtype, check_no_hooks

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from transcoders.base import SparseCoder


def post_norm(model: HookedTransformer, layer: int):
    """The block's post-MLP norm module (`ln2_post`), or None when it has none."""
    return getattr(model.blocks[layer], "ln2_post", None)


def raw_output_needed(model: HookedTransformer, cfg: TranscoderConfig, layer: int) -> bool:
    """True when the write target is the MLP's output before a post-MLP norm."""
    return (
        cfg.output_before_post_norm and cfg.output_hook == MLP_OUTPUT and post_norm(model, layer) is not None
    )


def cache_hooks(model: HookedTransformer, cfg: TranscoderConfig) -> list[str]:
    """The hook names a cache must hold for `read_value`, `write_target` and `to_write_site`."""
    names, layout = [], BlockLayout.of(model.cfg)
    for l in range(cfg.n_layers):
        names.append(cfg.hook_in(l))
        if raw_output_needed(model, cfg, l):
            names += [layout.hook("mlp_post", l), layout.norm_scale("ln2_post", l)]
        else:
            names.append(cfg.hook_out(l))
    return list(dict.fromkeys(names))


def read_value(
    model: HookedTransformer, cache, layer: int, hook_template: str = MLP_INPUT
) -> Float[Tensor, "... d_model"]:
    """The value a transcoder reads at `layer`, from a TransformerLens cache (step 1)."""
    value = cache[hook_template.format(layer=layer)]
    if hook_template == MLP_INPUT:
        ln2 = model.blocks[layer].ln2
        if getattr(ln2, "w", None) is not None:
            value = value * ln2.w
        if getattr(ln2, "b", None) is not None:
            value = value + ln2.b
    return value


def mlp_input(model: HookedTransformer, cache, layer: int) -> Float[Tensor, "... d_model"]:
    """What `blocks.{layer}.mlp` receives, from a cache holding `blocks.{layer}.ln2.hook_normalized`."""
    check_hooked_model(model, ConfigError)
    if not is_whole(layer) or not 0 <= layer < model.cfg.n_layers:
        raise ConfigError(f"layer is {shown(layer)}; pass a layer of the model, 0..{model.cfg.n_layers - 1}.")
    name = MLP_INPUT.format(layer=layer)
    if not hasattr(cache, "__getitem__") or not hasattr(cache, "keys") or name not in cache.keys():
        raise ConfigError(
            f"cache is {shown(cache)}, which holds no {name}; pass the cache of model.run_with_cache(tokens)."
        )
    return read_value(model, cache, layer, MLP_INPUT)


def mlp_output_raw(model: HookedTransformer, cache, layer: int) -> Float[Tensor, "... d_model"]:
    """The MLP's output before any post-MLP norm: `mlp.hook_post @ W_out + b_out`."""
    mlp = model.blocks[layer].mlp
    return cache[BlockLayout.of(model.cfg).hook("mlp_post", layer)] @ mlp.W_out + mlp.b_out


def write_target(
    model: HookedTransformer, cache, layer: int, cfg: TranscoderConfig
) -> Float[Tensor, "... d_model"]:
    """What the transcoder's output of `layer` should equal (step 2)."""
    if raw_output_needed(model, cfg, layer):
        return mlp_output_raw(model, cache, layer)
    return cache[cfg.hook_out(layer)]


def to_write_site(model: HookedTransformer, cache, layer: int, out: Tensor, cfg: TranscoderConfig) -> Tensor:
    """Map a transcoder output of `layer` to the value of its write hook (the identity unless step 2's
    post-norm applies, where `ln2_post` runs with the scale from `cache` frozen)."""
    if not raw_output_needed(model, cfg, layer):
        return out
    norm = post_norm(model, layer)
    scale = cache[BlockLayout.of(model.cfg).norm_scale("ln2_post", layer)]
    if type(norm).__name__.startswith("LayerNorm"):
        out = out - out.mean(-1, keepdim=True)
    out = out / scale
    if getattr(norm, "w", None) is not None:
        out = out * norm.w
    if getattr(norm, "b", None) is not None:
        out = out + norm.b
    return out


@torch.no_grad()
def collect(
    model: HookedTransformer, tokens: Int[Tensor, "batch n_pos"], cfg: TranscoderConfig
) -> tuple[Float[Tensor, "batch n_pos n_layers d_model"], Float[Tensor, "batch n_pos n_layers d_model"]]:
    """Read values and write targets of every layer from one forward pass (step 3)."""
    check_hooked_model(model, ConfigError)
    if not isinstance(cfg, TranscoderConfig):
        raise ConfigError(
            f"cfg is a {type(cfg).__name__} ({shown(cfg)}); pass a set's TranscoderConfig (tc.cfg)."
        )
    if not isinstance(tokens, Tensor) or tokens.dim() != 2 or tokens.is_floating_point():
        raise ConfigError(
            f"tokens is {shown(tokens)}; pass token ids [batch, n_pos] (model.to_tokens(text))."
        )
    check_no_hooks(model, "enter the activations read: a set trained on, or dashboards of, the hooked model")
    check_dtype(model)
    names = set(cache_hooks(model, cfg))
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names, return_type=None)
    x = torch.stack([read_value(model, cache, l, cfg.input_hook) for l in range(cfg.n_layers)], dim=-2)
    y = torch.stack([write_target(model, cache, l, cfg) for l in range(cfg.n_layers)], dim=-2)
    return x, y


def is_hooked_model(model) -> bool:
    """Whether `model` is what both packages read: a TransformerLens `HookedTransformer`, by its
    `cfg` and hooks (a name or path passed where the loaded model goes is the likely mistake)."""
    return hasattr(model, "cfg") and hasattr(model, "hook_dict")


def norms_folded(model: HookedTransformer) -> bool | None:
    """Step 4: whether `model`'s norms have their weights folded into the next layer (TransformerLens's
    "LNPre" / "RMSPre"); None for a model without norms, where folding changes nothing."""
    kind = getattr(model.cfg, "normalization_type", None)
    return None if kind is None else str(kind).endswith("Pre")


UNNAMED = ("", "custom")
"""Model names that name no model (`TranscoderConfig`'s default; TransformerLens's for a config built by hand)."""


def canonical_model_name(name: str) -> str:
    """`name` as TransformerLens's alias map resolves it, its last path part, lower case (step 5)."""
    from transformer_lens.loading_from_pretrained import get_official_model_name

    try:
        name = get_official_model_name(name)
    except ValueError:  # not a TransformerLens name: a local folder, a model of our own
        pass
    return name.rstrip("/").rsplit("/", 1)[-1].lower()


def trained_for_another_model(model: HookedTransformer, cfg: TranscoderConfig) -> str | None:
    """Step 5's warning when the set `cfg` records another model's name than `model`'s, else None."""
    theirs, ours = str(cfg.model_name or ""), str(getattr(model.cfg, "model_name", "") or "")
    if theirs.lower() in UNNAMED or ours.lower() in UNNAMED:
        return None
    if canonical_model_name(theirs) == canonical_model_name(ours):
        return None
    return (
        f"these transcoders were trained for model {theirs!r}, but the model is {ours!r}: they fit its "
        "shapes and hooks, so a graph is built, of features learned on another model; load the set made "
        "for this model (or ignore this if the pairing is deliberate)."
    )


def check_hooked_model(model, error: type[Exception] = TranscoderMismatchError) -> None:
    """`error` in one line unless `model` is a TransformerLens `HookedTransformer` (`is_hooked_model`)."""
    if not is_hooked_model(model):
        raise error(
            f"the model is a {type(model).__name__}, not a TransformerLens HookedTransformer; pass the loaded model."
        )


def check_fits(model: HookedTransformer, tc: SparseCoder) -> None:
    """Raise `TranscoderMismatchError` unless the set `tc` fits `model` (d_model, n_layers, hooks)."""
    from transcoders.base import SparseCoder

    check_hooked_model(model)
    if not isinstance(tc, SparseCoder):
        raise TranscoderMismatchError(
            f"the transcoders are a {type(tc).__name__}, not a set; pass load_transcoders(...)'s result."
        )
    cfg: TranscoderConfig = tc.cfg
    mcfg = model.cfg
    if cfg.d_model != mcfg.d_model:
        raise TranscoderMismatchError(
            f"the transcoders have d_model {cfg.d_model} but the model has d_model {mcfg.d_model}; "
            "load the transcoders trained for this model."
        )
    if cfg.n_layers != mcfg.n_layers:
        raise TranscoderMismatchError(
            f"the transcoders cover {cfg.n_layers} layers but the model has {mcfg.n_layers}; "
            "a set must cover every layer of its model."
        )
    folded = norms_folded(model)
    if cfg.folded_norms is not None and folded is not None and folded != cfg.folded_norms:
        trained, given = ("folded", "unfolded") if cfg.folded_norms else ("unfolded", "folded")
        how = (
            "load it with TransformerLens's default processing: attrgraph.load_model(name, processing=True) "
            "(HookedTransformer.from_pretrained)"
            if cfg.folded_norms
            else "load it without weight processing: attrgraph.load_model(name) "
            "(HookedTransformer.from_pretrained_no_processing, as circuit-tracer does)"
        )
        raise TranscoderMismatchError(
            f"the transcoders were trained on the model with its norms {trained}, but this one has them "
            f"{given} (normalization_type {mcfg.normalization_type!r}): they would read other inputs than "
            f"they were trained on; {how}."
        )
    other = trained_for_another_model(model, cfg)
    if other is not None:
        warnings.warn(other, ModelNameWarning, stacklevel=3)
    hooks, layout = model.hook_dict, BlockLayout.of(mcfg)
    for l in range(cfg.n_layers):
        for name in (cfg.hook_in(l), cfg.hook_out(l)):
            if name not in hooks:
                raise TranscoderMismatchError(
                    f"hook {name!r} does not exist in this model; use one of its hook names "
                    f"(e.g. {MLP_INPUT.format(layer=l)!r}, {layout.mlp_reads(l)!r}, {MLP_OUTPUT.format(layer=l)!r})."
                )
        if raw_output_needed(model, cfg, l) and layout.hook("mlp_post", l) not in hooks:
            raise TranscoderMismatchError(
                f"output_before_post_norm needs {layout.hook('mlp_post', l)!r}, which this model lacks."
            )

"""sae_lens SAEs and transcoders (objects, or the directories `save_model` writes), read into a set.

sae_lens holds one layer per object: `W_enc` [d_in, d_sae] and `W_dec` [d_sae, d_out] are
already TransformerLens-oriented; the hook is `cfg.metadata.hook_name` (a transcoder's output
hook is `cfg.metadata.hook_name_out`). A set is one object per layer, any order, every layer
once. Conversion:

1. Architectures: "standard" / "transcoder" -> ReLU; "jumprelu" / "jumprelu_transcoder" ->
   JumpReLU (sae_lens computes `ReLU(h) * (h > threshold)`: the same for thresholds >= 0);
   "topk" -> TopK with `cfg.k`; "skip_transcoder" -> ReLU with `W_skip = W_skip_sl.T`
   (sae_lens adds `x @ W_skip_sl.T`). Others are refused with `UnknownFormatError`.
2. `apply_b_dec_to_input` (SAEs): `h = (x - b_dec) @ W_enc + b_enc`, folded into
   `b_enc - b_dec @ W_enc`.
3. Hooks `blocks.{i}.X` become the template `blocks.{layer}.X`. Note: a literal
   `ln2.hook_normalized` read site means *the MLP input* in our convention (sites.py); the two
   agree on fold_ln models, which is what sae_lens assumes.
4. Run-time input normalization other than "none" and `hook_z` reshaping are refused.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from transcoders.config import TranscoderConfig
from transcoders.errors import CorruptTranscoderError, TranscoderNotFoundError, UnknownFormatError
from transcoders.sites import MLP_OUTPUT

ACTIVATIONS = {
    "standard": ("relu", False),
    "transcoder": ("relu", False),
    "skip_transcoder": ("relu", True),
    "jumprelu": ("jumprelu", False),
    "jumprelu_transcoder": ("jumprelu", False),
    "topk": ("topk", False),
}


def _load_dir(path: Path):
    from sae_lens.saes.sae import SAE as SaeLensSAE

    if not (path / "cfg.json").is_file():
        raise TranscoderNotFoundError(
            f"{path} has no cfg.json; a sae_lens directory holds cfg.json and sae_weights.safetensors."
        )
    try:
        return SaeLensSAE.load_from_disk(str(path))
    except (OSError, ValueError, RuntimeError) as e:
        raise CorruptTranscoderError(
            f"{path} could not be read by sae_lens ({type(e).__name__}: {e})."
        ) from e


def _objects(items) -> list:
    if isinstance(items, str | os.PathLike):
        folder = Path(items)
        if (folder / "cfg.json").is_file():
            return [_load_dir(folder)]
        subdirs = sorted(p for p in folder.iterdir() if (p / "cfg.json").is_file())
        if not subdirs:
            raise TranscoderNotFoundError(
                f"{folder} holds no sae_lens directories (cfg.json + sae_weights.safetensors)."
            )
        return [_load_dir(p) for p in subdirs]
    return [_load_dir(Path(x)) if isinstance(x, str | os.PathLike) else x for x in items]


def _split_hook(name: str | None, what: str) -> tuple[int, str]:
    m = re.fullmatch(r"blocks\.(\d+)\.(.+)", name or "")
    if m is None:
        raise UnknownFormatError(
            f"sae_lens {what} {name!r} is not a per-layer hook 'blocks.<i>.<name>'; we cannot place it."
        )
    return int(m.group(1)), "blocks.{layer}." + m.group(2)


def load_sae_lens(
    items,
    output_hook: str | None = None,
    model_name: str = "",
    device="cpu",
    dtype: torch.dtype = torch.float32,
):
    """A set from sae_lens objects or directories (one per layer); see the module docstring."""
    from transcoders import build_transcoders
    from transcoders.formats.native import load_state

    saes = _objects(items)
    per_layer: dict[int, dict] = {}
    shared = None
    for sae in saes:
        cfg = sae.cfg
        arch = cfg.architecture()
        if arch not in ACTIVATIONS:
            raise UnknownFormatError(
                f"sae_lens architecture {arch!r} is not one we read; supported: {sorted(ACTIVATIONS)}."
            )
        if getattr(cfg, "normalize_activations", "none") != "none":
            raise UnknownFormatError(
                f"this sae_lens SAE normalizes its input at run time ({cfg.normalize_activations!r}); fold it first."
            )
        if getattr(cfg, "reshape_activations", "none") != "none":
            raise UnknownFormatError(
                "sae_lens hook_z SAEs (per-head inputs) are not supported; use an attn_out SAE."
            )
        layer, in_hook = _split_hook(cfg.metadata.hook_name, "hook_name")
        is_transcoder = "transcoder" in arch
        if is_transcoder:
            out_name = cfg.metadata.hook_name_out
            out_hook = _split_hook(out_name, "hook_name_out")[1] if out_name else (output_hook or MLP_OUTPUT)
        else:
            out_hook = in_hook
        activation, skip = ACTIVATIONS[arch]
        W_enc = sae.W_enc.detach().float().cpu()
        b_enc = sae.b_enc.detach().float().cpu()
        b_dec = sae.b_dec.detach().float().cpu()
        if not is_transcoder and cfg.apply_b_dec_to_input:
            b_enc = b_enc - b_dec @ W_enc
        state = {"W_enc": W_enc, "b_enc": b_enc, "W_dec": sae.W_dec.detach().float().cpu(), "b_dec": b_dec}
        if activation == "jumprelu":
            state["threshold"] = sae.threshold.detach().float().cpu()
        if skip:
            state["W_skip"] = sae.W_skip.detach().float().cpu().T
        key = (in_hook, out_hook, activation, skip, int(getattr(cfg, "k", 0) or 0), tuple(W_enc.shape))
        if shared is not None and key != shared:
            raise CorruptTranscoderError(
                f"sae_lens layer {layer} differs from the others ({key} vs {shared}); a set needs one kind."
            )
        shared = key
        if layer in per_layer:
            raise CorruptTranscoderError(f"two sae_lens objects are for layer {layer}; pass one per layer.")
        per_layer[layer] = state
    n_layers = max(per_layer) + 1
    missing = sorted(set(range(n_layers)) - set(per_layer))
    if missing:
        raise CorruptTranscoderError(
            f"no sae_lens object for layers {missing}; a set needs every layer from 0."
        )
    in_hook, out_hook, activation, skip, k, (d_model, d_sae) = shared
    cfg = TranscoderConfig(
        kind="sae" if in_hook == out_hook else "plt",
        n_layers=n_layers,
        d_model=d_model,
        d_sae=d_sae,
        activation=activation,
        input_hook=in_hook,
        output_hook=out_hook,
        skip=skip,
        k=k or 32,
        model_name=model_name or str(saes[0].cfg.metadata.model_name or ""),
    )
    state = {name: torch.stack([per_layer[l][name] for l in range(n_layers)]) for name in per_layer[0]}
    tc = build_transcoders(cfg)
    load_state(tc, state, "sae_lens objects")
    return tc.to(device=device, dtype=dtype)

"""EleutherAI sparsify transcoders (`SparseCoder.save_to_disk` folders) read into a set, and a TopK
set written as them.

sparsify trains on a Hugging Face model and names each coder by the module it replaces (its
"hookpoint", relative to the model's base: `layers.3.mlp` for Llama, Qwen, Gemma and Pythia,
`h.3.mlp` for GPT-2); a run, or a hub repository such as EleutherAI's skip transcoders, is one
folder per hookpoint holding `cfg.json` and `sae.safetensors`. Reading:

1. Which folders: `path` itself when it holds `cfg.json` + `sae.safetensors`, else its sub-folders
   that do. Each hookpoint must be an MLP, `<prefix>.{i}.mlp` (`HOOKPOINT`), with `"transcode":
   true` (the module's input predicts its output); a set needs every layer `i` from 0, once. A
   sparsify SAE (`transcode` false: it autoencodes the module's output) or a coder of another module
   (a residual stream `layers.3`, an attention block) is refused: the replacement model puts
   transcoders on MLPs.
2. Sites: an MLP module's input is its block's normalized residual stream with the norm's weight,
   our `MLP_INPUT` (sites.py step 1); its output is what the module returns, before a post-MLP norm
   where the model has one (Gemma-2's `post_feedforward_layernorm`), so `output_before_post_norm`
   is set (it changes nothing on models without one). The model sparsify trained on is Hugging
   Face's, norms unfolded: `folded_norms=False`.
3. The function, from `SparseCoder.encode` / `forward`: `acts = TopK_k(ReLU(x @ encoder.weight.T +
   encoder.bias))`, `out = acts @ W_dec + b_dec (+ x @ W_skip.T)`. So `W_enc = encoder.weight.T`,
   `b_enc = encoder.bias`, `W_dec`, `b_dec` as they are, `W_skip = W_skip_sf.T`; the activation by
   registry lookup of cfg.json's "activation" (nonlinearity.py step 13: "topk" is TopK with cfg.json's
   `k`; "groupmax" has no nonlinearity here and is refused). A cfg.json without "activation" or
   "transcode" (sparsify before 1.1) means TopK, and an SAE.
4. The set is allocated once, in the `dtype` asked for, and filled one layer's file at a time
   (a 131k-latent Llama-1B skip transcoder is 17 GB in bfloat16: never two copies, nor a float32
   one when bfloat16 is asked for); values convert straight from the file's precision.

Writing (`save_sparsify`, TopK transcoder sets: the one kind sparsify holds):

5. One folder per layer named by `hookpoint` (default `layers.{layer}.mlp`; GPT-2's is
   `h.{layer}.mlp`), written as `SparseCoder.save_to_disk` writes it: `cfg.json` (its fields, with
   `d_in`) and `sae.safetensors` (in the set's precision: a bfloat16 set is not doubled); step 3's
   tensors inverted. A set sparsify cannot hold
   (another nonlinearity, an SAE or CLT, other sites than the MLP's, a set on a model with folded
   norms) is refused before anything is written.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from transcoders.config import TranscoderConfig
from transcoders.errors import CorruptTranscoderError, TranscoderNotFoundError, UnknownFormatError, WriteError
from transcoders.formats.native import unreadable_safetensors
from transcoders.h5file import write_error
from transcoders.nonlinearity import sparsify_activations
from transcoders.output_folder import replaced
from transcoders.sites import MLP_INPUT, MLP_OUTPUT

if TYPE_CHECKING:
    from transcoders.base import SparseCoder

CFG, WEIGHTS = "cfg.json", "sae.safetensors"
HOOKPOINT = re.compile(r"(?:.+\.)?(\d+)\.mlp")
"""A hookpoint of an MLP module, capturing its layer (step 1): `layers.3.mlp`, `h.3.mlp`,
`model.layers.3.mlp`, `gpt_neox.layers.3.mlp`."""
ACTIVATIONS = sparsify_activations()
"""sparsify activation -> the nonlinearity that reads it (step 3)."""
TENSORS = ("encoder.weight", "encoder.bias", "W_dec", "b_dec")
FROM_SPARSIFY = {
    "encoder.weight": ("W_enc", True),
    "encoder.bias": ("b_enc", False),
    "W_dec": ("W_dec", False),
    "b_dec": ("b_dec", False),
    "W_skip": ("W_skip", True),
}
"""sparsify's tensor -> (ours, transposed) (step 3)."""


def is_sparsify_dir(folder: Path) -> bool:
    """Whether `folder` is one sparsify coder (`cfg.json` + `sae.safetensors`)."""
    return (folder / CFG).is_file() and (folder / WEIGHTS).is_file()


def holds_sparsify(folder: Path) -> bool:
    """Whether `folder` is a sparsify coder or holds some (step 1)."""
    return is_sparsify_dir(folder) or any(is_sparsify_dir(p) for p in folder.iterdir() if p.is_dir())


def _coder_dirs(folder: Path) -> list[Path]:
    if is_sparsify_dir(folder):
        return [folder]
    found = sorted(p for p in folder.iterdir() if p.is_dir() and is_sparsify_dir(p))
    if not found:
        raise TranscoderNotFoundError(f"{folder} holds no sparsify coders ({CFG} + {WEIGHTS} per hookpoint).")
    return found


def _read_cfg(path: Path) -> dict:
    try:
        cfg = json.loads((path / CFG).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CorruptTranscoderError(
            f"{path / CFG} is not readable JSON ({e}); the folder is damaged."
        ) from e
    if not isinstance(cfg, dict) or not isinstance(cfg.get("d_in"), int) or not isinstance(cfg.get("k"), int):
        raise CorruptTranscoderError(
            f"{path / CFG} lacks sparsify's integer d_in and k; it is not a sparsify coder's config."
        )
    return cfg


def _shapes(path: Path, skip: bool) -> dict[str, tuple[int, ...]]:
    """The shapes of a coder's tensors (step 3's names), read from the file's header alone."""
    names = (*TENSORS, "W_skip") if skip else TENSORS
    try:
        with safe_open(str(path / WEIGHTS), framework="pt") as f:
            missing = [n for n in names if n not in f.keys()]
            if missing:
                raise CorruptTranscoderError(
                    f"{path / WEIGHTS} lacks {missing}; a sparsify coder holds {list(names)}."
                )
            shapes = {n: tuple(f.get_slice(n).get_shape()) for n in names}
            dtypes = {n: f.get_slice(n).get_dtype() for n in names}
    except (OSError, SafetensorError) as e:
        raise unreadable_safetensors(path / WEIGHTS, e) from e
    floats = ("F16", "BF16", "F32", "F64")
    bad = [n for n, d in dtypes.items() if d not in floats]
    if bad:
        raise CorruptTranscoderError(
            f"{path / WEIGHTS}: {bad[0]} holds {dtypes[bad[0]]} values, not floating point; the file is damaged "
            "or not a sparsify coder."
        )
    return shapes


def _layer(path: Path, cfg: dict) -> int:
    m = HOOKPOINT.fullmatch(path.name)
    if m is None:
        raise UnknownFormatError(
            f"sparsify coder {path.name!r} is not of an MLP module ('<prefix>.<layer>.mlp', e.g. 'layers.3.mlp'); "
            "the replacement model puts transcoders on MLPs, so read sparsify transcoders of MLP modules."
        )
    if not cfg.get("transcode", False):
        raise UnknownFormatError(
            f"sparsify coder {path.name!r} is an SAE (transcode false: it autoencodes the MLP's output); "
            "attrgraph reads sparsify transcoders (transcode true), which predict the MLP's output from its input."
        )
    return int(m.group(1))


def load_sparsify(
    path: str | os.PathLike, model_name: str = "", device="cpu", dtype: torch.dtype = torch.float32
) -> SparseCoder:
    """A `PerLayerTranscoder` from sparsify transcoder folders; see the module docstring."""
    from transcoders.build import allocated

    per_layer: dict[int, tuple[Path, dict, dict[str, tuple[int, ...]]]] = {}
    for coder in _coder_dirs(Path(path)):
        cfg = _read_cfg(coder)
        layer = _layer(coder, cfg)
        if layer in per_layer:
            raise CorruptTranscoderError(
                f"{per_layer[layer][0].name!r} and {coder.name!r} are both for layer {layer}; keep one per layer."
            )
        per_layer[layer] = (coder, cfg, _shapes(coder, bool(cfg.get("skip_connection", False))))
    n_layers = max(per_layer) + 1
    missing = sorted(set(range(n_layers)) - set(per_layer))
    if missing:
        raise CorruptTranscoderError(
            f"{path} has no sparsify coder for layers {missing}; a set needs every layer."
        )
    first, cfg0, shapes0 = per_layer[0]
    kind = {key: cfg0.get(key) for key in ("activation", "k", "skip_connection", "d_in")}
    for coder, cfg, shapes in per_layer.values():
        differ = [f"{k} {cfg.get(k)!r} vs {v!r}" for k, v in kind.items() if cfg.get(k) != v]
        differ += [f"{n} {shapes[n]} vs {shapes0[n]}" for n in shapes0 if shapes[n] != shapes0[n]]
        if differ:
            raise CorruptTranscoderError(
                f"sparsify coder {coder.name!r} differs from {first.name!r} ({'; '.join(differ)}); a set needs one kind."
            )
    activation = cfg0.get("activation", next(iter(ACTIVATIONS)))  # before sparsify 1.1: TopK (step 3)
    if activation not in ACTIVATIONS:
        raise UnknownFormatError(
            f"sparsify activation {activation!r} is not one we read; supported: {sorted(ACTIVATIONS)}."
        )
    d_sae, d_in = shapes0["encoder.weight"]
    skip = bool(cfg0.get("skip_connection", False))
    expected = {
        "encoder.weight": (d_sae, d_in),
        "encoder.bias": (d_sae,),
        "W_dec": (d_sae, d_in),
        "b_dec": (d_in,),
    }
    expected |= {"W_skip": (d_in, d_in)} if skip else {}
    if d_in != cfg0["d_in"] or any(shapes0[n] != s for n, s in expected.items()):
        raise CorruptTranscoderError(
            f"{first / WEIGHTS}: its shapes ({', '.join(f'{n} {shapes0[n]}' for n in expected)}) do not fit "
            f"d_in {cfg0['d_in']}; sparsify's are encoder.weight and W_dec [num_latents, d_in], W_skip [d_in, d_in]."
        )
    cfg = TranscoderConfig(
        kind="plt",
        n_layers=n_layers,
        d_model=d_in,
        d_sae=d_sae,
        activation=ACTIVATIONS[activation].name,
        k=cfg0["k"],
        input_hook=MLP_INPUT,
        output_hook=MLP_OUTPUT,
        output_before_post_norm=True,
        skip=skip,
        model_name=model_name,
        folded_norms=False,
    )
    tc = allocated(cfg, dtype)  # once, in `dtype` (step 4)
    ours = dict(tc.named_parameters())
    assert set(ours) == {FROM_SPARSIFY[t][0] for t in expected}, "every tensor of the set is filled below"
    with torch.no_grad():
        for l in range(n_layers):  # one layer's tensors in memory at a time
            coder = per_layer[l][0]
            with safe_open(str(coder / WEIGHTS), framework="pt") as f:
                for theirs, (name, transpose) in FROM_SPARSIFY.items():
                    if theirs in expected:
                        t = f.get_tensor(theirs)
                        ours[name][l].copy_(t.T if transpose else t)
    return tc.to(device=device)


def save_sparsify(tc: SparseCoder, path: str | os.PathLike, hookpoint: str = "layers.{layer}.mlp") -> Path:
    """Write the TopK transcoder set `tc` as sparsify folders `hookpoint.format(layer=l)` (step 5)."""
    cfg: TranscoderConfig = tc.cfg
    activation = tc.nonlinearity.sparsify
    if activation is None or cfg.kind != "plt":
        what = f"{tc.nonlinearity.label} " if activation is None else ""
        raise UnknownFormatError(
            f"sparsify holds per-layer TopK transcoders, not a {what}{cfg.kind} set; save it in the native format."
        )
    if cfg.input_hook != MLP_INPUT or cfg.output_hook != MLP_OUTPUT:
        raise UnknownFormatError(
            f"sparsify's transcoders replace an MLP module (its input to its output), not {cfg.input_hook!r} -> "
            f"{cfg.output_hook!r}; save this set in the native format."
        )
    if cfg.folded_norms:
        raise UnknownFormatError(
            "sparsify reads a Hugging Face model, whose norms keep their weights, and this set was trained on a "
            "model with them folded (TransformerLens's default processing); save it in the native format."
        )
    names = [hookpoint.format(layer=l) for l in range(cfg.n_layers)]
    matches = [HOOKPOINT.fullmatch(n) for n in names]
    if any(m is None or int(m.group(1)) != l for l, m in enumerate(matches)):
        raise UnknownFormatError(
            f"hookpoint {hookpoint!r} does not name layer {{layer}}'s MLP module ('<prefix>.{{layer}}.mlp', "
            "e.g. 'layers.{layer}.mlp', GPT-2's 'h.{layer}.mlp')."
        )
    fields = {
        "activation": activation,
        "expansion_factor": max(1, cfg.d_sae // cfg.d_model),
        "normalize_decoder": False,
        "num_latents": cfg.d_sae,
        "k": cfg.k,
        "multi_topk": False,
        "skip_connection": tc.W_skip is not None,
        "transcode": True,
        "d_in": cfg.d_model,
    }

    def t(x: torch.Tensor) -> torch.Tensor:  # in the set's own precision
        return x.detach().cpu().contiguous().clone()

    folder = Path(path)
    for l, name in enumerate(names):
        tensors = {
            "encoder.weight": t(tc.W_enc[l].T),
            "encoder.bias": t(tc.b_enc[l]),
            "W_dec": t(tc.W_dec[l]),
            "b_dec": t(tc.b_dec[l]),
        }
        if tc.W_skip is not None:
            tensors["W_skip"] = t(tc.W_skip[l].T)
        out = folder / name
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise write_error(out, e, WriteError) from None
        with replaced(out / WEIGHTS) as tmp:  # each file whole or not at all; errors as WriteError
            save_file(tensors, str(tmp))
        with replaced(out / CFG) as tmp:
            tmp.write_text(json.dumps(fields))
    return folder

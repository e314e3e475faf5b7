"""GemmaScope `params.npz` files (one per layer), read into a set.

Each `params.npz` holds `W_enc` [d_model, d_sae] (already `x @ W_enc` orientation),
`W_dec` [d_sae, d_model], `b_enc` [d_sae], `b_dec` [d_model] and the `extra_state` of the one
nonlinearity whose `gemmascope` says these files hold it (nonlinearity.py step 13: JumpReLU,
`threshold` [d_sae]). A set is written as the nonlinearity it is `stored_as()` (BatchTopK:
JumpReLU); others are refused. GemmaScope transcoders read the MLP input (after the pre-MLP
RMSNorm and its weight) and write `hook_mlp_out`; residual-stream SAEs read and write one hook. A set is
either a list of files in layer order, or a directory whose files sit under `layer_{i}/`
(as on the Hugging Face hub: `layer_{i}/width_16k/average_l0_{n}/params.npz`) or are named
`layer_{i}.npz`.
"""

from __future__ import annotations

import os
import re
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch

from transcoders.config import TranscoderConfig
from transcoders.errors import CorruptTranscoderError, TranscoderNotFoundError, UnknownFormatError
from transcoders.nonlinearity import stored_with
from transcoders.output_folder import replaced
from transcoders.sites import MLP_INPUT, MLP_OUTPUT

if TYPE_CHECKING:
    from transcoders.base import SparseCoder

HELD = stored_with(("threshold",), lambda cls: cls.gemmascope)
"""The nonlinearity of GemmaScope's files (JumpReLU)."""
KEYS = ("W_enc", "W_dec", "b_enc", "b_dec", *HELD.extra_state)
NDIM = {"W_enc": 2, "W_dec": 2} | dict.fromkeys(KEYS[2:], 1)
"""How many axes each array of a layer's file has (the nonlinearity's extra state is per feature)."""


def gemmascope_files(folder: Path) -> list[Path]:
    """The per-layer npz files under `folder`, in layer order (raises when a layer is missing)."""
    found: dict[int, Path] = {}
    for p in sorted(folder.rglob("*.npz")):
        m = re.search(r"layer_(\d+)", str(p.relative_to(folder)))
        if m:
            layer = int(m.group(1))
            if layer in found:
                raise CorruptTranscoderError(
                    f"{folder} holds two npz files for layer {layer}; keep one per layer."
                )
            found[layer] = p
    if not found:
        raise TranscoderNotFoundError(f"{folder} holds no layer_{{i}} npz files; it is not a GemmaScope set.")
    n = max(found) + 1
    missing = sorted(set(range(n)) - set(found))
    if missing:
        raise CorruptTranscoderError(
            f"{folder} lacks GemmaScope files for layers {missing}; a set needs every layer."
        )
    return [found[i] for i in range(n)]


def _npy_header(f) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) from an .npy stream's header, reading no data (versions 1 and 2; a later one
    is read whole, to be exact rather than guess its header)."""
    version = np.lib.format.read_magic(f)
    read = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}.get(
        version
    )
    if read is None:
        f.seek(0)
        a = np.lib.format.read_array(f)
        return tuple(a.shape), a.dtype
    shape, _, dtype = read(f)
    return tuple(shape), np.dtype(dtype)


class NpzLayer:
    """One layer's `params.npz`: its arrays' shapes and dtypes from their headers when opened (each
    checked: present, floating, of GemmaScope's number of axes), each array read when asked for."""

    def __init__(self, path: Path):
        self.path = path
        headers = {}
        try:
            with zipfile.ZipFile(path) as z:
                members = {name.removesuffix(".npy"): name for name in z.namelist()}
                missing = [k for k in KEYS if k not in members]
                if missing:
                    raise CorruptTranscoderError(
                        f"{path} lacks {missing}; a GemmaScope params.npz holds {list(KEYS)}."
                    )
                for k in KEYS:
                    with z.open(members[k]) as f:
                        headers[k] = _npy_header(f)
        except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
            raise self._unreadable(e) from e
        for k, (shape, dtype) in headers.items():
            if dtype.kind != "f" or len(shape) != NDIM[k]:
                what = f"{dtype} values" if dtype.kind != "f" else f"{len(shape)} axes (shape {shape})"
                raise CorruptTranscoderError(
                    f"{path}: {k} holds {what}; GemmaScope's {k} is a {NDIM[k]}-D array of floats."
                )
        self.shapes = {k: shape for k, (shape, _) in headers.items()}

    def _unreadable(self, e: Exception) -> CorruptTranscoderError:
        return CorruptTranscoderError(
            f"{self.path} could not be read ({e}); the file is truncated or not an npz."
        )

    def read(self, key: str) -> torch.Tensor:
        """The array `key`, as float32, or float64 when the file holds float64."""
        try:
            with np.load(self.path) as z:
                a = np.asarray(z[key])
                return torch.from_numpy(a if a.dtype == np.float64 else a.astype(np.float32))
        except (zipfile.BadZipFile, OSError, ValueError, EOFError) as e:
            raise self._unreadable(e) from e


def load_gemmascope(
    paths: str | os.PathLike | list,
    input_hook: str = MLP_INPUT,
    output_hook: str = MLP_OUTPUT,
    model_name: str = "",
    device="cpu",
    dtype: torch.dtype = torch.float32,
    output_before_post_norm: bool = False,
):
    """A `PerLayerTranscoder` (or `SAE` when input_hook == output_hook) from GemmaScope files
    (`output_before_post_norm`: as `TranscoderConfig` has it; a circuit-tracer list's `mlp.hook_out`)."""
    from transcoders.build import allocated
    from transcoders.formats.native import LazyState, load_state

    files = (
        gemmascope_files(Path(paths)) if isinstance(paths, str | os.PathLike) else [Path(p) for p in paths]
    )
    layers = [NpzLayer(p) for p in files]  # headers now, each array when its key is stacked
    d_model, d_sae = layers[0].shapes["W_enc"]
    if layers[0].shapes["W_dec"] != (d_sae, d_model):
        raise CorruptTranscoderError(
            f"{files[0]}: W_enc has shape {layers[0].shapes['W_enc']} and W_dec "
            f"{layers[0].shapes['W_dec']}; GemmaScope's W_enc is [d_model, d_sae] and W_dec [d_sae, d_model]."
        )
    for k in KEYS:
        _check_same_shape(layers, k, files)
    state = LazyState({k: lambda k=k: torch.stack([layer.read(k) for layer in layers]) for k in KEYS})
    kind = "sae" if input_hook == output_hook else "plt"
    cfg = TranscoderConfig(
        kind=kind,
        n_layers=len(files),
        d_model=d_model,
        d_sae=d_sae,
        activation=HELD.name,
        input_hook=input_hook,
        output_hook=output_hook,
        model_name=model_name,
        output_before_post_norm=output_before_post_norm,
        folded_norms=False,  # trained on Hugging Face's Gemma-2, whose norms keep their weights
    )
    tc = allocated(cfg, dtype)
    load_state(tc, state, files[0].parent)
    return tc.to(device=device)


def _check_same_shape(layers: list[NpzLayer], key: str, files: list[Path]) -> None:
    shape = layers[0].shapes[key]
    for d, f in zip(layers, files, strict=True):
        if d.shapes[key] != shape:
            raise CorruptTranscoderError(f"{f}: {key} has shape {d.shapes[key]}, layer 0 has {shape}.")


def save_gemmascope(tc: SparseCoder, folder: str | os.PathLike) -> list[Path]:
    """Write `layer_{i}/params.npz` per layer (for tests and for interchange); returns the files."""
    if not tc.nonlinearity.stored_as().gemmascope or tc.cfg.kind == "clt":
        raise UnknownFormatError(
            f"GemmaScope files hold per-layer JumpReLU sets, not a {tc.cfg.kind} with {tc.cfg.activation}; "
            "save it in the native format."
        )
    if tc.cfg.folded_norms:
        raise UnknownFormatError(
            "GemmaScope sets read Gemma-2 with its norms unfolded, and this set was trained on a model with "
            "them folded (TransformerLens's default processing); save it in the native or sae_lens format."
        )
    out = []
    for l in range(tc.n_layers):
        path = Path(folder) / f"layer_{l}" / "params.npz"
        path.parent.mkdir(parents=True, exist_ok=True)
        arrays = {name: getattr(tc, name)[l] for name in KEYS}
        with replaced(path) as tmp:  # its name ends in .npz, so savez adds no suffix
            np.savez(tmp, **{k: _numpy(v) for k, v in arrays.items()})
        out.append(path)
    return out


def _numpy(x: torch.Tensor) -> np.ndarray:
    """A set's tensor for an npz: float64 as it is, any other precision as float32 (GemmaScope's;
    numpy has no bfloat16)."""
    x = x.detach().cpu()
    return (x if x.dtype == torch.float64 else x.float()).numpy()

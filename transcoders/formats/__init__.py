"""Load and save transcoder sets in every format we know.

`load_transcoders(name_or_path)` accepts, in this order:
1. a bundled name: "default-plt", "default-clt", "default-attn-sae" (the `data/` folders, offline);
2. a sae_lens SAE / transcoder object, or a list of them (one per layer, in layer order);
3. a directory in our format (`config.json` with "format": "attrgraph-transcoders");
4. a circuit-tracer directory (`config.yaml`, `layer_{i}.safetensors` or `W_enc_{i}.safetensors`);
5. a sae_lens directory (`cfg.json` + `sae_weights.safetensors`), or a directory / list of them;
6. an EleutherAI sparsify directory: one `<prefix>.{i}.mlp/` folder (`cfg.json` +
   `sae.safetensors`) per layer, as its trainer and the hub hold them (sparsify.py);
7. a GemmaScope directory of `layer_{i}/.../params.npz` (or `layer_{i}.npz`) files;
8. failing those, a Hugging Face hub reference (`owner/repo[/folder][@revision]`, `hf://...`, or
   circuit-tracer's "gemma" / "llama"): the folder huggingface_hub's cache holds (or downloads, where
   allowed), read as 3-7 (hub.py).
`format=` names one of them explicitly ("native", "circuit-tracer", "sae-lens", "sparsify", "gemmascope").

`save_transcoders(tc, path, format="native" | "circuit-tracer" | "sae-lens" | "sparsify" | "gemmascope")`.

What each nonlinearity is in a foreign format (its sae_lens architectures, whether circuit-tracer's or
GemmaScope's files hold it, what it is stored as, its extra tensors) lives with the nonlinearity
(nonlinearity.py step 13); the readers and writers here ask it, and never name an activation.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from transcoders.arguments import as_path
from transcoders.config import check_device, check_dtype
from transcoders.errors import (
    ConfigError,
    CorruptTranscoderError,
    NonFiniteError,
    StaleLayersError,
    TranscoderNotFoundError,
    UnknownFormatError,
)
from transcoders.formats.circuit_tracer import is_circuit_tracer, load_circuit_tracer, save_circuit_tracer
from transcoders.formats.gemmascope import load_gemmascope, save_gemmascope
from transcoders.formats.hub import fetch_file, fetch_folder, parse_hub_ref
from transcoders.formats.native import broken_json, is_native, load_native, save_native
from transcoders.formats.sparsify import holds_sparsify, load_sparsify, save_sparsify
from transcoders.output_folder import check_output_folder
from transcoders.paths import BUNDLED

if TYPE_CHECKING:
    from transcoders.base import SparseCoder

READ_FORMATS = ("native", "circuit-tracer", "sae-lens", "sparsify", "gemmascope")
WRITE_FORMATS = ("native", "circuit-tracer", "sae-lens", "sparsify", "gemmascope")


def _is_sae_lens_object(obj) -> bool:
    return type(obj).__module__.split(".")[0] == "sae_lens"


def _is_sae_lens_dir(folder: Path) -> bool:
    return (folder / "cfg.json").is_file() and (folder / "sae_weights.safetensors").is_file()


def detect_format(folder: Path) -> str:
    """The format of a directory, or `UnknownFormatError`."""
    if is_native(folder):
        return "native"
    if is_circuit_tracer(folder):
        return "circuit-tracer"
    if _is_sae_lens_dir(folder) or any(_is_sae_lens_dir(p) for p in folder.iterdir() if p.is_dir()):
        return "sae-lens"
    if holds_sparsify(folder):
        return "sparsify"
    if any(folder.rglob("*.npz")):
        return "gemmascope"
    why = broken_json(folder / "config.json")
    if why is not None:  # most likely ours, damaged: say where, not "no format"
        raise CorruptTranscoderError(why)
    raise UnknownFormatError(
        f"{folder} is in no format we read; expected our config.json, circuit-tracer's config.yaml / "
        "layer_{i}.safetensors, sae_lens cfg.json + sae_weights.safetensors, sparsify cfg.json + sae.safetensors, "
        "or GemmaScope params.npz files."
    )


def _hub_format(folder: Path, ref) -> str:
    """The format of a hub set's folder: any but GemmaScope's (hub.py `FETCHED`), else one line."""
    try:
        fmt = detect_format(folder)
    except UnknownFormatError:
        fmt = None
    if fmt is None or fmt == "gemmascope":
        raise UnknownFormatError(
            f"the hub reference {ref} holds no set of ours, circuit-tracer, sae_lens or sparsify; a GemmaScope "
            f"repository holds every width and L0 of each layer: pass a list of one hf://{ref.repo_id}/layer_{{i}}/"
            ".../params.npz per layer, or circuit-tracer's 'gemma'."
        )
    return fmt


def load_transcoders(
    name_or_path,
    format: str | None = None,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | str = torch.float32,
    **kwargs,
):
    """Return a transcoder set (`SAE`, `PerLayerTranscoder` or `CrossLayerTranscoder`); see the module docstring.

    `dtype` is a floating torch dtype or its name as TransformerLens takes it ("float32", "bf16", ...:
    `transcoders.config.check_dtype`); `device` one this machine has (`check_device`).

    Extra keyword arguments go to the format's reader (e.g. `input_hook=` for GemmaScope). The set is
    in eval mode (BatchTopK applies its per-token threshold; `.train()` switches to the batch rule).
    """
    check_device(device)  # a device or dtype this machine cannot use: one sentence, before anything loads
    dtype = check_dtype(dtype)
    tc = _load(name_or_path, format, device, dtype, **kwargs).eval()
    check_finite(tc, name_or_path)
    return tc


def check_finite(tc: SparseCoder, source) -> None:
    """Refuse a set holding NaN or inf (as a diverged training run leaves it, in any format, with or
    without a manifest; or a value past the range of `dtype`): `NonFiniteError` naming the first
    such tensor and how many of its values are not finite. Features of such a set would turn every
    activation, edge and score of a graph into NaN."""
    found = first_non_finite(tc.state_dict().items())
    if found is not None:
        name, bad, n = found
        where = source if isinstance(source, str | os.PathLike) else "the set given"
        raise NonFiniteError(
            f"{where}: {name} holds {bad} of {n} values that are NaN or inf (a diverged training run?); "
            "retrain or load an earlier checkpoint."
        )


def first_non_finite(tensors: Iterable[tuple[str, torch.Tensor]]) -> tuple[str, int, int] | None:
    """(name, how many values are NaN or inf, how many values) of the first floating tensor of
    `(name, tensor)` pairs holding NaN or inf, else None: the one test of weights a set's, a model
    folder's and a checkpoint's loaders make."""
    for name, value in tensors:
        if value.is_floating_point() and not bool(torch.isfinite(value).all()):
            return name, int((~torch.isfinite(value)).sum()), value.numel()
    return None


READER_OPTIONS = {
    "native": (),
    "circuit-tracer": (),
    "sae-lens": ("output_hook", "model_name"),
    "sparsify": ("model_name",),
    "gemmascope": ("input_hook", "output_hook", "model_name"),
}
"""The keyword arguments each format's reader takes beyond device and dtype (what its files do not say)."""


def _check_options(fmt: str, kwargs: dict) -> None:
    extra = sorted(set(kwargs) - set(READER_OPTIONS[fmt]))
    if extra:
        takes = ", ".join(READER_OPTIONS[fmt]) or "none"
        raise ConfigError(
            f"load_transcoders got {', '.join(f'{k}=' for k in extra)} which the {fmt} reader does not "
            f"take (it takes {takes}); leave {'it' if len(extra) == 1 else 'them'} out."
        )


def _load(name_or_path, format, device, dtype, **kwargs):
    from transcoders.formats import sae_lens as sl

    if format is not None and format not in READ_FORMATS:
        raise UnknownFormatError(f"format {format!r} is not one of {READ_FORMATS}; pick one or leave it out.")
    if isinstance(name_or_path, list | tuple) or _is_sae_lens_object(name_or_path):
        items = list(name_or_path) if isinstance(name_or_path, list | tuple) else [name_or_path]
        bad = [x for x in items if not (isinstance(x, str | os.PathLike) or _is_sae_lens_object(x))]
        if not items or bad:
            raise ConfigError(
                f"a list of transcoders holds {type(bad[0]).__name__ if bad else 'nothing'}; pass one sae_lens "
                "SAE (or its directory, or a GemmaScope params.npz, or its hf:// file) per layer, in layer order."
            )
        if format is None and all(
            isinstance(x, str | os.PathLike) and str(x).endswith(".npz") for x in items
        ):
            format = "gemmascope"
        _check_options(format or "sae-lens", kwargs)
        items = [
            fetch_file(x, "the list given") if isinstance(x, str) and x.startswith("hf://") else x
            for x in items
        ]
        if format == "gemmascope":
            return load_gemmascope(items, device=device, dtype=dtype, **kwargs)
        return sl.load_sae_lens(items, device=device, dtype=dtype, **kwargs)
    key = str(name_or_path)
    folder = BUNDLED.get(key, Path(key))
    ref = None
    if not folder.exists():
        ref = parse_hub_ref(key) if isinstance(name_or_path, str) else None
        if ref is None:
            raise TranscoderNotFoundError(
                f"no transcoders at {folder}; pass 'default-plt', 'default-clt', 'default-attn-sae', a directory "
                "in a format we read, or a Hugging Face hub reference (owner/repo[/folder][@revision])."
            )
        folder = fetch_folder(ref)
    if folder.is_file():
        if folder.suffix == ".npz":
            _check_options("gemmascope", kwargs)
            return load_gemmascope([folder], device=device, dtype=dtype, **kwargs)
        raise UnknownFormatError(f"{folder} is a file; pass the directory that holds it (and its config).")
    if not folder.is_dir():  # a device, a FIFO, a socket
        raise UnknownFormatError(f"{folder} is neither a directory nor a file; pass the directory of a set.")
    fmt = format or (detect_format(folder) if ref is None else _hub_format(folder, ref))
    _check_options(fmt, kwargs)
    if fmt == "native":
        return load_native(folder, device=device, dtype=dtype)
    if fmt == "circuit-tracer":
        return load_circuit_tracer(folder, device=device, dtype=dtype)
    if fmt == "sae-lens":
        return sl.load_sae_lens(folder, device=device, dtype=dtype, **kwargs)
    if fmt == "sparsify":
        return load_sparsify(folder, device=device, dtype=dtype, **kwargs)
    return load_gemmascope(folder, device=device, dtype=dtype, **kwargs)


def save_transcoders(tc: SparseCoder, path: str | os.PathLike, format: str = "native") -> Path:
    """Write `tc` to the directory `path` in `format` ("native", "circuit-tracer", "sae-lens", "sparsify" or
    "gemmascope")."""
    from transcoders.base import SparseCoder
    from transcoders.formats.sae_lens import save_sae_lens

    if not isinstance(tc, SparseCoder):
        raise ConfigError(
            f"the set to save is a {type(tc).__name__}, not a transcoder set (SAE, PerLayerTranscoder or "
            "CrossLayerTranscoder); pass one, as load_transcoders or build_transcoders returns it."
        )
    if format not in WRITE_FORMATS:
        raise UnknownFormatError(f"format {format!r} is not one of {WRITE_FORMATS}; pick one of them.")
    path = as_path(path, "path", ConfigError)
    check_output_folder(path, ConfigError)  # a file there, or no write permission: before writing
    _check_no_stale_layers(Path(path), tc.cfg.n_layers)
    if format == "native":
        return save_native(tc, path)
    if format == "circuit-tracer":
        return save_circuit_tracer(tc, path)
    if format == "sae-lens":
        return save_sae_lens(tc, path)
    if format == "sparsify":
        return save_sparsify(tc, path)
    save_gemmascope(tc, path)
    return Path(path)


_LAYER_FILE = re.compile(r"(?:layer_|W_enc_|W_dec_)(\d+)(?:\.\w+)?")


def _check_no_stale_layers(folder: Path, n_layers: int) -> None:
    """Refuse to write into a folder holding per-layer files of layers >= n_layers: a reader would
    take them for part of the new set."""
    if not folder.is_dir():
        return
    stale = sorted(
        p.name
        for p in folder.iterdir()
        if (m := _LAYER_FILE.fullmatch(p.name)) and int(m.group(1)) >= n_layers
    )
    if stale:
        raise StaleLayersError(
            f"{folder} already holds {stale[:3]} from a larger set; save into an empty folder or remove them."
        )


__all__ = ["READ_FORMATS", "WRITE_FORMATS", "detect_format", "load_transcoders", "save_transcoders"]

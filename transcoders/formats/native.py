"""Our on-disk format: a directory with `config.json` and `weights.safetensors`. No pickles.

config.json:  {"format": "attrgraph-transcoders", "format_version": 1, "config": TranscoderConfig}
weights.safetensors, TransformerLens orientation (docs/transcoder_interface.md):
    W_enc [n_layers, d_model, d_sae], b_enc [n_layers, d_sae], b_dec [n_layers, d_model],
    threshold [n_layers, d_sae] (JumpReLU), W_skip [n_layers, d_model, d_model] (skip),
    W_dec [n_layers, d_sae, d_model] (SAE/PLT) or W_dec.{l} [d_sae, n_layers - l, d_model] (CLT).
manifest.json (optional): sha256 of files under "files", checked on load.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from transcoders.config import TranscoderConfig
from transcoders.errors import ConfigError, CorruptTranscoderError, TranscoderNotFoundError
from transcoders.manifest import verify_manifest
from transcoders.output_folder import replaced

if TYPE_CHECKING:
    from transcoders.base import SparseCoder

FORMAT_NAME = "attrgraph-transcoders"
FORMAT_VERSION = 1
WEIGHTS = "weights.safetensors"


def is_native(folder: Path) -> bool:
    path = folder / "config.json"
    if not path.is_file():
        return False
    try:
        return json.loads(path.read_text()).get("format") == FORMAT_NAME
    except (json.JSONDecodeError, UnicodeDecodeError, AttributeError):
        return False


def broken_json(path: Path) -> str | None:
    """Why `path` (an existing file) is not JSON text, with the line and column, or None when it is
    (or is missing): the reason a folder whose config.json is damaged is in no format we read."""
    if not path.is_file():
        return None
    try:
        json.loads(path.read_bytes())
    except UnicodeDecodeError as e:
        return f"{path} is not UTF-8 text (byte {e.start}); config.json must be JSON text."
    except json.JSONDecodeError as e:
        return f"{path} is not valid JSON: {e.msg} at line {e.lineno}, column {e.colno}; fix or rewrite it."
    return None


def _read_config(folder: Path) -> dict:
    if not (folder / "config.json").is_file():
        raise TranscoderNotFoundError(
            f"{folder} has no config.json file; a transcoder directory in our format holds config.json "
            f"and {WEIGHTS} (or leave format= out to read another format)."
        )
    why = broken_json(folder / "config.json")
    if why is not None:
        raise CorruptTranscoderError(why)
    meta = json.loads((folder / "config.json").read_text())
    if not isinstance(meta, dict):
        raise CorruptTranscoderError(
            f"{folder / 'config.json'} is not a JSON object; rewrite it with save_transcoders."
        )
    return meta


def save_native(tc: SparseCoder, path: str | os.PathLike) -> Path:
    """Write `tc` to the directory `path` (created); returns the directory."""
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu().clone() for k, v in tc.state_dict().items()}
    with replaced(folder / WEIGHTS) as tmp:
        save_file(state, str(tmp), metadata={"format": FORMAT_NAME, "format_version": str(FORMAT_VERSION)})
    _write_config(folder, tc.cfg)
    return folder


def _write_config(folder: Path, cfg: TranscoderConfig) -> None:
    meta = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "config": cfg.to_dict()}
    with replaced(folder / "config.json") as tmp:
        tmp.write_text(json.dumps(meta, indent=1) + "\n")


_DTYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64"}


def save_native_streamed(
    cfg: TranscoderConfig,
    shapes: dict[str, tuple[int, ...]],
    tensors: Iterable[tuple[str, torch.Tensor]],
    path: str | os.PathLike,
    dtype: torch.dtype = torch.float32,
) -> Path:
    """`save_native` for a set that arrives one tensor at a time (feature-sharded training gathers
    it so, distributed.py `gathered_tensors`): the same files, holding one tensor at a time.

    `shapes` gives every tensor's shape up front (the safetensors header precedes the data);
    `tensors` yields `(name, tensor)` in `sorted(shapes)` order, each written as it comes."""
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    code, size = _DTYPES[dtype], torch.empty((), dtype=dtype).element_size()
    header: dict = {"__metadata__": {"format": FORMAT_NAME, "format_version": str(FORMAT_VERSION)}}
    offset = 0
    for name in sorted(shapes):
        n = size * math.prod(shapes[name])
        header[name] = {"dtype": code, "shape": list(shapes[name]), "data_offsets": [offset, offset + n]}
        offset += n
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)  # the data starts 8-byte aligned, as safetensors writes it
    with replaced(folder / WEIGHTS) as tmp, open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        names = iter(sorted(shapes))
        for name, t in tensors:
            want = next(names, None)
            if name != want or tuple(t.shape) != tuple(shapes[name]):
                got = f"{name!r} {tuple(t.shape)}"
                raise ValueError(f"expected tensor {want!r} of shape {shapes.get(want)}, got {got}")
            f.write(t.detach().to("cpu", dtype).contiguous().reshape(-1).view(torch.uint8).numpy().data)
        if (left := next(names, None)) is not None:
            raise ValueError(f"tensor {left!r} never came; the weights file is incomplete")
    _write_config(folder, cfg)
    return folder


def load_native(path: str | os.PathLike, device="cpu", dtype: torch.dtype = torch.float32):
    """Read a directory written by `save_native`."""
    from transcoders.build import allocated

    folder = Path(path)
    meta = _read_config(folder)
    version = meta.get("format_version")
    if version != FORMAT_VERSION:
        raise CorruptTranscoderError(
            f"{folder / 'config.json'} has format_version {version}; this library reads version {FORMAT_VERSION}."
        )
    if not isinstance(meta.get("config"), dict):
        raise CorruptTranscoderError(
            f'{folder / "config.json"} holds no "config" object (the set\'s TranscoderConfig); rewrite '
            "it with save_transcoders."
        )
    try:
        cfg = TranscoderConfig.from_dict(meta["config"])
    except ConfigError as e:  # an edited or foreign config.json: say which file
        raise ConfigError(f"{folder / 'config.json'}: {e}") from e
    weights = folder / WEIGHTS
    if not weights.exists():
        raise TranscoderNotFoundError(
            f"{weights} is missing; a transcoder directory needs config.json and {WEIGHTS}."
        )
    verify_manifest(folder, TranscoderNotFoundError, CorruptTranscoderError)
    tc = allocated(cfg, dtype)
    load_state(tc, SafetensorsFile(weights), weights)  # one tensor of the file in memory at a time
    return tc.to(device=device)


class SafetensorsFile(Mapping):
    """A safetensors file as a read-only mapping whose tensors are read when asked for, one at a time
    (what `load_state` takes); a truncated or foreign file is `CorruptTranscoderError`."""

    def __init__(self, path: Path):
        self.path = path
        with self._open() as f:
            self._keys = list(f.keys())

    def _open(self):
        try:
            return safe_open(str(self.path), framework="pt")
        except (SafetensorError, OSError, ValueError, RuntimeError) as e:
            raise unreadable_safetensors(self.path, e) from e

    def __getitem__(self, key: str) -> torch.Tensor:
        if key not in self._keys:
            raise KeyError(key)
        with self._open() as f:
            try:
                return f.get_tensor(key)
            except (SafetensorError, OSError, ValueError, RuntimeError) as e:
                raise unreadable_safetensors(self.path, e) from e

    def __contains__(self, key) -> bool:  # Mapping's own would read the tensor
        return key in self._keys

    def __iter__(self):
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


class LazyState(Mapping):
    """A set's tensors by name, each made only when asked for (a reader stacking per-layer files), so
    that `load_state` holds one at a time beside the set."""

    def __init__(self, makers: dict[str, Callable[[], torch.Tensor]]):
        self._makers = makers

    def __getitem__(self, key: str) -> torch.Tensor:
        return self._makers[key]()

    def __iter__(self):
        return iter(self._makers)

    def __len__(self) -> int:
        return len(self._makers)


def unreadable_safetensors(path: Path, e: Exception) -> CorruptTranscoderError:
    return CorruptTranscoderError(
        f"{path} could not be read ({e}); the file is truncated or not safetensors."
    )


def load_state(tc: SparseCoder, state: Mapping[str, torch.Tensor], source, layer: int | None = None) -> None:
    """`tc.load_state_dict(state)`, tensor by tensor into `tc`'s own memory (so a `SafetensorsFile`
    is read one tensor at a time, each converted straight to `tc`'s dtype), with missing keys, wrong
    shapes and non-floating values reported as `CorruptTranscoderError`. With `layer`, `state` holds
    one layer's tensors, each copied into its tensor's `[layer]` slice."""
    want = tc.state_dict()  # views of tc's parameters: copying into them fills tc
    missing = sorted(set(want) - set(state))
    unexpected = sorted(set(state) - set(want))
    if missing or unexpected:
        raise CorruptTranscoderError(
            f"{source} does not fit its config: missing {missing[:4]}, unexpected {unexpected[:4]}."
        )
    with torch.no_grad():
        for k in want:
            v, into = state[k], want[k] if layer is None else want[k][layer]
            check_floating(k, v, source)
            if tuple(v.shape) != tuple(into.shape):
                raise CorruptTranscoderError(
                    f"{source}: {k} has shape {tuple(v.shape)} but the config needs {tuple(into.shape)}."
                )
            into.copy_(v)


def check_floating(name: str, value: torch.Tensor, source) -> None:
    """Refuse a tensor of a set that is not floating point (integers or booleans where weights
    belong: a foreign or damaged file), which loading would cast silently."""
    if not value.is_floating_point():
        raise CorruptTranscoderError(
            f"{source}: {name} holds {str(value.dtype).removeprefix('torch.')} values, not floating point; "
            "a set's tensors are weights (float32, bfloat16, ...): the file is damaged or not a transcoder set."
        )

"""The set class of each kind, and an untrained set of one: `build_transcoders(cfg)`; `allocated(cfg,
dtype)` is the one a reader fills."""

from __future__ import annotations

import torch

from transcoders.base import SparseCoder
from transcoders.clt import CrossLayerTranscoder
from transcoders.config import TranscoderConfig
from transcoders.errors import ConfigError
from transcoders.plt import PerLayerTranscoder
from transcoders.sae import SAE

CLASSES: dict[str, type[SparseCoder]] = {"sae": SAE, "plt": PerLayerTranscoder, "clt": CrossLayerTranscoder}


def build_transcoders(cfg: TranscoderConfig) -> SparseCoder:
    """An untrained (zero) set of the class `cfg.kind` names; call `.init_weights()` to initialize."""
    if not isinstance(cfg, TranscoderConfig):
        raise ConfigError(
            f"cfg is a {type(cfg).__name__}, not a TranscoderConfig; pass TranscoderConfig(**fields) "
            "(or TranscoderConfig.from_dict(d) for a saved config)."
        )
    return CLASSES[cfg.kind](cfg)


def allocated(cfg: TranscoderConfig, dtype: torch.dtype = torch.float32) -> SparseCoder:
    """The set `cfg` describes on the CPU, its memory allocated once in `dtype` and left uninitialized
    (built on the meta device): for a reader that fills every tensor (formats/native.py `load_state`).
    A set read in bfloat16 so never exists in float32 beside it, nor as zeros first."""
    with torch.device("meta"):
        tc = build_transcoders(cfg)
    return tc.to(dtype).to_empty(device="cpu")


def feature_dims_of(cfg: TranscoderConfig) -> dict[str, int | None]:
    """`feature_dims()` of the set `cfg` describes, built on the meta device (no memory, no values):
    for reading a checkpoint's slices before any set exists."""
    with torch.device("meta"):
        return build_transcoders(cfg).feature_dims()

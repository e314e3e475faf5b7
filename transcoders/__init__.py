"""transcoders: SAEs, per-layer and cross-layer transcoders; training, and loaders for other formats.

Public API:
  TranscoderConfig                          config.py
  SAE, PerLayerTranscoder, CrossLayerTranscoder, TranscoderOutput   sae.py, plt.py, clt.py, base.py
  build_transcoders(cfg)                    an untrained set of the class cfg.kind names
  check_fits(model, tc), collect, mlp_input sites.py
  load_transcoders, save_transcoders        formats/
"""

from transcoders.base import SparseCoder, TranscoderOutput
from transcoders.clt import CrossLayerTranscoder
from transcoders.config import TranscoderConfig
from transcoders.errors import (
    ConfigError,
    CorruptTranscoderError,
    NonFiniteError,
    StaleLayersError,
    TranscoderError,
    TranscoderMismatchError,
    TranscoderNotFoundError,
    UnknownFormatError,
)
from transcoders.formats import load_transcoders, save_transcoders
from transcoders.plt import PerLayerTranscoder
from transcoders.sae import SAE
from transcoders.sites import check_fits, collect, mlp_input

CLASSES = {"sae": SAE, "plt": PerLayerTranscoder, "clt": CrossLayerTranscoder}


def build_transcoders(cfg: TranscoderConfig) -> SparseCoder:
    """An untrained (zero) set of the class `cfg.kind` names; call `.init_weights()` to initialize."""
    return CLASSES[cfg.kind](cfg)


__all__ = [
    "CLASSES",
    "SAE",
    "ConfigError",
    "CorruptTranscoderError",
    "CrossLayerTranscoder",
    "NonFiniteError",
    "PerLayerTranscoder",
    "SparseCoder",
    "StaleLayersError",
    "TranscoderConfig",
    "TranscoderError",
    "TranscoderMismatchError",
    "TranscoderNotFoundError",
    "TranscoderOutput",
    "UnknownFormatError",
    "build_transcoders",
    "check_fits",
    "collect",
    "load_transcoders",
    "save_transcoders",
    "mlp_input",
]

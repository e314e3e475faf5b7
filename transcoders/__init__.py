"""transcoders: SAEs, per-layer and cross-layer transcoders; training, and loaders for other formats.

Public API:
  TranscoderConfig                          config.py
  SAE, PerLayerTranscoder, CrossLayerTranscoder, TranscoderOutput   sae.py, plt.py, clt.py, base.py
  build_transcoders(cfg)                    an untrained set of the class cfg.kind names
  check_fits(model, tc), collect, mlp_input sites.py
  load_transcoders, save_transcoders        formats/
  compute_dashboards, DashboardConfig       dashboards.py (feature dashboards, `python -m transcoders.dashboards`)
  load_dashboards, set_labels               dashboard_file.py (the HDF5 file; user labels)
  compute_coactivation, Coactivation, CoactivationAccumulator, flat_index   coactivation.py (pair statistics)
"""

from transcoders.base import SparseCoder, TranscoderOutput
from transcoders.clt import CrossLayerTranscoder
from transcoders.coactivation import Coactivation, CoactivationAccumulator, compute_coactivation, flat_index
from transcoders.config import TranscoderConfig
from transcoders.dashboard_file import load_dashboards, set_labels
from transcoders.errors import (
    ConfigError,
    CorruptTranscoderError,
    DashboardFileError,
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

# lazy, so that `python -m transcoders.dashboards` runs the module fresh as __main__
_LAZY = {"compute_dashboards", "DashboardConfig"}


def __getattr__(name):
    if name in _LAZY:
        from transcoders import dashboards

        return getattr(dashboards, name)
    raise AttributeError(f"module 'transcoders' has no attribute {name!r}")


CLASSES = {"sae": SAE, "plt": PerLayerTranscoder, "clt": CrossLayerTranscoder}


def build_transcoders(cfg: TranscoderConfig) -> SparseCoder:
    """An untrained (zero) set of the class `cfg.kind` names; call `.init_weights()` to initialize."""
    return CLASSES[cfg.kind](cfg)


__all__ = [
    "CLASSES",
    "Coactivation",
    "CoactivationAccumulator",
    "compute_coactivation",
    "flat_index",
    "SAE",
    "ConfigError",
    "CorruptTranscoderError",
    "CrossLayerTranscoder",
    "DashboardConfig",
    "DashboardFileError",
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
    "compute_dashboards",
    "load_dashboards",
    "set_labels",
    "load_transcoders",
    "save_transcoders",
    "mlp_input",
]

"""transcoders: SAEs, per-layer and cross-layer transcoders; training, and loaders for other formats.

Public API:
  TranscoderConfig                          config.py
  SAE, PerLayerTranscoder, CrossLayerTranscoder, TranscoderOutput   sae.py, plt.py, clt.py, base.py
  build_transcoders(cfg), CLASSES           an untrained set of the class cfg.kind names (build.py)
  check_fits(model, tc), collect, mlp_input sites.py
  load_transcoders, save_transcoders        formats/
  compute_dashboards, DashboardConfig       dashboards.py (feature dashboards, `python -m transcoders.dashboards`)
  load_dashboards, set_labels, dashboard_text   dashboard_file.py (the HDF5 file; user labels; text form)
  compute_coactivation, Coactivation, CoactivationAccumulator, flat_index   coactivation.py (pair statistics)
  AttrgraphError, TranscoderError, ...      errors.py (AttrgraphError: the root of both packages' errors)
"""

import importlib
import warnings

# transformer_lens imports tqdm.auto, which in a Jupyter kernel without ipywidgets warns "IProgress not
# found" and then uses the text bar it would use anyway: the warning says nothing to a user of this
# package, and in a notebook it was the first output. Only that message from tqdm is filtered.
warnings.filterwarnings("ignore", message="IProgress not found", module="tqdm")

# Public names, imported on first use (`__getattr__`), so that `import transcoders.errors` or
# `transcoders.h5file` loads neither torch nor the set classes (attrgraph's torch-free graph store and
# errors import them), and `python -m transcoders.dashboards` runs that module fresh as __main__.
_EXPORTS = {
    "transcoders.base": ["SparseCoder", "TranscoderOutput"],
    "transcoders.build": ["CLASSES", "build_transcoders"],
    "transcoders.clt": ["CrossLayerTranscoder"],
    "transcoders.coactivation": [
        "Coactivation",
        "CoactivationAccumulator",
        "compute_coactivation",
        "flat_index",
    ],
    "transcoders.config": ["TranscoderConfig"],
    "transcoders.dashboard_file": ["dashboard_text", "load_dashboards", "set_labels"],
    "transcoders.dashboards": ["DashboardConfig", "compute_dashboards"],
    "transcoders.errors": [
        "AttrgraphError",
        "ConfigError",
        "CorruptCheckpointError",
        "CorruptTranscoderError",
        "DashboardFileError",
        "ModelNameWarning",
        "ModelStateError",
        "NonFiniteError",
        "RunBusyError",
        "StaleLayersError",
        "StalledRankError",
        "Terminated",
        "TranscoderError",
        "TranscoderMismatchError",
        "TranscoderNotFoundError",
        "UndeclaredFeatureAxisError",
        "UnknownFormatError",
        "WriteError",
    ],
    "transcoders.formats": ["load_transcoders", "save_transcoders"],
    "transcoders.plt": ["PerLayerTranscoder"],
    "transcoders.sae": ["SAE"],
    "transcoders.sites": ["check_fits", "collect", "mlp_input"],
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'transcoders' has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))

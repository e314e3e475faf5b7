"""attrgraph: exact attribution graphs and component circuits for transformers.

Public API (each name re-exported here; see the modules for the math):
  load_model       bundled / local / TransformerLens models   (loading.py)
"""

from attrgraph.errors import AttrgraphError, ChecksumError, CorruptWeightsError, ModelNotFoundError, PromptError
from attrgraph.loading import load_model

__version__ = "0.1.0"

__all__ = [
    "AttrgraphError",
    "ChecksumError",
    "CorruptWeightsError",
    "ModelNotFoundError",
    "PromptError",
    "load_model",
]

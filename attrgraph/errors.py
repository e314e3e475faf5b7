"""Exceptions raised for a user's mistake: one sentence saying what is wrong and what to do."""


class AttrgraphError(Exception):
    """Base class of every error attrgraph raises on purpose."""


class ModelNotFoundError(AttrgraphError, FileNotFoundError):
    """A model name or path that names nothing loadable."""


class ChecksumError(AttrgraphError):
    """A bundled file whose sha256 differs from its manifest."""


class CorruptWeightsError(AttrgraphError):
    """A weights file that is truncated, unreadable or of the wrong shapes."""


class PromptError(AttrgraphError, ValueError):
    """A prompt that is empty, too long, or otherwise unusable."""


class PromptWarning(UserWarning):
    """A prompt that runs but may not say what was meant: unknown words, or cut to the context."""


class GraphError(AttrgraphError, ValueError):
    """A graph whose arrays break the documented layout (shapes, node order)."""


class GraphFileError(AttrgraphError, OSError):
    """A graph file that is missing, not HDF5, truncated, or lacks the graph asked for."""


class SchemaVersionError(GraphFileError):
    """A graph file written with a storage schema this version cannot read."""


class UnsupportedModelError(AttrgraphError, ValueError):
    """A model the engine cannot represent exactly (a logit soft-cap) or a component graph does not cover (parallel blocks, ALiBi, ...)."""


class TargetError(AttrgraphError, ValueError):
    """An attribution target that names an unknown token, hook or position."""

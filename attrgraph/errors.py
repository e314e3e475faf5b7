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

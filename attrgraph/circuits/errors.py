"""Exceptions for component-circuit discovery: one sentence saying what is wrong and what to do."""

from attrgraph.errors import AttrgraphError, UnsupportedModelError  # noqa: F401  (re-exported: one class for both engines)


class PairLengthError(AttrgraphError, ValueError):
    """A corrupted prompt whose length differs from its clean pair."""


class ConstantMetricError(AttrgraphError, ValueError):
    """A metric that takes the same value whatever the model does, so no edge can matter."""


class SparsityError(AttrgraphError, ValueError):
    """A target sparsity (or kept fraction) outside the open interval (0, 1)."""


class SchemaError(AttrgraphError, ValueError):
    """A dataset schema that does not fit its examples (missing spans, overlaps, bad positions)."""

"""Checks of the arguments of public functions, shared by both packages, so that a value of the
wrong type is one sentence of the package's own error rather than a TypeError from deep inside.

1. `shown(value)`: a value as an error message quotes it, on one line (a Graph's or a model's
   repr runs over many).
2. `as_path(value, what, error)`: a file argument as a `Path`; anything but a str or an
   `os.PathLike` (None, a number, a loaded graph) raises `error`, naming `what`.
3. `is_numbers(values)`: whether an array argument (a list, an ndarray) holds numbers.
4. `check_real(value, what, error, low, high)`: a real number (`is_real`: never a bool, a string
   or NaN) inside the closed range given, returned as a float. (Counts and indices are tested with
   `transcoders.config.is_whole` where they are checked, each with its own sentence.)
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from transcoders.config import is_real


def shown(value, limit: int = 60) -> str:
    """`value`'s repr on one line: its first line, cut to `limit` characters."""
    text = repr(value)
    first = text.splitlines()[0] if text else text
    return first if len(first) <= limit and first == text else first[: limit - 3] + "..."


def as_path(value, what: str, error: type[Exception]) -> Path:
    """`value` as a `Path`, or `error` naming `what` when it is no path (step 2)."""
    if isinstance(value, str) or (isinstance(value, os.PathLike) and not isinstance(value, bytes)):
        try:
            return Path(value)
        except TypeError:  # an os.PathLike whose __fspath__ gives no str
            pass
    raise error(
        f"{what} is a {type(value).__name__} ({shown(value)}); pass a file path (a str or pathlib.Path)."
    )


def is_numbers(values) -> bool:
    """Whether `np.asarray(values)` is an array of integers or floats (step 3)."""
    import numpy as np

    try:
        return np.asarray(values).dtype.kind in "iuf"
    except (TypeError, ValueError):
        return False


def check_real(
    value, what: str, error: type[Exception], low: float = -math.inf, high: float = math.inf
) -> float:
    """`value` as a float in [low, high], or `error` (step 4)."""
    if not is_real(value) or math.isnan(value) or not low <= value <= high:
        raise error(f"{what} is {shown(value)}; pass a number{_range(low, high)}.")
    return float(value)


def _range(low: float, high: float) -> str:
    """' in [low, high]' as the message says it ('' when unbounded)."""
    if low == -math.inf and high == math.inf:
        return ""
    lo = "(-inf" if low == -math.inf else f"[{low:g}"
    hi = "inf)" if high == math.inf else f"{high:g}]"
    return f" in {lo}, {hi}"

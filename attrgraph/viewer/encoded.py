"""A view's reply bytes, encoded (and gzipped) once per file version, not once per request.

Encoding the IOI graph's payload (~290 KB of JSON) took tens of milliseconds of GIL per request,
so 200 concurrent page loads queued behind each other for seconds (issue 31, "Load"). The server
keeps each view as `Encoded` beside its payload and writes the bytes as they are:

1. `encode(value)`: compact JSON (no spaces), then gzip at level 6 (a ~5x smaller reply; the
   page's fetch always accepts it).
2. `accepts_gzip(header)`: whether an `Accept-Encoding` header takes gzip (`gzip;q=0` does not).
"""

from __future__ import annotations

import gzip
import json
from typing import NamedTuple


class Encoded(NamedTuple):
    raw: bytes
    """The JSON as UTF-8."""
    gzip: bytes
    """`raw` gzipped (mtime 0, so equal payloads give equal bytes)."""


def encode(value) -> Encoded:
    raw = json.dumps(value, allow_nan=False, separators=(",", ":")).encode()
    return Encoded(raw, gzip.compress(raw, compresslevel=6, mtime=0))


def accepts_gzip(header: str | None) -> bool:
    for part in (header or "").split(","):
        coding, _, params = part.partition(";")
        if coding.strip().lower() in ("gzip", "*"):
            q = params.strip().lower()
            return not (q.startswith("q=") and _float(q[2:]) == 0.0)
    return False


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return 1.0

"""The identity hash a graph's provenance records for its model and transcoder sets
(engine/sources.py `graph_provenance`), and by which dashboard_lookup.py recognises a bundled set."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def fingerprint(module: torch.nn.Module) -> str:
    """A cheap identity hash: sha256 over parameter names, shapes and a strided sample of values."""
    h = hashlib.sha256()
    for name, p in sorted(module.state_dict().items()):
        flat = p.detach().reshape(-1)
        sample = flat[:: max(1, flat.numel() // 4096)].double().cpu().numpy()
        h.update(name.encode())
        h.update(str(tuple(p.shape)).encode())
        h.update(sample.tobytes())
    return h.hexdigest()[:16]

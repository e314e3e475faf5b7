"""The identity hash of a module's weights: what a graph's provenance records for its model and
transcoder sets (attrgraph's engine/sources.py `graph_provenance`), by which attrgraph's
dashboard_lookup.py recognises a bundled set, and which keys the activation store's cached blocks
(activation_store.py step 4). Here, in the lower package, so that both can use it."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch


def fingerprint(module: torch.nn.Module) -> str:
    """A cheap identity hash: sha256 over parameter names, shapes and a strided sample of values
    (the samples are read from the module's device in one copy: one per tensor waits for a GPU
    each time)."""
    import torch

    params = sorted(module.state_dict().items())
    flats = [p.detach().reshape(-1) for _, p in params]
    samples = [flat[:: max(1, flat.numel() // 4096)].double() for flat in flats]
    # (a model spread over several devices: the samples meet on the first one's)
    host = torch.cat([x.to(samples[0].device) for x in samples]).cpu().numpy() if samples else None
    h, at = hashlib.sha256(), 0
    for (name, p), sample in zip(params, samples):
        h.update(name.encode())
        h.update(str(tuple(p.shape)).encode())
        h.update(host[at : at + len(sample)].tobytes())
        at += len(sample)
    return h.hexdigest()[:16]

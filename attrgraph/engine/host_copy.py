"""Copying a device's tensors into host arrays through two page-locked buffers (device_rows.py step 3).

A copy from a GPU straight into a numpy array goes to pageable memory: the driver copies it again
through its own staging, one piece at a time, and the host faults in each fresh page of the array as
it is first written. On an H100 the 2.1 GB of a Llama-1B-shaped graph's CSR arrays went that way at
about 2.8 GB/s, the largest item of the run's device time (`Memcpy DtoH (Device -> Pageable)`,
benchmarks/results/gpu/2026-11-27_h100). Instead:

1. Each piece (at most `STAGE_ENTRIES` entries of every array) is copied asynchronously into one of
   two page-locked ("pinned") buffers, which the device writes at the bus's rate; an event marks
   the end of that copy.
2. Before a buffer takes the next piece, the host waits for its event and copies the piece it holds
   into the arrays (torch's copy, spread over the host's threads); meanwhile the device is copying
   into the other buffer. `finish` copies the last two.
The buffers come from torch's caching host allocator, so the next graph reuses them. On a CPU they
are plain memory and every copy is done when it is asked for.
"""

from __future__ import annotations

import numpy as np
import torch

STAGE_ENTRIES = 1 << 22
"""Entries of every array per piece: 4 M, 32 MiB for float32 values and int32 columns."""


class HostCopy:
    """Copies equal-length device tensors into the host arrays `dests` (module docstring)."""

    def __init__(self, device: torch.device, dests: tuple[np.ndarray, ...]):
        self.dests = [torch.from_numpy(d) for d in dests]
        self.device = device
        self.pinned = device.type == "cuda"
        self.entries = max(1, min(STAGE_ENTRIES, len(dests[0])))
        self.slots = [
            [
                torch.empty(self.entries, dtype=d.dtype, device="cpu", pin_memory=self.pinned)
                for d in self.dests
            ]
            for _ in range(2)
        ]
        self.pending: list[tuple[torch.cuda.Event | None, int, int] | None] = [None, None]
        """Per buffer: the event ending its copy, and where its entries go (`at`, count)."""
        self.next = 0

    def put(self, at: int, *parts: torch.Tensor) -> None:
        """`dests[j][at : at + n] = parts[j]` for every array j (`n`: the parts' length), once the
        copy is finished (`finish`)."""
        n = len(parts[0])
        for a in range(0, n, self.entries):
            b = min(a + self.entries, n)
            slot = self.next
            self.next = 1 - slot
            self._drain(slot)
            for buffer, part in zip(self.slots[slot], parts):  # most parts are one piece: no slice
                buffer[: b - a].copy_(part if b - a == n else part[a:b], non_blocking=True)
            event = None
            if self.pinned:
                event = torch.cuda.Event()
                event.record(torch.cuda.current_stream(self.device))
            self.pending[slot] = (event, at + a, b - a)

    def finish(self) -> None:
        """Step 2 for the pieces still in the buffers, the older first."""
        for slot in (self.next, 1 - self.next):
            self._drain(slot)

    def _drain(self, slot: int) -> None:
        if self.pending[slot] is None:
            return
        event, at, n = self.pending[slot]
        if event is not None:
            event.synchronize()
        for dest, buffer in zip(self.dests, self.slots[slot]):
            dest[at : at + n].copy_(buffer[:n])
        self.pending[slot] = None

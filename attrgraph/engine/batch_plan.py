"""How the linear engine cuts its targets into batches, sized from the device it runs on.

Seed: circuit-tracing appendix, "Attribution Graph Computation" (one backward per batch of targets).
A batch of B targets cut to P positions keeps a few `[P, B, d_model]` working tensors alive
(linear_backward.py step 4). What a batch should be depends on where it runs:

1. Rows are keyed by (start, position): the start is the logits, or the MLP or attention features
   of one layer (linear_backward.py step 4); `order` sorts them by key.
2. On the CPU (`cpu_budget`) a batch's working tensor is sized for the cache (`WORK_BYTES`): one
   run of one start and one position per batch, split evenly where it would pass the budget; runs
   shorter than `MIN_ROWS` are merged with the next runs of their start (the batch mixes
   positions, its rows carry zeros beyond their own position). Many small products, each fast.
3. On a GPU (`device_budget`) each operation costs a launch whatever its size, so batches are as
   large as free device memory allows (`work_bytes` from `torch.cuda.mem_get_info`, divided among
   the batch's live working tensors): the runs of one start are merged over positions, in bands
   whose padded cost (rows x the band's last position) stays within `slack` times the rows' own
   cost (sum of their positions), so that merging never costs more than `slack - 1` of the flops.
   The rows of the whole graph stay on the device until it is assembled (`resident`;
   linear_backward.py step 8) where they fit in `RESIDENT_SHARE` of the free memory.
4. `batch_size`, when given, caps the rows of every batch on both.

`plan_batches` applies a budget; both budgets are plain values, so either can be tested anywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from attrgraph.errors import OptionError
from transcoders.arguments import shown
from transcoders.config import is_whole

WORK_BYTES = 1 << 22
"""CPU: largest [P, B, d_model] working tensor of one batch (step 2): at 6/256/4096, 4 MiB keeps
each run of 64 features whole; 1-8 MiB differ by less than the noise of a shared machine."""
MIN_ROWS = 16
"""CPU: runs shorter than this are merged with the next runs of their start (step 2)."""
CPU_ROWS = 256
"""CPU: most rows of a batch when the caller gives no `batch_size`."""
DEVICE_SLACK = 1.1
"""GPU: a band of positions may cost at most this many times its rows' own flops (step 3). The
padding is flops the floor does not count: on the Llama-1B shape at 32 tokens (planned on this
CPU, not yet timed on a GPU) 1.25 gave 81 batches with 23.1% more flops than the rows need, 1.1
gives 113 batches with 10.4%; each batch is still some 10 ms of an H100's float32 rate, its
launches far less."""
DEVICE_MIN_ROWS = 256
"""GPU: bands shorter than this many rows are merged whatever their padded cost: below it a
product is bound by its launch, not its flops."""
WORK_SHARE = 0.5
"""GPU: share of the free memory (after the resident rows) that one batch's working tensors take."""
RESIDENT_SHARE = 0.5
"""GPU: the rows stay on the device when they take at most this share of the free memory."""
MAX_WORK_BYTES = 1 << 29
"""GPU: largest working tensor (512 MiB). One product over it is some 10 ms at an H100's float32
rate, so its launch is already free; a larger one only merges more positions into a band, which
costs flops and memory. Planned for the Llama-1B shape at 128 tokens (on this CPU, not yet timed on a
GPU): 2 GiB gives 225 batches, 9.8% padded flops and 9 GiB of working tensors; 512 MiB gives 273
batches, 6.0% and 3 GiB. At 32 tokens no tensor reaches 0.1 GiB: both give the same 113 batches."""


@dataclass(frozen=True)
class BatchBudget:
    """How large a batch may be, and whether its rows stay on the device (module docstring)."""

    work_bytes: int
    """Largest `[P, B, d_model]` working tensor of one batch, in bytes."""
    min_rows: int
    """Runs (CPU) or bands (GPU) shorter than this are merged with the next ones of their start."""
    slack: float
    """Most padded cost over own cost of a batch that merges positions; 1.0: merge short runs
    only, one position per batch otherwise (the CPU's plan)."""
    resident: bool
    """Rows stay on the device until the graph is assembled (linear_backward.py step 8)."""
    max_rows: int
    """Most rows of a batch when the caller gives no `batch_size`."""

    def __post_init__(self):
        if self.work_bytes < 1 or self.min_rows < 1 or self.max_rows < 1 or not self.slack >= 1.0:
            raise ValueError(f"{self} has a size below 1 or a slack below 1.0.")


def cpu_budget() -> BatchBudget:
    """Step 2: cache-sized batches of one position, rows copied to the host batch by batch."""
    return BatchBudget(WORK_BYTES, MIN_ROWS, 1.0, resident=False, max_rows=CPU_ROWS)


def device_budget(free_bytes: int, resident_bytes: int, live_tensors: int) -> BatchBudget:
    """Step 3 for a GPU with `free_bytes` free, rows of `resident_bytes` in all, and batches that
    keep `live_tensors` `[P, B, d_model]` tensors alive: the rows stay on the device when they fit
    in `RESIDENT_SHARE` of the free memory, and a batch's working tensors share `WORK_SHARE` of
    what is left."""
    resident = resident_bytes <= RESIDENT_SHARE * free_bytes
    left = free_bytes - (resident_bytes if resident else 0)
    work = int(min(MAX_WORK_BYTES, WORK_SHARE * left / max(1, live_tensors)))
    return BatchBudget(max(work, WORK_BYTES), DEVICE_MIN_ROWS, DEVICE_SLACK, resident, max_rows=1 << 30)


def budget_for(device: torch.device, resident_bytes: int, live_tensors: int) -> BatchBudget:
    """The budget of `device`: `cpu_budget()` on the CPU, `device_budget` from the free memory of a
    CUDA device (what the caching allocator holds unused counts as free)."""
    if device.type != "cuda":
        return cpu_budget()
    free, _ = torch.cuda.mem_get_info(device)
    held = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    return device_budget(free + held, resident_bytes, live_tensors)


def check_batch_size(batch_size: int | None) -> None:
    """`OptionError` in one line unless `batch_size` is None (planned) or a whole number >= 1."""
    if batch_size is not None and (not is_whole(batch_size) or batch_size < 1):  # True is no batch size
        raise OptionError(f"batch_size is {shown(batch_size)}; pass a whole number, at least 1.")


def plan_batches(
    key: list[tuple[float, int]],
    order: list[int],
    row_bytes: int,
    budget: BatchBudget,
    batch_size: int | None = None,
) -> list[list[int]]:
    """Rows in `order` (sorted by `key` = (start, position)) cut into batches (steps 2-4).
    `row_bytes`: one row's working tensor at one position (`d_model` x element size)."""
    cap_rows = budget.max_rows if batch_size is None else max(1, batch_size)
    runs: list[list[int]] = []
    for i in order:
        if runs and key[runs[-1][0]] == key[i]:
            runs[-1].append(i)
        else:
            runs.append([i])

    def cap(pos: int) -> int:
        return max(1, min(cap_rows, max(budget.min_rows, budget.work_bytes // ((pos + 1) * row_bytes))))

    if budget.slack == 1.0:
        return _short_runs_merged(runs, key, cap, budget.min_rows)
    return _position_bands(runs, key, cap, budget)


def _short_runs_merged(runs: list[list[int]], key: list, cap, min_rows: int) -> list[list[int]]:
    """Step 2: a run of one start and one position is its own batches, split evenly at `cap`; runs
    shorter than `min_rows` are merged with the next runs of the same start."""
    batches, small = [], []
    for run in runs:
        start, pos = key[run[0]]
        c = cap(pos)
        if small and (key[small[0]][0] != start or len(small) + len(run) > c or len(run) >= min_rows):
            batches.append(small)
            small = []
        if len(run) < min_rows and len(run) <= c:
            small += run
            continue
        batches += _split(run, c)
    if small:
        batches.append(small)
    return batches


def _position_bands(runs: list[list[int]], key: list, cap, budget: BatchBudget) -> list[list[int]]:
    """Step 3: the runs of one start, in ascending position, merged into bands while the band fits
    `cap` rows at its last position and costs at most `slack` times its rows' own positions (or
    has fewer than `min_rows` rows)."""
    batches: list[list[int]] = []
    band: list[int] = []
    own = 0  # sum over the band's rows of (position + 1)
    for run in runs:
        start, pos = key[run[0]]
        if band and key[band[0]][0] != start:
            batches.append(band)
            band, own = [], 0
        n, c = len(band) + len(run), cap(pos)
        padded_ok = (
            n * (pos + 1) <= budget.slack * (own + len(run) * (pos + 1)) or len(band) < budget.min_rows
        )
        if band and (n > c or not padded_ok):
            batches.append(band)
            band, own = [], 0
        parts = _split(run, c) if len(band) + len(run) > c else [run]
        batches += parts[:-1]
        band += parts[-1]
        own += len(parts[-1]) * (pos + 1)
    if band:
        batches.append(band)
    return batches


def _split(run: list[int], cap: int) -> list[list[int]]:
    """`run` in `ceil(len / cap)` parts of nearly equal length."""
    n = -(-len(run) // cap)
    return [part.tolist() for part in np.array_split(np.asarray(run), n)] if n > 1 else [list(run)]

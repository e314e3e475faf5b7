"""Thread counts chosen for the work, so that a machine with other work on it does not slow the engine down.

torch's CPU threads are OpenMP threads. Between two parallel operations an OpenMP worker
spin-waits (libgomp's default, `OMP_WAIT_POLICY` unset); when another process holds one of the
cores, each parallel operation then waits for a descheduled thread, and a walk of many
millisecond-sized matrix products becomes many times slower than on one thread (a 6-layer graph:
30x in issue 15's measurement; medians of 50-53 s against 5.5-9 s on a shared 2-core machine in
`benchmarks/busy_machine.py`). Two remedies:

- `OMP_WAIT_POLICY=PASSIVE` (waiting threads sleep); libgomp reads it once, when torch is
  imported, so only a process that is ours can set it: the CLI does (cli/__init__.py);
- operations below `PARALLEL_FLOPS` run on one thread (`threads_for`, `torch_threads`): on an
  idle machine the second thread gains little on them, on a shared one it costs the most.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch

PARALLEL_FLOPS = 1e9
"""Largest product (multiply-adds x 2) of a phase below which that phase runs on one thread unless
the wait policy is passive. Measured in `benchmarks/busy_machine.py` (float32 `[n, 256] @ [256, 256]`
products, mean time, 2 threads against 1 on a shared 2-core machine, with and without a busy core):
5-340x slower up to 0.07 GFLOP per product, 2.7-3.1x at 0.27, 1.4-1.9x at 1.1, 0.9-1.2x at 4.3.
Above it the loss is bounded and large products keep the caller's threads; the linear engine's
products are ~0.13 GFLOP at d_model 256 and ~0.4 at 768 (1 MiB working tensors)."""


def passive_wait() -> bool:
    """Whether OpenMP's waiting threads sleep (`OMP_WAIT_POLICY=PASSIVE` in this process's environment)."""
    return os.environ.get("OMP_WAIT_POLICY", "").strip().upper() == "PASSIVE"


def threads_for(flops: float) -> int:
    """Threads for a phase whose largest product costs `flops`: the caller's setting when the
    product is large enough to pay for parallel waits or waiting threads sleep, else 1."""
    n = torch.get_num_threads()
    return n if flops >= PARALLEL_FLOPS or passive_wait() else 1


@contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run a block with `n` torch threads, restoring the caller's setting after (also on errors).
    Setting the count costs ~0.3 ms, so it is done per phase, not per operation."""
    before = torch.get_num_threads()
    if n == before:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)

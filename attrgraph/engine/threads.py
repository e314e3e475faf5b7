"""Thread counts chosen for the work, so that a machine with other work on it does not slow the engine down.

torch's CPU threads are OpenMP threads. Between two parallel operations an OpenMP worker
spin-waits (libgomp's default, `OMP_WAIT_POLICY` unset); when another process holds one of the
cores, each parallel operation then waits for a descheduled thread, and a walk of many
millisecond-sized matrix products becomes tens of times slower than one thread (measured in
`benchmarks/busy_machine.py`: 2 threads against 1 beside one busy core). Two remedies:

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
products, 1 against 2 threads beside a busy core): 2 threads lose by 2-40x below ~0.5 GFLOP per
product and break even near 1-2 GFLOP."""


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

"""Counting, on the CPU, the calls that make the host wait for a GPU.

On a GPU an op whose result the host must read (a value for Python, an output size, a check) waits
for every kernel queued before it: the host cannot queue work ahead, and the device idles while the
host issues what comes next. The dispatcher sees the same calls on the CPU, so a test counts them
here and checks that a loop over batches reads a fixed number of times, not one per batch:

- a value read into Python: `_local_scalar_dense` (`.item()`, `int()`, `bool()`);
- a copy to the host: `Tensor.cpu`, `.tolist` (patched: on the CPU they dispatch nothing; `.numpy()`
  refuses a GPU tensor, so it follows a `.cpu()` and is not counted again);
- ops whose output size is the data's: `nonzero`, `masked_select`, `unique`, a boolean index,
  `repeat_interleave` without `output_size`;
- ops that read their input to check or size it: `bincount` (its input's min and max),
  `segment_reduce` unless `unsafe=True` (its lengths' min and sum).

`nonzero_static`, `index_add_`, `scatter_add_` and integer indices read nothing.
"""

from __future__ import annotations

import traceback
from collections.abc import Callable

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

READS = {
    "_local_scalar_dense",
    "nonzero",
    "masked_select",
    "bincount",
    "unique",
    "_unique",
    "_unique2",
    "unique_dim",
    "unique_consecutive",
}
COPIES = ("cpu", "tolist")


class HostReads(TorchDispatchMode):
    """Every read (module docstring) made while active, as "op at file:line" of the innermost frame
    under `under` (a path fragment; default: any file outside torch)."""

    def __init__(self, under: str | None = None):
        super().__init__()
        self.under = under
        self.seen: list[str] = []

    @property
    def n(self) -> int:
        return len(self.seen)

    def note(self, what: str) -> None:
        stack = traceback.extract_stack()[:-2]
        if any("/torch/optim/" in f.filename for f in stack):  # Adam's step counter: a host tensor
            return
        mine = [f for f in stack if (self.under or "") in f.filename and "/torch/" not in f.filename]
        where = f"{mine[-1].filename.rsplit('/', 1)[-1]}:{mine[-1].lineno}" if mine else "?"
        self.seen.append(f"{what} at {where}")

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        bool_index = name in ("index", "index_put", "index_put_") and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] or ()
        )
        checked = name == "segment_reduce" and not kwargs.get("unsafe", False)
        sized = name == "repeat_interleave" and kwargs.get("output_size") is None
        if name in READS or bool_index or checked or sized:
            self.note(name)
        return func(*args, **kwargs)


def count_host_reads(run: Callable[[], object], under: str | None = None) -> HostReads:
    """`run()` under a `HostReads`, with the host copies (`COPIES`) counted too."""
    reads = HostReads(under)
    with pytest.MonkeyPatch.context() as m:
        for name in COPIES:
            original = getattr(torch.Tensor, name)

            def counted(self, *a, _original=original, _name=name, **k):
                reads.note(_name)
                return _original(self, *a, **k)

            m.setattr(torch.Tensor, name, counted)
        with reads:
            run()
    return reads

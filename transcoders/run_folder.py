"""One training run per run folder (`--out`).

Two runs of `python -m transcoders.train` with one `--out` (a job submitted twice, the same command
in a second terminal) wrote one `RUN/checkpoint.tmp` and renamed it over each other's checkpoint:
both stopped at a checkpoint on a missing file, and the checkpoint left held either run's step.
`one_run` holds `RUN/.train.lock` while a run goes (h5file.pid_lock: the kernel drops the lock when
its process dies, the file goes when the run ends), so a second run is refused at once, before the
model loads, with the first one's process id. Under torchrun rank 0 alone takes it and every rank
of the job gets its answer (distributed.main_says), so the job stops as one. The folders that the
run created and that are still empty when the run fails are removed again.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from transcoders import distributed as tdist
from transcoders.errors import RunBusyError
from transcoders.h5file import pid_lock

LOCK = ".train.lock"


@contextlib.contextmanager
def one_run(out: str | os.PathLike, d: tdist.Dist):
    """Hold the run folder `out` for this run (every rank of a torchrun job enters together); a
    folder another run holds raises `RunBusyError`."""
    out = Path(out)
    if not d.main:
        refused = tdist.main_says(d, "lock", None)
        if refused:
            raise RunBusyError(refused)
        yield
        return

    def busy(pid: str) -> RunBusyError:
        return RunBusyError(
            f"another training run (pid {pid or 'unknown'}) is using the run folder {out}; "
            "wait for it to end, or pass another --out."
        )

    created = [f for f in (out, *out.parents) if not f.exists()]  # innermost first
    out.mkdir(parents=True, exist_ok=True)
    try:
        with contextlib.ExitStack() as stack:
            try:
                stack.enter_context(pid_lock(out / LOCK, busy))
            except RunBusyError as e:
                tdist.main_says(d, "lock", str(e))
                raise
            tdist.main_says(d, "lock", "")
            yield
    except BaseException:
        with contextlib.suppress(OSError):
            for folder in created:
                folder.rmdir()  # only when empty: a checkpoint written before the failure stays
        raise

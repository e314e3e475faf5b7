"""SIGTERM while a transcoder set trains (a scheduler preempting the job, `kill PID`): the run stops
at a step with a checkpoint of that step, and says so in one line, exit `TERMINATED` (143;
command.py, where every command's ending is).

Before, SIGTERM killed the run at once: the steps since the last checkpoint were lost, and a
checkpoint being written was left half in `checkpoint.tmp`.

1. While the trainer steps (`Trainer.fit`), `deferred_sigterm` turns SIGTERM into a flag that the
   next step's one host sync carries (trainer.py step 4: the flags `_check_finite` reduces over
   ranks), so every rank of a torchrun job stops at the same step, whichever of them got the signal.
2. That step stops before its backward, so the weights are the steps' before it; the trainer writes
   their checkpoint (every rank its part) and raises `Terminated`, which the command turns into its
   line: the same command resumes there.
3. Under torchrun, a SIGTERM because a rank died is still the `StalledRankError` naming it
   (distributed.py `naming_dead_ranks`); no checkpoint is attempted without that rank.
4. Outside the steps (loading the model and the data, the final save and evaluation) the command
   runs under `sigterm_raises`: SIGTERM raises `Terminated` where the run is, as Ctrl-C raises
   KeyboardInterrupt, so that a file being written is removed (output_folder.py `replaced`)
   and the command ends on one line saying what the run folder holds (after the steps: the last
   step's checkpoint, so the same command saves and evaluates without training again), exit 143.
   The last step's checkpoint is written inside step 1's block, so a SIGTERM there waits for it.
   Before, SIGTERM there killed the process: no line, and a save's temp file left beside the set.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import threading
from collections.abc import Callable, Iterator

from transcoders import distributed as tdist
from transcoders.errors import Terminated


@contextlib.contextmanager
def sigterm_raises(where: Callable[[], str]) -> Iterator[None]:
    """Within: SIGTERM raises `Terminated(where())` (step 4: `where` says what the run folder holds),
    once; a second SIGTERM kills, as one did before (and does if code on the way swallowed the
    first). `deferred_sigterm` and distributed.py `naming_dead_ranks` take over inside their blocks
    and hand a SIGTERM they do not keep back to this. Off the main thread: no change."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        raise Terminated(where())

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)


@dataclasses.dataclass
class StopRequest:
    """What `deferred_sigterm` yields: `asked` once a SIGTERM came; `honoured` once the run stopped
    for it."""

    asked: bool = False
    honoured: bool = False


@contextlib.contextmanager
def deferred_sigterm(d: tdist.Dist) -> Iterator[StopRequest]:
    """Within: SIGTERM sets the request's `asked` and returns (step 1); one because a rank died
    raises the `StalledRankError` naming it (step 3). A SIGTERM the block did not honour (it came
    after the last step's check) is raised again at its end, where it acts as before (step 4). Off
    the main thread, where handlers cannot be set: no change."""
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return

    def handler(signum, frame):
        if d.active and (error := tdist.dead_rank_error(d)) is not None:
            raise error
        request.asked = True

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield request
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL if previous is None else previous)
        if request.asked and not request.honoured:
            signal.raise_signal(signal.SIGTERM)

"""How the commands end: `python -m transcoders.train`, `python -m transcoders.dashboards` and
attrgraph's CLI (which imports this; transcoders imports nothing of attrgraph).

1. A mistake of the user's (an `AttrgraphError`) is one line `PROG: error: SENTENCE`, exit 2.
2. Ctrl-C is one line `PROG: interrupted; ...`, exit `INTERRUPTED` (130, the shell's status for a
   command SIGINT stopped): `interrupt_once` makes the first Ctrl-C raise `KeyboardInterrupt` and
   ignores any later one, which would otherwise end the unwinding (closing files, torch's atexit
   hooks) in a traceback instead of that line.
3. Before either line, `close_progress_bars` ends an open tqdm bar's line, so that the message starts
   a line of its own.
4. A training run stopped by SIGTERM (transcoders/stop_signal.py) raises `errors.Terminated`, whose
   sentence is the line `PROG: SENTENCE`, exit `TERMINATED` (143); caught before step 1's errors.
"""

from __future__ import annotations

import signal
import sys
import threading

INTERRUPTED = 128 + signal.SIGINT
"""The exit status after Ctrl-C: a command stopped by SIGINT, as the shell reports it."""
TERMINATED = 128 + signal.SIGTERM
"""The exit status after SIGTERM: a command stopped by it, as the shell reports it."""


def interrupt_once():
    """Make the first Ctrl-C raise KeyboardInterrupt and ignore any further one (step 2). Returns the
    handler it replaced, for `restore_interrupt` (None off the main thread, where handlers cannot be
    set)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def interrupted(signum, frame):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        raise KeyboardInterrupt

    return signal.signal(signal.SIGINT, interrupted)


def restore_interrupt(previous) -> None:
    """Give an in-process caller its Ctrl-C handler back, unless a Ctrl-C came (the process is ending)."""
    if previous is not None and signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, previous)


def close_progress_bars() -> None:
    """End every open tqdm bar's line (a bar left open by the step an error or Ctrl-C stopped)."""
    tqdm = sys.modules.get("tqdm")
    for bar in list(getattr(getattr(tqdm, "tqdm", None), "_instances", ())):
        bar.close()

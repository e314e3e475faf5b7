"""A real command stopped at a named point, without timing: it runs in a process that pauses when a
named function is first (or n-th) called (`paused`), where a test can do what a user might meanwhile
(start the same command again); `interrupted` sends it SIGINT twice there (two Ctrl-Cs), and then
lets it go on."""

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAUSED = """
import sys
import {module} as where
from {command} import main
real = where.{name}

def paused(*args, **kwargs):  # the real call, after the n-th call says so and waits for a line
    paused.calls += 1
    if paused.calls == {nth}:
        print("paused", flush=True)
        sys.stdin.readline()
    return real(*args, **kwargs)

paused.calls = 0
where.{name} = paused
sys.exit(main(sys.argv[1:]))
"""


@contextlib.contextmanager
def paused(command: str, args: list, module: str, name: str, nth: int = 1) -> Iterator[subprocess.Popen]:
    """The command `python -m COMMAND ARGS` in a process paused at the `nth` call of `MODULE.NAME`;
    a line on its stdin lets it go on. Killed when the block ends."""
    code = PAUSED.format(command=command, module=module, name=name, nth=nth)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *map(str, args)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
    )  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "paused", proc.stderr.read()[-3000:]
        yield proc
    finally:
        proc.kill()
        proc.communicate()


def interrupted(
    command: str, args: list, module: str, name: str, nth: int = 1
) -> subprocess.CompletedProcess:
    """Two Ctrl-Cs (SIGINT) where `paused` stops the command, which then goes on; its result."""
    with paused(command, args, module, name, nth) as proc:
        proc.send_signal(signal.SIGINT)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate("\n", timeout=600)
    return subprocess.CompletedProcess(args, proc.returncode, out, err)

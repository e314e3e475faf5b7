"""Ctrl-C on the transcoders package's commands (../shared/BAD_INPUTS.md: "Ctrl-C: exit 130", one
line): `python -m transcoders.train` says which step the run's checkpoint holds (the same command
resumes there) and `python -m transcoders.dashboards` that no file changed. Before, both ended in a
`KeyboardInterrupt` traceback, killed by SIGINT (exit -2).

Each test runs the real command in a process that pauses when a named function is first (or n-th)
called, sends it SIGINT twice there (two Ctrl-Cs), and lets it go on: no timing is involved."""

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.transcoders.tc_helpers import CLI_ARGS

ROOT = Path(__file__).resolve().parents[2]
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


def interrupted(
    command: str, args: list, module: str, name: str, nth: int = 1
) -> subprocess.CompletedProcess:
    code = PAUSED.format(command=command, module=module, name=name, nth=nth)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *map(str, args)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
    )  # fmt: skip
    try:
        assert proc.stdout.readline().strip() == "paused", proc.stderr.read()[-3000:]
        proc.send_signal(signal.SIGINT)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate("\n", timeout=600)
    finally:
        proc.kill()
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def last_line(res) -> str:
    assert res.returncode == 130, res.stderr[-3000:]
    assert "Traceback" not in res.stderr and "Exception ignored" not in res.stderr
    return res.stderr.strip().splitlines()[-1]


def test_ctrl_c_in_training_names_the_step_to_resume_from(tmp_path):
    """Paused at the second checkpoint write: the first (step 1) is the one to resume from, and the
    same command then resumes there and finishes."""
    out = tmp_path / "run"
    args = [*CLI_ARGS, "--checkpoint-every", "1", "--out", out]
    res = interrupted("transcoders.train", args, "transcoders.checkpoint", "write_checkpoint", nth=2)
    assert last_line(res) == (
        f"python -m transcoders.train: interrupted; the checkpoint in {out / 'checkpoint'} holds step 1: "
        "the same command resumes there."
    )
    from transcoders.train import main

    assert main(list(map(str, args))) == 0
    assert (out / "transcoders" / "weights.safetensors").is_file()


def test_ctrl_c_before_the_first_checkpoint_says_the_run_starts_afresh(tmp_path):
    out = tmp_path / "run"
    res = interrupted(
        "transcoders.train", [*CLI_ARGS, "--out", out], "transcoders.checkpoint", "write_checkpoint"
    )
    assert last_line(res) == (
        f"python -m transcoders.train: interrupted; no checkpoint of this run is in {out} yet "
        "(--checkpoint-every): the same command starts afresh."
    )


def test_ctrl_c_in_dashboards_changes_no_file(tmp_path):
    path = tmp_path / "d.h5"
    args = ["--transcoders", "default-plt", "--n-tokens", "4096", "--out", path]
    res = interrupted("transcoders.dashboards", args, "transcoders.dashboards", "accumulate")
    assert last_line(res) == "transcoders.dashboards: interrupted; no dashboards file was changed."
    assert list(tmp_path.iterdir()) == []

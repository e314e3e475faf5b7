"""`attrgraph` main sets OpenMP's wait policy where the process is ours, and only where it takes effect."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from attrgraph.cli import passive_openmp

ROOT = Path(__file__).resolve().parents[3]
# run main() in a fresh process, then load torch: libgomp prints the spin count it read at load
SCRIPT = """
from attrgraph.cli import main
try:
    main(["show", "--help"])
except SystemExit:
    pass
import torch
"""


def spin_count(**env) -> str:
    clean = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    res = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env=dict(clean, OMP_DISPLAY_ENV="VERBOSE", PYTHONPATH=str(ROOT), **env),
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    lines = [line for line in res.stderr.splitlines() if "GOMP_SPINCOUNT" in line]
    if not lines:
        pytest.skip("torch's OpenMP runtime is not libgomp (no GOMP_SPINCOUNT in OMP_DISPLAY_ENV)")
    return lines[0].split("=")[1].strip().strip("'")


def test_main_makes_openmp_threads_sleep_and_keeps_the_users_policy():
    assert spin_count() == "0"  # PASSIVE: waiting threads sleep at once (unset: 300000 spins)
    assert spin_count(OMP_WAIT_POLICY="ACTIVE") == "30000000000"


def test_no_policy_is_set_once_torch_is_loaded(monkeypatch):
    assert "torch" in sys.modules  # loaded by the test set-up: too late for libgomp to read it
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert passive_openmp() is False
    assert "OMP_WAIT_POLICY" not in os.environ

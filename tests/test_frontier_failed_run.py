"""benchmarks/frontier.py goes on past a library that fails: on an H200, sparsify's scoring died (its
triton decoder on CPU tensors) and took the JumpReLU and sae_lens runs queued after it with it. Here a
sparsify interpreter that fails stands in: the run is listed under "Failed runs", the method after it
still trains and is scored, and the script exits 1."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # ~29 s: trains and scores a frontier run

ROOT = Path(__file__).resolve().parents[1]
BROKEN_SPARSIFY = """#!/bin/sh
[ "$1" = "-c" ] && { echo 1.3.3; exit 0; }
echo "RuntimeError: sparsify broke" >&2; exit 1
"""


def test_a_failed_method_is_listed_and_the_next_one_runs(tmp_path):
    sparsify = tmp_path / "python"
    sparsify.write_text(BROKEN_SPARSIFY)
    sparsify.chmod(0o755)
    cmd = [sys.executable, "benchmarks/frontier.py", "--n-tokens", "4096", "--values", "12", "--seeds", "0"]
    cmd += ["--methods", "sparsify_topk,topk", "--sparsify-python", str(sparsify)]
    cmd += ["--work", str(tmp_path / "work"), "--out", str(tmp_path / "f")]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 1, res.stderr[-3000:]
    saved = json.loads((tmp_path / "f.json").read_text())
    assert [r["method"] for r in saved["runs"].values()] == ["topk"]
    (run,) = saved["runs"].values()  # a run's wall, timed around it, holds its training and its scoring
    assert 0 < run["train_s"] + run["score_s"] <= run["run_s"]
    assert (tmp_path / "f.png").stat().st_size > 0  # the plot, made once at the end
    assert "sparsify broke" in saved["meta"]["failed"]["sparsify_topk_12_seed0"]
    md = (tmp_path / "f.md").read_text()
    assert "| ours: TopK | k 12 | 1 | 12.0 |" in md
    assert md.split("## Failed runs")[1].strip().startswith("- sparsify_topk_12_seed0: RuntimeError")

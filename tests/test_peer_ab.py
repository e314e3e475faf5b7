"""benchmarks/peer_ab.py: our side of peer_compare at a base revision and at this tree, on one
circuit-tracer case folder. Its arguments are refused in one line; on a seeded harness case both
libraries (the base's from a git worktree of it) equal circuit-tracer's adjacency."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.attrgraph.peer_frontend import peer_case

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "peer_ab.py"


def peer_ab(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=ROOT, capture_output=True, text=True)


def test_a_case_without_its_folder_or_an_unknown_base_is_one_line(tmp_path):
    res = peer_ab("--base", "HEAD", "--case", "6/256/4096")
    assert res.returncode == 2 and "pass LABEL=DIR" in res.stderr.splitlines()[-1]
    res = peer_ab("--base", "HEAD", "--case", f"6/256/4096={tmp_path}")  # no meta.json there
    assert res.returncode == 2 and "meta.json" in res.stderr.splitlines()[-1]
    (tmp_path / "meta.json").write_text("{}")
    res = peer_ab("--base", "no-such-revision", "--case", f"6/256/4096={tmp_path}")
    assert res.returncode == 2 and "is no commit" in res.stderr.splitlines()[-1]
    assert "Traceback" not in res.stderr


@pytest.mark.slow  # ~40 s: the harness case, a worktree and four worker processes
def test_both_sides_equal_circuit_tracers_graph(tmp_path):
    case = peer_case(
        tmp_path / "case", "--n-layers 2 --d-model 64 --d-transcoder 256 --prompt-len 8 --d-vocab 128"
    )
    out = tmp_path / "ab"
    head = subprocess.run(["git", "rev-parse", "HEAD~1"], cwd=ROOT, capture_output=True, text=True)
    base = head.stdout.strip() if head.returncode == 0 else "HEAD"  # a shallow clone has one commit
    res = peer_ab("--base", base, "--case", f"tiny={case}", "--runs", "2", "--out", str(out))
    assert res.returncode == 0, res.stderr[-3000:]
    result = json.loads(out.with_suffix(".json").read_text())
    assert result["meta"]["base"] == base or base == "HEAD"
    assert result["meta"]["side_by_side"] == (len(os.sched_getaffinity(0)) >= 2)
    (row,) = result["rows"]
    for side in ("base", "this"):  # circuit-tracer's adjacency is the oracle on both sides
        assert row[side]["match"] and row[side]["max_rel_diff"] <= 1e-4
        assert len(row[side]["seconds"]) == 2  # one process a run
    assert row["ratio"] == pytest.approx(row["this"]["median"] / row["base"]["median"])
    worktrees = subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True).stdout
    assert "peer_ab_" not in worktrees  # the base's worktree is removed

"""benchmarks/gpu_train_steps.py, the device check of our trainer's steps (issue 29), runs on the CPU:
each run's rate, the profiled ops' time within the step's wall time, no kernel launches (a CPU), and
its table; a malformed --runs entry is refused."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = [sys.executable, "benchmarks/gpu_train_steps.py"]


def test_the_trainer_steps_are_measured_on_the_cpu(tmp_path):
    cmd = [*SCRIPT, "--device", "cpu", "--runs", "topk:256", "jumprelu:128", "--steps", "3"]
    cmd += ["--block-tokens", "2048", "--out", str(tmp_path / "t")]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    saved = json.loads((tmp_path / "t.json").read_text())
    assert saved["meta"]["device_name"] == "the CPU" and saved["meta"]["d_model"] == 128
    runs = saved["runs"]
    assert [(r["activation"], r["batch"]) for r in runs] == [("topk", 256), ("jumprelu", 128)]
    for r in runs:
        assert abs(r["tokens_per_s"] - r["batch"] / (r["step_ms"] / 1e3)) <= 1e-3 * r["tokens_per_s"]
        assert 0 < r["busy_share"] <= 1.05 and r["launches"] == 0 and r["products"] > 0
        ms = [t["ms"] for t in r["top"]]
        assert ms == sorted(ms, reverse=True) and sum(ms) <= r["busy_ms_per_step"] * 1.001
    md = (tmp_path / "t.md").read_text()
    assert "# Our trainer's steps on the CPU, float32" in md and "| topk, batch 256 |" in md


def test_a_malformed_run_is_refused():
    res = subprocess.run([*SCRIPT, "--runs", "topk512"], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 2 and "--runs takes ACTIVATION:BATCH" in res.stderr

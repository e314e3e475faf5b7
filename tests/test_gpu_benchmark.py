"""benchmarks/gpu_vs_circuit_tracer.py runs end to end on the CPU (`--smoke`): circuit-tracer in its own
venv and ours on one seeded case, and the feature rows agree (the figure the GPU table reports)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.attrgraph.peer_frontend import require_peer

ROOT = Path(__file__).resolve().parents[1]


def test_the_gpu_benchmark_runs_on_the_cpu(tmp_path):
    peer = require_peer()
    if not (ROOT.parent / "shared" / "peer" / "ct_gpu.py").is_file():
        pytest.skip("../shared/peer/ct_gpu.py is not beside the project")
    cmd = [sys.executable, "benchmarks/gpu_vs_circuit_tracer.py", "--smoke", "--peer-python", peer]
    res = subprocess.run([*cmd, "--results", str(tmp_path)], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    (case,) = json.loads((tmp_path / "gpu_vs_circuit_tracer_cpu_smoke.json").read_text())["cases"]
    ours = case["attrgraph"]
    assert ours["fp32"]["match"] and ours["fp32"]["feature_rows_rel_diff"] <= 1e-5
    assert ours["bf16"]["edge_rel_err"] < 0.05 and ours["fp32"]["backward_gflop"] > 0
    assert "| smoke |" in (tmp_path / "gpu_vs_circuit_tracer_cpu_smoke.md").read_text()

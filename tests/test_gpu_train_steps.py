"""benchmarks/gpu_train_steps.py, the device check of our trainer's steps (issue 29), runs on the CPU:
each run's rate, the profiled ops' time within the step's wall time, no kernel launches (a CPU), and
its table; a malformed --runs entry is refused."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = [sys.executable, "benchmarks/gpu_train_steps.py"]


@pytest.mark.parametrize("store", ["memory", pytest.param("shards", marks=pytest.mark.slow)])  # ~11 s each
def test_the_trainer_steps_are_measured_on_the_cpu(tmp_path, store):
    cmd = [
        *SCRIPT,
        "--store",
        store,
        "--device",
        "cpu",
        "--runs",
        "bundled:topk:256:512",
        "wide:jumprelu:128:256",
        "--steps",
        "3",
    ]
    cmd += ["--wide-d-model", "64", "--block-tokens", "2048", "--out", str(tmp_path / "t")]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    saved = json.loads((tmp_path / "t.json").read_text())
    assert saved["meta"]["device_name"] == "the CPU" and saved["meta"]["matmul_tflops"] > 0
    assert saved["meta"]["store"] == store
    runs = saved["runs"]
    got = [(r["model"], r["activation"], r["batch"], r["d_sae"], r["n_layers"], r["d_model"]) for r in runs]
    assert got == [("bundled", "topk", 256, 512, 4, 128), ("wide", "jumprelu", 128, 256, 2, 64)]
    for r in runs:
        flops = 2 * r["batch"] * r["n_layers"] * r["d_model"] * r["d_sae"]  # the encoder's product
        assert (
            abs(r["encoder_tflops"] - flops / (r["step_ms"] / 1e3) / 1e12)
            <= 1e-3 * r["encoder_tflops"] + 1e-4
        )
        assert r["encoder_share"] == pytest.approx(
            r["encoder_tflops"] / saved["meta"]["matmul_tflops"], abs=1e-3
        )
        assert abs(r["tokens_per_s"] - r["batch"] / (r["step_ms"] / 1e3)) <= 1e-3 * r["tokens_per_s"]
        assert 0 < r["busy_share"] <= 1.05 and r["launches"] == 0 and r["products"] > 0
        ms = [t["ms"] for t in r["top"]]
        assert ms == sorted(ms, reverse=True) and sum(ms) <= r["busy_ms_per_step"] * 1.001
        # the products by shape hold the encoder's, [layers, batch, d_model] @ [layers, d_model, d_sae], at
        # its flops a call (a JumpReLU step's decoder backward has its shape too: at least one call a step)
        L, B, d, S = r["n_layers"], r["batch"], r["d_model"], r["d_sae"]
        encoder = [t for t in r["top_products"] if t["shapes"] == f"[{L}, {B}, {d}] @ [{L}, {d}, {S}]"]
        assert len(encoder) == 1 and encoder[0]["calls"] >= 1
        assert encoder[0]["gflop"] == pytest.approx(encoder[0]["calls"] * flops / 1e9)
    md = (tmp_path / "t.md").read_text()
    assert (
        "# Our trainer's steps on the CPU, float32" in md
        and "| bundled, topk, batch 256, d_sae 512 | 4 / 128 |" in md
        and "| baddbmm | [4, 256, 128] @ [4, 128, 512] | 1 |" in md
    )


def test_a_malformed_run_is_refused():
    res = subprocess.run([*SCRIPT, "--runs", "bundled:topk:512"], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 2 and "--runs takes MODEL:ACTIVATION:BATCH:D_SAE" in res.stderr

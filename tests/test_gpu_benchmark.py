"""benchmarks/gpu_vs_circuit_tracer.py runs end to end on the CPU (`--smoke`): circuit-tracer in its own
venv and ours on two seeded cases; the feature rows agree (the figure the GPU table reports), and where
the logit rows do not (a vocabulary equal to d_model), interventions on the model side with ours. On the
GPU machine ../shared does not travel: the harness is a copy (`--harness`), as here. A case that fails
is a row with its error, written at once."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.attrgraph.peer_frontend import peer_case, require_peer

PRECISIONS = ["fp32", "tf32", "bf16"]

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # ~65 s: three cases, each built by circuit-tracer and by ours in three precisions
def test_the_gpu_benchmark_runs_on_the_cpu(tmp_path):
    peer = require_peer()
    shared = ROOT.parent / "shared" / "peer"
    if not (shared / "ct_gpu.py").is_file():
        pytest.skip("../shared/peer/ct_gpu.py is not beside the project")
    harness = tmp_path / "harness"  # as benchmarks/gpu/prepare.sh copies it for the device
    harness.mkdir()
    for name in ("ct_gpu.py", "ct_graph.py"):
        shutil.copy(shared / name, harness)
    cmd = [sys.executable, "benchmarks/gpu_vs_circuit_tracer.py", "--smoke", "--peer-python", peer]
    cmd += ["--harness", str(harness), "--profile", "smoke"]
    res = subprocess.run([*cmd, "--results", str(tmp_path)], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    case, tied, partial = json.loads((tmp_path / "gpu_vs_circuit_tracer_cpu_smoke.json").read_text())["cases"]
    ours = case["attrgraph"]
    assert ours["fp32"]["match"] and ours["fp32"]["feature_rows_rel_diff"] <= 1e-5
    assert ours["bf16"]["edge_rel_err"] < 0.05 and ours["fp32"]["backward_gflop"] > 0
    assert "logit_rows_by_intervention" not in ours["fp32"]  # the rows agree: nothing to decide
    # vocabulary = d_model: circuit-tracer's logit rows are off (../shared/GPU.md); the model decides
    f32 = tied["attrgraph"]["fp32"]
    assert f32["feature_rows_rel_diff"] <= 1e-5 and f32["logit_rows_rel_diff"] > 0.1
    by = f32["logit_rows_by_intervention"]
    assert by["checked"] == 8 and by["ours_rel_err"] <= 1e-5 and by["ct_rel_err"] > 0.1
    # circuit-tracer explored 64 features (max_feature_nodes): ours as many, the same, with its rows
    adaptive = partial["attrgraph"]
    assert adaptive["max_feature_nodes"] == 64 and adaptive["fp32"]["features"] == 64
    assert (
        adaptive["fp32"]["match"] and adaptive["fp32"]["partial"] and adaptive["fp32"]["backward_gflop"] > 0
    )
    assert (
        adaptive["fp32"]["feature_rows_rel_diff"] <= 1e-5 and adaptive["fp32"]["logit_rows_rel_diff"] <= 1e-5
    )
    assert "tf32" not in adaptive and "pruned_build" not in adaptive
    assert adaptive["fp32"]["rows_on_device"] is False  # the CPU's plan: every step's rows on the host
    table = (tmp_path / "gpu_vs_circuit_tracer_cpu_smoke.md").read_text()
    assert "| smoke |" in table and "(by intervention: ours " in table
    assert "| smoke-adaptive (64 features explored) |" in table and "| - | - |" in table
    # the pruned graph as `attrgraph build` makes it: the same as prune_graph's on the host
    built = ours["pruned_build"]
    assert built["same_as_host"] and 0 < built["pruning_seconds"] < built["seconds"] and built["edges"] > 0
    assert f"| {built['nodes']:,}, {built['edges']:,} | yes |" in table
    # --profile smoke: that case alone ran once more under torch.profiler: the engine's matrix
    # products were seen, no kernel launches (a CPU), and the ops listed largest first, with shares of
    # the time all of them took (which ops lead depends on the machine's timing: not asserted)
    prof = ours["profile"]
    assert "profile" not in tied["attrgraph"] and "## Profile of smoke " in table
    assert prof["products"] > 0 and prof["launches"] == 0
    ms = [t["ms"] for t in prof["top"]]
    assert ms == sorted(ms, reverse=True) and 0 < sum(t["share"] for t in prof["top"]) <= 1.0001
    # step 7: each process's wall, timed by this script around it, holds the parts its worker timed
    # (each rounded to 0.1 s); circuit-tracer's holds the case's building, which ct_gpu.py prints
    for c, parts in ((case, ["load", *PRECISIONS, "pruned_build", "profile"]), (partial, ["load", "fp32"])):
        walls, theirs = c["attrgraph"]["walls"], c["circuit_tracer"]["walls"]
        assert list(walls) == [*parts, "process"]
        assert 0 < sum(walls[p] for p in parts) <= walls["process"] + 0.05 * len(parts)
        assert 0 < theirs["build_and_save"] <= theirs["process"]
    assert "## Each case's wall time" in table and "- smoke: wall s: circuit-tracer's process " in table


@pytest.mark.slow  # 26 s: circuit-tracer's case built and run, and ours
def test_a_case_is_re_timed_with_fp32_alone(tmp_path):
    """`--precisions fp32 --no-pruned-build`: only the reference run and its comparison (the goal case
    re-timed in a short device call)."""
    peer = require_peer()
    shared = ROOT.parent / "shared" / "peer"
    if not (shared / "ct_gpu.py").is_file():
        pytest.skip("../shared/peer/ct_gpu.py is not beside the project")
    cmd = [sys.executable, "benchmarks/gpu_vs_circuit_tracer.py", "--smoke", "--peer-python", peer]
    cmd += ["--harness", str(shared), "--cases", "smoke", "--precisions", "fp32", "--no-pruned-build"]
    res = subprocess.run([*cmd, "--results", str(tmp_path)], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-3000:]
    (case,) = json.loads((tmp_path / "gpu_vs_circuit_tracer_cpu_smoke.json").read_text())["cases"]
    ours = case["attrgraph"]
    assert ours["fp32"]["match"] and ours["fp32"]["feature_rows_rel_diff"] <= 1e-5
    assert list(ours["walls"]) == ["load", "fp32", "process"]
    assert not {"tf32", "bf16", "pruned_build"} & set(ours)


def test_a_failing_case_is_a_row_with_its_error(tmp_path):
    """circuit-tracer's side dies as it would out of device memory: the script still writes its table,
    with that case's error in the row, and exits 1."""
    harness = tmp_path / "harness"
    harness.mkdir()
    (harness / "ct_gpu.py").write_text(
        "import sys\nsys.exit('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB')\n"
    )
    cmd = [sys.executable, "benchmarks/gpu_vs_circuit_tracer.py", "--smoke", "--ct-path", str(tmp_path)]
    cmd += ["--harness", str(harness), "--results", str(tmp_path)]
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 1, res.stderr[-3000:]
    cases = json.loads((tmp_path / "gpu_vs_circuit_tracer_cpu_smoke.json").read_text())["cases"]
    # the others ran after the first failed
    assert [c["case"] for c in cases] == ["smoke", "smoke-vocab-64", "smoke-adaptive"]
    assert all("CUDA out of memory" in c["error"] for c in cases)
    table = (tmp_path / "gpu_vs_circuit_tracer_cpu_smoke.md").read_text()
    assert (
        "| smoke | failed: circuit-tracer failed on smoke (exit 1): torch.OutOfMemoryError: CUDA out" in table
    )


def failing_harness(tmp_path: Path, body: str) -> list[str]:
    """The benchmark's command with a ct_gpu.py that runs `body` (after `import os, sys, time`)."""
    harness = tmp_path / "harness"
    harness.mkdir()
    (harness / "ct_gpu.py").write_text(f"import os, sys, time\n{body}\n")
    cmd = [sys.executable, "benchmarks/gpu_vs_circuit_tracer.py", "--ct-path", str(tmp_path)]
    return [*cmd, "--harness", str(harness), "--results", str(tmp_path)]


def failed_rows(tmp_path: Path, cmd: list[str]) -> list[dict]:
    """The rows of a run whose every case fails; no case folder is left behind (on the device, a failed
    Gemma case's 8 GB of weights would take the disk the next case needs)."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    env = dict(os.environ, TMPDIR=str(scratch))
    res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    assert res.returncode == 1, res.stderr[-3000:]
    assert not [p.name for p in scratch.iterdir() if p.name.startswith("gpu-")]
    return json.loads((tmp_path / "gpu_vs_circuit_tracer_cpu_smoke.json").read_text())["cases"]


@pytest.mark.parametrize(
    "body, error",
    [  # the host's OOM killer leaves no error output (as gemma2-2b-128 did on an H200): the signal says it
        ("os.kill(os.getpid(), 9)", "circuit-tracer failed on smoke (killed by SIGKILL)"),
        ("time.sleep(60)", "circuit-tracer timed out after 2 s"),
    ],
)
def test_a_case_killed_or_timed_out_says_so(tmp_path, body, error):
    cmd = failing_harness(tmp_path, body) + ["--smoke", "--case-timeout", "2"]
    assert failed_rows(tmp_path, cmd)[0]["error"] == error


def test_the_cases_run_most_wanted_first(tmp_path):
    """With no --cases, the issue's goal case (Llama-1B's shape, 32 tokens) runs first and the slowest
    to build (Gemma-2-2B's) last: a device call cut short keeps the cases wanted most. The first device
    call ran them in alphabetical order, the two Gemma cases first, and used its time on them."""
    cmd = failing_harness(tmp_path, "sys.exit('no GPU here')") + ["--device", "cpu"]
    assert [c["case"] for c in failed_rows(tmp_path, cmd)] == [
        "llama-1b-32",
        "gpt2-small-32",
        "gemma2-2b-32",
        "gpt2-small-128",
        "llama-1b-128",
        "gemma2-2b-128",
    ]


def test_a_harness_without_ct_gpu_is_refused(tmp_path):
    cmd = [sys.executable, "benchmarks/gpu_vs_circuit_tracer.py", "--smoke", "--ct-path", str(tmp_path)]
    res = subprocess.run([*cmd, "--harness", str(tmp_path)], cwd=ROOT, capture_output=True, text=True)
    assert res.returncode == 2 and "holds no ct_gpu.py" in res.stderr


def test_phase_times_split_a_run_whose_rows_stay_on_the_device(monkeypatch, tmp_path):
    """Step 2's split of a run, on the CPU with a GPU's plan: the influence solve and the CSR assembly
    are timed inside the run, and the table gives the rest as setup and row loop; with the CPU's plan
    (rows copied batch by batch) there is nothing to split; the library's methods are restored after."""
    import torch

    import attrgraph.engine.linear_backward as lb
    from attrgraph.engine.attribute import attribute
    from attrgraph.engine.batch_plan import device_budget
    from attrgraph.engine.device_rows import DeviceRows
    from tests.attrgraph.ag_helpers import tiny_model, tiny_transcoders

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import gpu_vs_circuit_tracer as bench

    model = tiny_model("llama", torch.float32)
    tc = tiny_transcoders(model, "plt", True)
    cpu, originals = torch.device("cpu"), (DeviceRows.influence, DeviceRows.to_csr)
    with bench.phase_times(cpu) as host:
        attribute(model, tc, [1, 2, 3, 4, 5, 6, 7])
    assert host == {}
    monkeypatch.setattr(lb, "budget_for", lambda *a: device_budget(8 << 30, 1 << 20, 6))
    t0 = time.perf_counter()
    with bench.phase_times(cpu) as phases:
        attribute(model, tc, [1, 2, 3, 4, 5, 6, 7])
    seconds = time.perf_counter() - t0
    assert set(phases) == {"influence", "csr_assembly"} and 0 < sum(phases.values()) < seconds
    assert (DeviceRows.influence, DeviceRows.to_csr) == originals
    variant = dict(seconds=1.0, edge_rel_err=0.0, feature_jaccard=1.0)
    fp32 = dict(seconds=seconds, floor_share=0.5, peak_gib=float("nan"), phases=phases)
    row = dict(
        case="tiny", circuit_tracer=dict(seconds=2.0), attrgraph=dict(fp32=fp32, tf32=variant, bf16=variant)
    )
    table = bench.write_results([row], "cpu", "a CPU", tmp_path).read_text()
    rest = seconds - sum(phases.values())
    ph = phases
    assert (
        f"| tiny | {seconds:.2f} s | {rest:.2f} s | {ph['influence']:.2f} s | {ph['csr_assembly']:.2f} s | - | - |"
        in table
    )
    # the adaptive method's parts (still the GPU's plan), each summed over its calls: the ranking
    # runs once a step
    from attrgraph.engine import adaptive

    originals = (adaptive._Explorer.influence, adaptive._fold_unexplored, adaptive.streamed_influence)
    steps = []
    with bench.phase_times(cpu, adaptive=True) as parts:
        adaptive.attribute_adaptive(model, tc, [1, 2, 3, 4, 5, 6, 7], max_feature_nodes=6, k=2, trace=steps)
    assert set(parts) == {"ranking", "fold", "influence", "csr_assembly"} and len(steps) == 3
    assert (adaptive._Explorer.influence, adaptive._fold_unexplored, adaptive.streamed_influence) == originals


@pytest.mark.slow  # 13 s: circuit-tracer's graph, and ours twice
def test_partial_graphs_are_compared_on_the_features_both_sides_explored(tmp_path, monkeypatch):
    """The 128-token cases' comparison (peer_compare.compare on a `max_feature_nodes` graph of
    circuit-tracer's, the peer harness's): ours on its schedule (peer_compare's worker: 4 x its batch
    size a step) explores the same features and matches;
    exploring 4 at a time instead of 64, ours picks a few others, which the comparison counts (the
    expected count is the two sets' symmetric difference), while the rows of the features both explored
    still equal circuit-tracer's."""
    import numpy as np

    from attrgraph.bundled.loading import load_model
    from attrgraph.engine.adaptive import attribute_adaptive
    from transcoders.formats import load_transcoders

    args = "--arch gemma2 --n-layers 4 --d-model 64 --n-heads 4 --d-transcoder 256 --prompt-len 20 --l0 8"
    peer_case(tmp_path, args + " --d-vocab 128 --max-feature-nodes 300 --batch-size 16")
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import peer_compare

    # peer_compare's own worker (`--only 6/256/4096-128t-adaptive`) explores on circuit-tracer's schedule
    worker = peer_compare.ours(str(tmp_path), batch_size=16, threads=1)
    assert worker["match"] and worker["features"] == 300 and worker["explored_by_one_side"] == 0

    model, tc = load_model(tmp_path), load_transcoders(tmp_path / "transcoders")
    tokens = np.load(tmp_path / "input_tokens.npy")
    active = np.load(tmp_path / "active_features.npy")
    theirs = set(map(tuple, active[np.load(tmp_path / "selected_features.npy")].tolist()))
    for k in (64, 4):  # circuit-tracer's step (4 x its batch size), and a shorter one
        g = attribute_adaptive(
            model, tc, tokens, max_feature_nodes=300, k=k, exclude_bos=True, embedding="token"
        )
        f = g.nodes.kind == "feature"
        ours = set(zip(g.nodes.layer[f].tolist(), g.nodes.position[f].tolist(), g.nodes.feature[f].tolist()))
        result = peer_compare.compare(g, tmp_path)
        assert result["partial"] and result["explored_by_one_side"] == len(ours ^ theirs)
        assert result["match"] == (ours == theirs) and result["unmapped_abs"] == 0.0
        assert result["feature_rows_rel_diff"] <= 1e-5 and result["logit_rows_rel_diff"] <= 1e-5
    assert ours != theirs  # the shorter step explored others: the comparison above saw them


def test_the_profile_groups_the_products_by_shape():
    """Step 6's products table on products of known shapes: each group's calls, and its flops
    counted by hand (2 M K N, times the batch), largest time first."""
    import torch

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from gpu_vs_circuit_tracer import profile_run

    a, b = torch.ones(30, 40), torch.ones(40, 50)
    x, y = torch.ones(2, 30, 40), torch.ones(2, 40, 60)

    def run():
        for _ in range(3):
            torch.mm(a, b)
        torch.bmm(x, y)
        torch.addmm(torch.ones(30), b.T, a.T)

    prof = profile_run(run, torch.device("cpu"))
    got = {(t["op"], t["shapes"]): (t["calls"], t["gflop"]) for t in prof["top_products"]}
    assert got == {
        ("mm", "[30, 40] @ [40, 50]"): (3, pytest.approx(3 * 2 * 30 * 40 * 50 / 1e9)),
        ("bmm", "[2, 30, 40] @ [2, 40, 60]"): (1, pytest.approx(2 * 2 * 30 * 40 * 60 / 1e9)),
        ("addmm", "[50, 40] @ [40, 30]"): (1, pytest.approx(2 * 50 * 40 * 30 / 1e9)),
    }
    ms = [t["ms"] for t in prof["top_products"]]
    assert ms == sorted(ms, reverse=True)
    assert len(profile_run(run, torch.device("cpu"), groups=2)["top_products"]) == 2  # the two longest

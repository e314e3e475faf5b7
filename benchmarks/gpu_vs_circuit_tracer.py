"""circuit-tracer and attrgraph on the same GPU and identical weights: time, peak memory, agreement, FLOP floor.

1. For each case (a model shape and a prompt length), circuit-tracer's side runs `../shared/peer/ct_gpu.py`
   (`--harness`: a copy of that folder, as on the GPU machine, where ../shared does not travel) in a fresh process (its packages on `--ct-path`, see `../shared/GPU.md`): it builds a seeded random
   model and JumpReLU transcoders calibrated to ~64 active features per layer and position, saves them,
   reloads them on the device, times its `attribute` (second of two runs) and saves its graph.
2. Ours, in a fresh process (`--_worker`): `load_model(DIR, device)`, `load_transcoders(DIR/transcoders,
   device)`, `attribute(..., exclude_bos=True, embedding="token")` twice at each precision (fp32, tf32,
   bf16), the second run timed between `torch.cuda.synchronize()` calls with the peak device memory
   (`torch.cuda.max_memory_allocated`) reset before it; where the rows stay on the device, its
   influence solve and CSR assembly (device_rows.py) are also timed apart (`phase_times`; the adaptive
   method's ranking, folding and influence). Then the
   pruned graph as `attrgraph build` makes it (`pruned_build`): `attribute_pruned`, which on a GPU
   prunes the rows where they are, against `attribute` and `prune_graph` on the host. Where
   circuit-tracer explored fewer features than are active (`max_feature_nodes`, the 128-token cases:
   `LONG_PROMPT_FEATURES`), ours runs `method="adaptive"` with as many, in fp32 only.
3. Agreement (peer_compare.compare): our fp32 feature rows and logit rows against circuit-tracer's,
   each as max |difference| over the largest |edge| of those rows (goal: feature rows 1e-5); for tf32 and
   bf16, the edge error against our own fp32 graph and the overlap (Jaccard) of the features kept by
   pruning (0.8 / 0.98, circuit-tracer's rule). Where the logit rows disagree (beyond 1e-5), the model
   decides: for the feature -> logit edges that differ most, the feature is ablated by constrained
   patching from its layer to the last with attention and normalization frozen (the direct path
   only, `attrgraph.analysis.intervene`), and the change of `logit_t - mean(logits)` at the last
   position is the edge; each side's largest error against it, over the largest edge checked.
4. The FLOP floor: the products our linear backward needs (`meta["backward_gflop"]`, counted per row
   at its own positions) over the device's float32 matmul rate (8192^3 products, TF32 off, best of 3):
   the share of that floor reached is `gflop / seconds / rate`.
5. Print a table and write `benchmarks/results/gpu_vs_circuit_tracer.{md,json}` (on a CPU:
   `..._cpu_smoke.{md,json}`), again after each case, so that a run cut short by its time limit keeps the
   cases it finished; a case that fails is a row with its error, and the next case runs.
6. `--profile CASE`: one more fp32 run of that case under torch.profiler; the ops (kernels) that took
   the most device time and the host's kernel launches, copies and waits, and the matrix products by
   input shapes with their kernels' time and rate, a section of the results.
7. Each case's wall time, part by part: circuit-tracer's process (and of it, building and saving the
   seeded case, which ct_gpu.py does on the CPU) and ours (loading, each precision with its checks, the
   pruned build, the profile), so that a device call's minutes can be planned. `--precisions fp32` and
   `--no-pruned-build` re-time a case with less.

Cases: GPT-2-small (12 layers, d_model 768, 12 heads, 8,192 features), Llama-3.2-1B (16 layers, d_model
2048, 16 heads, 16,384 features) and Gemma-2-2B (26 layers, d_model 2304, 8 heads, 16,384 features),
each at 32 and 128 tokens, in that order of priority (the issue's Llama-1B case first, Gemma-2-2B at 128
tokens last), the 128-token ones with 8,192 features explored (`LONG_PROMPT_FEATURES` says why); vocabularies
of 8,192 (a vocabulary equal to d_model confuses circuit-tracer's logit rows, ../shared/GPU.md). `--smoke`
runs three tiny cases on the CPU (circuit-tracer from the peer venv, `--peer-python`) as this script's own
test: the second with the vocabulary equal to d_model, where the logit rows disagree and step 3's
interventions decide, the third with 64 features explored.

Usage (GPU machine): python benchmarks/gpu_vs_circuit_tracer.py --ct-path CT_PKGS [--cases NAME ...]
        (CPU):         python benchmarks/gpu_vs_circuit_tracer.py --smoke --peer-python /tmp/peer/venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
HARNESS = ROOT.parent / "shared" / "peer"
RESULTS = ROOT / "benchmarks" / "results"
PRECISIONS = ("fp32", "tf32", "bf16")
FEATURE_ROWS_TOL = 1e-5

SHAPES = {  # name: ct_gpu.py arguments (L0 64 per layer and position)
    "gpt2-small": "--arch gpt2 --n-layers 12 --d-model 768 --n-heads 12 --d-transcoder 8192",
    "llama-1b": "--arch llama --n-layers 16 --d-model 2048 --n-heads 16 --d-transcoder 16384",
    "gemma2-2b": "--arch gemma2 --n-layers 26 --d-model 2304 --n-heads 8 --d-transcoder 16384",
}
ORDER = (  # most wanted first (a run cut short keeps these): the table, then by cost
    ("llama-1b", 32),
    ("gpt2-small", 32),
    ("gemma2-2b", 32),
    ("gpt2-small", 128),
    ("llama-1b", 128),
    ("gemma2-2b", 128),
)
LONG_PROMPT_FEATURES = 8192
"""At 128 tokens both sides explore this many features (circuit-tracer's `max_feature_nodes`, ours
`method="adaptive"`), as circuit-tracer is run on long prompts: it holds its edge matrix on the host,
dense float32, [explored features + logits, all nodes], and holds two of them at once to package the
graph, so a full graph at 128 tokens needs 2 x 70 GB (Llama-1B) or 2 x 185 GB (Gemma-2-2B) of host
memory, past the machine's 128 GiB. GPT-2-small's (2 x 39 GB, and 39 GB that ct_gpu.py saves to disk)
would fit, at minutes of a device call; it explores 8,192 too, so that the three compare alike. With
8,192 features the matrix is 3-7 GB."""
CASES = {
    f"{shape}-{n}": f"{SHAPES[shape]} --prompt-len {n} --l0 64 --d-vocab 8192"
    + (f" --max-feature-nodes {LONG_PROMPT_FEATURES}" if n > 32 else "")
    for shape, n in ORDER
}
PEAK = re.compile(r"peak GPU ([0-9.]+) GiB")
BUILT = re.compile(r"case built\+saved in ([0-9.]+)s")
_TINY = "--arch llama --n-layers 2 --d-model 64 --n-heads 4 --d-transcoder 256 --prompt-len 12 --l0 8"
SMOKE = {
    "smoke": f"{_TINY} --d-vocab 128",
    "smoke-vocab-64": f"{_TINY} --d-vocab 64",
    "smoke-adaptive": f"{_TINY} --d-vocab 128 --max-feature-nodes 64",
}
N_CHECKS = 8
"""Step 3: feature -> logit edges checked by intervention where the logit rows disagree."""


def matmul_tflops(device, n: int = 8192, repeats: int = 3) -> float:
    """Step 4: the device's float32 matmul rate, TF32 off (TFLOP/s, best of `repeats`)."""
    import torch

    n = n if device.type == "cuda" else 1024
    a, b = (torch.randn(n, n, device=device) for _ in range(2))
    torch.backends.cuda.matmul.allow_tf32 = False
    best = float("inf")
    for _ in range(repeats + 1):  # the first is a warm-up
        sync(device)
        t0 = time.perf_counter()
        a @ b
        sync(device)
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n**3 / best / 1e12


def sync(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def worker(
    dir_: str, device: str, profile: bool = False, precisions: Sequence[str] = PRECISIONS, pruned: bool = True
) -> dict:
    """Steps 2-4 in this process, on the case folder `dir_` (and step 6 with `profile`): the `precisions`
    asked for (fp32 always, the reference), the pruned build with `pruned`; each part's wall time in
    `walls` (step 7)."""
    import numpy as np
    import torch

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from peer_compare import compare, explored_features

    from attrgraph.bundled.loading import load_model
    from attrgraph.engine.attribute import attribute
    from attrgraph.graph.prune import prune_graph
    from transcoders.formats import load_transcoders

    walls, t_part = {}, time.perf_counter()

    def lap(part: str) -> None:  # step 7: the wall time since the last lap, loading and checks included
        nonlocal t_part
        now = time.perf_counter()
        walls[part] = round(now - t_part, 1)
        t_part = now

    dev = torch.device(device)
    d = Path(dir_)
    model = load_model(d, device=dev)
    tc = load_transcoders(d / "transcoders", device=dev)
    tokens = np.load(d / "input_tokens.npy")
    out, graphs = {"matmul_tflops": round(matmul_tflops(dev), 2), "walls": walls}, {}
    lap("load")  # the model, the transcoders and the matmul rate
    budget = explored_features(d)
    if budget is None:
        options, precisions = {}, ("fp32", *(p for p in precisions if p != "fp32"))
    else:  # circuit-tracer explored `budget` features: ours explores as many (fp32 only)
        options, precisions = dict(method="adaptive", max_feature_nodes=budget), ("fp32",)
        out["max_feature_nodes"] = budget
    for precision in precisions:
        with phase_times(dev, adaptive=budget is not None) as phases:  # each part's time in the timed run

            def build(p=precision, phases=phases):
                phases.clear()
                # "fp32" is every method's (attribute reads it as not given)
                return attribute(
                    model, tc, tokens, exclude_bos=True, embedding="token", precision=p, **options
                )

            g, seconds, peak = second_of_two(build, dev)
        gflop = float(g.meta["backward_gflop"])
        row = dict(
            seconds=round(seconds, 3),
            peak_gib=round(peak, 2),
            backward_gflop=gflop,
            floor_share=round(gflop / seconds / (out["matmul_tflops"] * 1e3), 3),
            nodes=g.n_nodes,
            edges=g.n_edges,
            features=g.n_features,
            phases={k: round(v, 3) for k, v in phases.items()},
        )
        if budget is not None:  # whether every step's rows stayed on the device (adaptive.py)
            row["rows_on_device"] = bool(g.meta["rows_on_device"])
        if precision == "fp32":
            row.update(compare(g, d))
            if row.get("logit_rows_rel_diff", 0.0) > FEATURE_ROWS_TOL:
                row["logit_rows_by_intervention"] = logit_rows_by_intervention(model, tc, tokens, g, d)
        else:
            ref = graphs["fp32"]
            scale = float(abs(ref.adjacency).max())
            row["edge_rel_err"] = float(abs(g.adjacency - ref.adjacency).max()) / scale
            kept = [set(map(tuple, _kept(prune_graph(x, 0.8, 0.98)))) for x in (ref, g)]
            row["feature_jaccard"] = round(len(kept[0] & kept[1]) / max(1, len(kept[0] | kept[1])), 4)
        graphs[precision] = g
        out[precision] = row
        lap(precision)
    if budget is None and pruned:  # `attrgraph build`'s pruned graph is the standard method's
        out["pruned_build"] = pruned_build(model, tc, tokens, graphs["fp32"], dev)
        lap("pruned_build")
    if profile:
        out["profile"] = profile_run(
            lambda: attribute(model, tc, tokens, exclude_bos=True, embedding="token", **options), dev
        )
        lap("profile")
    return out


def second_of_two(run, dev):
    """Step 2's timing: `run()` twice, the second between device syncs with the peak device memory
    reset before it; its result, seconds and peak GiB (NaN off CUDA)."""
    import torch

    for _ in range(2):
        sync(dev)
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        t0 = time.perf_counter()
        result = run()
        sync(dev)
        seconds = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else float("nan")
    return result, seconds, peak


def pruned_build(model, tc, tokens, full, dev) -> dict:
    """Step 2b: `attribute_pruned` at 0.8 / 0.98 (what `attrgraph build` runs; where the rows stay on
    the device they are pruned there, device_prune.py), the second of two runs timed, against
    `prune_graph` on the host of the fp32 graph `full` just built: the times, the peak device
    memory, and whether the two keep the same nodes and edges."""
    import numpy as np
    import scipy.sparse as sp

    from attrgraph.engine.pruned_build import attribute_pruned
    from attrgraph.graph.prune import prune_graph

    pruned, seconds, peak = second_of_two(
        lambda: attribute_pruned(model, tc, tokens, 0.8, 0.98, exclude_bos=True, embedding="token"), dev
    )
    t0 = time.perf_counter()
    host = prune_graph(full, 0.8, 0.98, influence=full.nodes.influence)
    host_seconds = time.perf_counter() - t0
    same = host.n_nodes == pruned.n_nodes and all(
        np.array_equal(getattr(host.nodes, f), getattr(pruned.nodes, f))
        for f in ("kind", "layer", "position", "feature")
    )
    a, b = (sp.csr_array(g.adjacency) for g in (host, pruned))
    for x in (a, b):  # canonical: sorted columns, no explicit zeros (never dense: 10^4 nodes and more)
        x.eliminate_zeros()
        x.sort_indices()
    same = same and np.array_equal(a.indptr, b.indptr) and np.array_equal(a.indices, b.indices)
    return dict(
        seconds=round(seconds, 3),
        pruning_seconds=pruned.meta["pruning_seconds"],
        peak_gib=round(peak, 2),
        host_prune_seconds=round(host_seconds, 3),
        nodes=pruned.n_nodes,
        edges=pruned.n_edges,
        same_as_host=bool(same),
    )


PHASES = {"influence": "influence", "csr_assembly": "CSR assembly", "ranking": "ranking", "fold": "folding"}
"""Step 2: the parts of a run timed apart (key: the table's column), each between device syncs:
where the rows stay on the device, the influence solve and the CSR assembly (`DeviceRows.influence`,
`.to_csr`; the adaptive method's of its folded graph, on the host `streamed_influence`); the
adaptive method's ranking of the unexplored features at every step (`_Explorer.influence`) and its
folding of them into the error nodes (`_fold_unexplored`)."""


def _timed_parts(adaptive: bool) -> list[tuple[object, str, str]]:
    """Step 2's parts of the standard or the adaptive method: (owner, attribute, `PHASES` key)."""
    from attrgraph.engine import adaptive as ad
    from attrgraph.engine.device_rows import DeviceRows

    parts = [(DeviceRows, "influence", "influence"), (DeviceRows, "to_csr", "csr_assembly")]
    if adaptive:
        parts += [
            (ad._Explorer, "influence", "ranking"),
            (ad, "_fold_unexplored", "fold"),
            (ad, "streamed_influence", "influence"),
        ]
    return parts


@contextmanager
def phase_times(dev, adaptive: bool = False):
    """Step 2: seconds in each of the method's parts (`_timed_parts`), summed over its calls, under
    `PHASES`'s keys (the standard method's are absent where the rows went to the host batch by batch,
    as on a CPU); `.clear()` the dict before the run to be timed. Whatever is left of a run is its
    setup and row loop."""
    seconds: dict[str, float] = {}
    parts = _timed_parts(adaptive)
    originals = [getattr(owner, name) for owner, name, _ in parts]

    def timed(original, key):
        def run(*args, **kwargs):
            sync(dev)
            t0 = time.perf_counter()
            result = original(*args, **kwargs)
            sync(dev)
            seconds[key] = seconds.get(key, 0.0) + time.perf_counter() - t0
            return result

        return run

    try:
        for (owner, name, key), original in zip(parts, originals):
            setattr(owner, name, timed(original, key))
        yield seconds
    finally:
        for (owner, name, _), original in zip(parts, originals):
            setattr(owner, name, original)


RUNTIME_CALLS = {  # step 6: what the host asked of the CUDA runtime, by kind
    "launches": ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx"),
    "copies": ("cudaMemcpyAsync", "cudaMemcpy"),
    "host_waits": ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize"),
}


PRODUCTS = {"aten::mm": (0, 1), "aten::bmm": (0, 1), "aten::addmm": (1, 2), "aten::baddbmm": (1, 2)}
"""Step 6: the matrix products, and which of their inputs are the two factors."""


def product_gflop(op: str, shapes: list) -> float:
    """One call's 2 M K N (times its batch) from its input shapes: `[.., M, K] @ [.., K, N]`."""
    a, b = (shapes[i] for i in PRODUCTS[op])
    return 2.0 * math.prod(a[:-2] or [1]) * a[-2] * a[-1] * b[-1] / 1e9


def profile_run(run, dev, top: int = 12, groups: int | None = 12) -> dict:
    """Step 6: one more fp32 run under torch.profiler. The ops (on a GPU: the kernels) that took the
    most device time (the CPU's on a CPU), and the runtime calls the host made (launches, copies,
    waits): what to look at where the run falls short of the FLOP floor. Then the matrix products
    grouped by their input shapes, with the time their kernels took and the rate that gives: which
    products run far below the device's (a kernel's name does not say which product launched it).
    `top` ops are listed, and the `groups` products that took longest (None: every one)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    cuda = dev.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sync(dev)
    t0 = time.perf_counter()
    with torch_profile(activities=activities, record_shapes=True) as prof:
        run()
        sync(dev)
    wall = time.perf_counter() - t0
    avg = list(prof.key_averages())
    if cuda:  # the kernels themselves (an aten op's own device time repeats its kernels')
        timed = [(a, a.self_device_time_total) for a in avg if a.device_type == DeviceType.CUDA]
    else:  # the CPU's own ops: aten's (a profiled op's children are counted apart)
        timed = [(a, a.self_cpu_time_total) for a in avg if a.key.startswith("aten::")]
    total = sum(t for _, t in timed) or 1.0
    counts = {a.key: a.count for a in avg}
    products = []  # an aten product's device time is its kernels'; on a CPU its own time
    for a in prof.key_averages(group_by_input_shape=True):
        if a.key in PRODUCTS:
            us = a.device_time_total if cuda else a.cpu_time_total
            gflop = product_gflop(a.key, a.input_shapes) * a.count
            shapes = " @ ".join(str(list(a.input_shapes[i])) for i in PRODUCTS[a.key])
            tflops = gflop / max(us / 1e3, 1e-3)  # GFLOP per ms is TFLOP/s
            products.append(
                dict(
                    op=a.key[6:],
                    shapes=shapes,
                    calls=a.count,
                    ms=round(us / 1e3, 3),
                    gflop=gflop,
                    tflops=tflops,
                )
            )
    products.sort(key=lambda x: -x["ms"])
    return dict(
        wall_seconds=round(wall, 3),
        busy_seconds=round(total / 1e6, 6),  # device (or CPU op) time in all the timed ops
        products=sum(counts.get(k, 0) for k in PRODUCTS),
        **{kind: sum(counts.get(k, 0) for k in keys) for kind, keys in RUNTIME_CALLS.items()},
        top=[
            dict(op=a.key[:80], calls=a.count, ms=round(t / 1e3, 3), share=round(t / total, 3))
            for a, t in sorted(timed, key=lambda x: -x[1])[:top]
        ],
        top_products=products[:groups],
    )


def _kept(pruned):
    n = pruned.nodes
    m = n.kind == "feature"
    return zip(n.layer[m].tolist(), n.position[m].tolist(), n.feature[m].tolist())


def exit_reason(returncode: int) -> str:
    """'exit 1', or the signal that killed the process ('killed by SIGKILL': the host's OOM killer, say)."""
    if returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    return f"exit {returncode}"


def failure_cell(e: Exception) -> str:
    """A failed case's table cell: which side, why, and the last line of its error output."""
    if isinstance(e, subprocess.TimeoutExpired):
        side = "circuit-tracer" if "ct_gpu.py" in " ".join(map(str, e.cmd)) else "our worker"
        why = f"{side} timed out after {e.timeout:.0f} s"
    else:
        first, *rest = str(e).strip().splitlines()
        last = rest[-1].strip() if len(rest) > 1 else ""  # rest[0] is the command
        why = f"{first}: {last}" if last else first
    return why[:300].replace("|", "/")


def run_case(
    name: str,
    args: str,
    device: str,
    ct: list[str],
    ct_env: dict,
    env: dict,
    keep: Path | None,
    harness: Path = HARNESS,
    timeout: float | None = None,
    worker_args: tuple = (),
) -> dict:
    """Steps 1-2 for one case: circuit-tracer's process (`ct`, `ct_env`), then ours (`env`, with
    `worker_args`: precisions, pruned build, profile), on one folder."""
    folder = Path(tempfile.mkdtemp(prefix=f"gpu-{name}-", dir=keep))
    try:
        return _run_case(name, args, device, ct, ct_env, env, folder, harness, timeout, worker_args)
    finally:  # a failed case's weights (8 GB for Gemma-2-2B) must not fill the disk the next case needs
        if keep is None:
            shutil.rmtree(folder, ignore_errors=True)


def _run_case(name, args, device, ct, ct_env, env, folder: Path, harness, timeout, worker_args) -> dict:
    cmd = [*ct, str(harness / "ct_gpu.py"), str(folder), *args.split(), "--seed", "0"]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, env=dict(ct_env, DEV=device), timeout=timeout)
    ct_wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise RuntimeError(
            f"circuit-tracer failed on {name} ({exit_reason(res.returncode)})\n{' '.join(cmd)}\n{res.stderr[-3000:]}"
        )
    meta = json.loads((folder / "meta.json").read_text())
    log = res.stdout.strip().splitlines()[-1]
    peak = PEAK.search(log)
    built = BUILT.search(res.stdout)
    theirs = dict(
        seconds=round(float(meta["stats"]["attribute_s"]), 3),
        peak_gib=float(peak.group(1)) if peak and device == "cuda" else float("nan"),
        log=log,
        walls=dict(process=round(ct_wall, 1), build_and_save=float(built.group(1)) if built else None),
    )
    ours_cmd = [sys.executable, __file__, "--_worker", str(folder), "--device", device, *worker_args]
    t0 = time.perf_counter()
    res = subprocess.run(ours_cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)
    ours_wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise RuntimeError(
            f"our worker failed on {name} ({exit_reason(res.returncode)})\n{' '.join(ours_cmd)}\n"
            f"{res.stderr[-3000:]}"
        )
    ours = json.loads(res.stdout.strip().splitlines()[-1])
    ours["walls"]["process"] = round(ours_wall, 1)
    return dict(case=name, args=args, circuit_tracer=theirs, attrgraph=ours)


def walls_line(r: dict) -> str:
    """Step 7: where a case's wall time went, both processes."""
    ct, ours = r["circuit_tracer"]["walls"], r["attrgraph"]["walls"]
    parts = ", ".join(f"{k} {v:g}" for k, v in ours.items() if k != "process")
    built = f" (building and saving the case {ct['build_and_save']:g})" if ct["build_and_save"] else ""
    return f"wall s: circuit-tracer's process {ct['process']:g}{built}, ours {ours['process']:g} ({parts})"


def _gib(x) -> str:
    return "-" if x is None or x != x else f"{x:.1f}"  # NaN (the CPU) as a dash


def logit_rows_by_intervention(model, tc, tokens, g, d: Path, n_checks: int = N_CHECKS) -> dict:
    """Step 3's check of the `n_checks` feature -> logit edges where ours and circuit-tracer's differ most:
    one clean record and one batched constrained forward (`patched_forward`), its first row unedited,
    each other row one feature set to 0, all over layers 0..L-1 (below an edit's layer the clamp holds
    the clean outputs, so each row is that feature's direct effect)."""
    import numpy as np
    from peer_compare import ct_index

    from attrgraph.analysis.intervene import patched_forward, resolve_edits
    from attrgraph.engine.replacement import ReplacementModel
    from attrgraph.engine.sources import to_tokens

    idx, _ = ct_index(g, d)
    ref = np.load(d / "adjacency.npy", mmap_mode="r")
    n = g.nodes
    rows = np.flatnonzero(n.kind == "logit")
    cols = np.flatnonzero((n.kind == "feature") & (idx >= 0))  # of a partial graph: those both explored
    ours = g.adjacency[rows][:, cols].toarray()
    theirs = np.asarray(ref[np.ix_(idx[rows], idx[cols])])
    r, c = np.unravel_index(np.argsort(np.abs(ours - theirs), axis=None)[::-1][:n_checks], ours.shape)
    rm = ReplacementModel(model, tc)
    state = rm.run(to_tokens(model, tokens), exclude_bos=False)
    L, P, S = state.acts.shape
    keys = [(int(n.layer[j]), int(n.position[j]), int(n.feature[j])) for j in cols[c]]
    edits = [[]] + [resolve_edits({key: 0.0}, L, P, S) for key in keys]
    z = patched_forward(rm, state, edits, "constrained", (0, L - 1)).logits[:, -1].double()
    z = (z - z.mean(-1, keepdim=True)).cpu().numpy()  # logit_t - mean(logits), clean row first
    toks = np.asarray(g.logit_tokens)[r]
    edge = z[0, toks] - z[1 + np.arange(len(keys)), toks]
    scale = float(np.abs(edge).max()) or 1.0
    return dict(
        checked=len(keys),
        ours_rel_err=float(np.abs(ours[r, c] - edge).max() / scale),
        ct_rel_err=float(np.abs(theirs[r, c] - edge).max() / scale),
    )


def _feature_cell(f32: dict) -> str:
    cell = f"{f32.get('feature_rows_rel_diff', float('nan')):.1e}"
    if f32.get("explored_by_one_side"):  # a partial graph: the rows of the features both explored
        cell += f" ({f32['explored_by_one_side']} features explored by one side only)"
    return cell


def _logit_cell(f32: dict) -> str:
    cell = f"{f32.get('logit_rows_rel_diff', float('nan')):.1e}"
    by = f32.get("logit_rows_by_intervention")
    if by:  # the model's own answer where the two disagree
        cell += f" (by intervention: ours {by['ours_rel_err']:.0e}, CT {by['ct_rel_err']:.0e})"
    return cell


def write_results(rows: list[dict], device: str, device_name: str, results: Path = RESULTS) -> Path:
    stem = "gpu_vs_circuit_tracer" if device == "cuda" else "gpu_vs_circuit_tracer_cpu_smoke"
    lines = [
        f"# circuit-tracer and attrgraph on {device_name}",
        "",
        "Written by `python benchmarks/gpu_vs_circuit_tracer.py` (module docstring: method). Times are the",
        "second of two runs; memory is peak device memory; the floor share is our backward's FLOPs per",
        "second over the device's float32 matmul rate with TF32 off. Where a case explored fewer features than",
        'are active (`max_feature_nodes`, ours `method="adaptive"`), the rows of the explored features and',
        "of the logits are compared on every column but the errors' (circuit-tracer drops the unexplored",
        "features' edges, ours adds them to their error nodes).",
        "",
        "| case | circuit-tracer | attrgraph fp32 | ratio | floor share | peak GiB, CT / ours | feature rows "
        "| logit rows | tf32 (ratio, edge err, Jaccard) | bf16 (ratio, edge err, Jaccard) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['case']} | failed: {r['error']} |" + " |" * 8)
            continue
        ct, ours = r["circuit_tracer"], r["attrgraph"]
        f32 = ours["fp32"]

        def variant(p, ct=ct, ours=ours):
            if p not in ours:  # a partial graph: fp32 only
                return "-"
            v = ours[p]
            return f"{ct['seconds'] / v['seconds']:.2f}x, {v['edge_rel_err']:.1e}, {v['feature_jaccard']:.3f}"

        case = r["case"]
        if "max_feature_nodes" in ours:
            case += f" ({ours['max_feature_nodes']:,} features explored)"
        lines.append(
            f"| {case} | {ct['seconds']:.2f} s | {f32['seconds']:.2f} s | {ct['seconds'] / f32['seconds']:.2f}x "
            f"| {f32['floor_share']:.0%} | {_gib(ct.get('peak_gib'))} / {_gib(f32['peak_gib'])} "
            f"| {_feature_cell(f32)} "
            f"| {_logit_cell(f32)} | {variant('tf32')} | {variant('bf16')} |"
        )
    timed = [r for r in rows if r.get("attrgraph", {}).get("fp32", {}).get("phases")]
    if timed:
        lines += [
            "",
            "## Where each fp32 run's time went (each part between syncs)",
            "",
            "The influence solve and the CSR assembly where the rows stay on the device (the adaptive",
            "method's: of its folded graph; its influence on the host where they did not); the adaptive",
            "method's ranking of the unexplored features at every step and folding of them into the error",
            "nodes (on the host where the rows did not stay on the device).",
            "",
            "| case | run | setup and row loop | " + " | ".join(PHASES.values()) + " |",
            "|---|---|---|" + "---|" * len(PHASES),
        ]
        for r in timed:
            f32 = r["attrgraph"]["fp32"]
            ph = f32["phases"]
            rest = f32["seconds"] - sum(ph.values())
            cells = " | ".join(f"{ph[k]:.2f} s" if k in ph else "-" for k in PHASES)
            lines.append(f"| {r['case']} | {f32['seconds']:.2f} s | {rest:.2f} s | {cells} |")
    built = [r for r in rows if r.get("attrgraph", {}).get("pruned_build")]
    if built:
        lines += [
            "",
            "## The pruned graph (node / edge thresholds 0.8 / 0.98), as `attrgraph build` makes it",
            "",
            "`attribute_pruned` (where the rows stay on the device they are pruned there, and only the",
            "pruned graph is copied to the host) against `attribute` then `prune_graph` on the host.",
            "",
            "| case | attribute_pruned | of which pruning | peak GiB | attribute + prune_graph | nodes, edges "
            "| same as the host's |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in built:
            b, f32 = r["attrgraph"]["pruned_build"], r["attrgraph"]["fp32"]
            lines.append(
                f"| {r['case']} | {b['seconds']:.2f} s | {b['pruning_seconds']:.2f} s | {_gib(b.get('peak_gib'))} "
                f"| {f32['seconds']:.2f} + {b['host_prune_seconds']:.2f} s | {b['nodes']:,}, {b['edges']:,} "
                f"| {'yes' if b['same_as_host'] else 'no'} |"
            )
    walled = [r for r in rows if "walls" in r.get("attrgraph", {})]
    if walled:
        lines += ["", "## Each case's wall time, seconds (step 7)", ""]
        lines += [f"- {r['case']}: {walls_line(r)}" for r in walled]
    for r in rows:
        prof = r.get("attrgraph", {}).get("profile")
        if prof:
            lines += [
                "",
                f"## Profile of {r['case']} (fp32, one more run under torch.profiler)",
                "",
                f"Wall {prof['wall_seconds']:.2f} s; the ops took {prof['busy_seconds']:.2f} s in all (on a GPU, "
                f"kernel time on the device), the largest below; {prof['products']:,} matrix products, "
                f"{prof['launches']:,} kernel launches, {prof['copies']:,} copies, {prof['host_waits']:,} "
                "host waits.",
                "",
                "| op | calls | ms | share |",
                "|---|---|---|---|",
                *(
                    f"| `{t['op']}` | {t['calls']:,} | {t['ms']:.1f} | {t['share']:.0%} |"
                    for t in prof["top"]
                ),
            ]
            if prof.get("top_products"):  # results written before the products were grouped have none
                lines += [
                    "",
                    "The matrix products by input shapes (on a GPU their kernels' time, on a CPU their own; "
                    "the rate is their flops over it):",
                    "",
                    "| product | shapes | calls | ms | TFLOP/s |",
                    "|---|---|---|---|---|",
                    *(
                        f"| {t['op']} | {t['shapes']} | {t['calls']:,} | {t['ms']:.1f} | {t['tflops']:.2f} |"
                        for t in prof["top_products"]
                    ),
                ]
    results.mkdir(parents=True, exist_ok=True)
    (results / f"{stem}.md").write_text("\n".join(lines) + "\n")
    (results / f"{stem}.json").write_text(json.dumps(dict(device=device_name, cases=rows), indent=1) + "\n")
    return results / f"{stem}.md"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--cases",
        nargs="*",
        choices=[*CASES, *SMOKE],
        help="default: all six, in ORDER (with --smoke: its three)",
    )
    ap.add_argument("--device", default=None, help="default: cuda where present, else cpu")
    ap.add_argument("--ct-path", help="folder of circuit-tracer's packages, put on PYTHONPATH for its side")
    ap.add_argument("--peer-python", help="circuit-tracer's own interpreter (the peer venv) instead")
    ap.add_argument("--ag-path", help="folder of attrgraph's dependencies, put on PYTHONPATH for our side")
    ap.add_argument("--smoke", action="store_true", help="one tiny case on the CPU (this script's test)")
    ap.add_argument(
        "--profile", nargs="*", default=[], help="cases also profiled (one more fp32 run each, step 6)"
    )
    ap.add_argument(
        "--case-timeout", type=float, help="seconds for each side of a case, beyond which it is a failed row"
    )
    ap.add_argument(
        "--harness", type=Path, default=HARNESS, help="folder of ct_gpu.py and ct_graph.py (../shared/peer)"
    )
    ap.add_argument("--keep", type=Path, help="keep the case folders under this folder")
    ap.add_argument(
        "--precisions",
        default=",".join(PRECISIONS),
        help="ours at these (comma-separated; fp32, the reference, always): fp32 alone to re-time a case",
    )
    ap.add_argument(
        "--no-pruned-build",
        action="store_true",
        help="leave out step 2b (attribute_pruned against prune_graph)",
    )
    ap.add_argument(
        "--results", type=Path, default=RESULTS, help="where the tables go (default benchmarks/results)"
    )
    ap.add_argument("--_worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    precisions = args.precisions.split(",")
    if set(precisions) - set(PRECISIONS):
        ap.error(f"--precisions: choose from {', '.join(PRECISIONS)}")
    if args._worker:
        out = worker(
            args._worker,
            args.device or "cpu",
            profile=bool(args.profile),
            precisions=precisions,
            pruned=not args.no_pruned_build,
        )
        print(json.dumps(out))
        return 0
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    pool = SMOKE if args.smoke else CASES  # in ORDER
    if set(args.cases or ()) - set(pool):
        ap.error(f"--cases: with{'' if args.smoke else 'out'} --smoke, choose from {', '.join(pool)}")
    cases = {c: pool[c] for c in (args.cases or pool)}
    ours_path = [str(ROOT), args.ag_path, os.environ.get("PYTHONPATH")]
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONPATH=os.pathsep.join(filter(None, ours_path)))
    if args.peer_python:
        ct, ct_env = [args.peer_python], dict(env, PYTHONPATH="")
    elif args.ct_path:
        ct, ct_env = [sys.executable], dict(env, PYTHONPATH=args.ct_path)
    else:
        ap.error("give --ct-path (circuit-tracer's packages) or --peer-python (its venv's python)")
    if not (args.harness / "ct_gpu.py").is_file():
        ap.error(f"--harness {args.harness} holds no ct_gpu.py (a copy of ../shared/peer)")
    device_name = torch.cuda.get_device_name() if device == "cuda" else "the CPU"
    rows = []
    for name, case_args in cases.items():
        try:
            r = run_case(
                name,
                case_args,
                device,
                ct,
                ct_env,
                env,
                args.keep,
                args.harness,
                args.case_timeout,
                worker_args=(
                    "--precisions",
                    args.precisions,
                    *(("--no-pruned-build",) if args.no_pruned_build else ()),
                    *(("--profile", name) if name in args.profile else ()),
                ),
            )
        except (RuntimeError, subprocess.TimeoutExpired) as e:  # out of memory, say: the next case runs
            why = failure_cell(e)
            rows.append(dict(case=name, args=case_args, error=why))
            print(f"{name}: failed\n{e}", flush=True)
        else:
            rows.append(r)
            f32 = r["attrgraph"]["fp32"]
            print(
                f"{name}: circuit-tracer {r['circuit_tracer']['seconds']:.2f} s, ours {f32['seconds']:.2f} s "
                f"({f32['floor_share']:.0%} of the fp32 floor, {_gib(f32['peak_gib'])} GiB), feature rows "
                f"{f32.get('feature_rows_rel_diff', float('nan')):.1e}; {walls_line(r)}",
                flush=True,
            )
        written = write_results(rows, device, device_name, args.results)  # a run cut short keeps these
    print(f"wrote {written}")
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

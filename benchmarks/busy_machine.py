"""attrgraph and circuit-tracer on a machine that is not idle: beside a busy process, with torch's default threads.

1. Case: the peer harness (`/work/shared/peer/ct_graph.py`, see peer_compare.py) writes a seeded
   random gpt2-like model with per-layer transcoders, the prompt and circuit-tracer's adjacency
   into a folder (`--peer-dir DIR` reuses one).
2. Conditions: `as is` (the machine's own load, recorded as load averages) and `busy` (one
   busy-loop process pinned to CPU 0 with `os.sched_setaffinity`, running for the whole condition).
3. In each condition, `--repeats` rounds, each round one fresh process per runner, interleaved:
   circuit-tracer (`ct_graph.py --load DIR --threads T`), ours as a library user gets it
   (peer_compare.py's worker: `attribute(...)` with T torch threads, `OMP_WAIT_POLICY` unset),
   ours with `OMP_WAIT_POLICY=PASSIVE` (what the `attrgraph` command sets), and, with
   `--before DIR`, ours from another source tree (the engine before this change). Every one of
   our runs is checked node for node against circuit-tracer's adjacency (peer_compare.compare).
4. Profile (`as is`, one process per source tree): torch.profiler around the linear engine
   (`linear_rows`) on the case: batches, threads used, kernel launches (leaf torch ops that are
   not views) per batch, and self time by op.
5. Threshold: one process per condition times float32 `[n, d] @ [d, d]` products (d = the case's
   d_model) with 1 and 2 threads (default wait policy): where 2 threads stop losing beside a busy
   core is what `attrgraph/engine/threads.py` PARALLEL_FLOPS is set from.
6. Write `benchmarks/results/busy_machine.{json,md}` (the md starts with the exact command).

Usage: python benchmarks/busy_machine.py [--case 6/256/4096] [--peer-dir DIR] [--repeats 3]
       [--threads 2] [--before DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peer_compare import TIMING  # noqa: E402

PEER_PY = sys.executable
"""The Python of the peer venv (`--peer-python`)."""
PEER_SCRIPT = str(Path(__file__).resolve().parents[2] / "shared" / "peer" / "ct_graph.py")
"""The peer harness (`--peer-harness`)."""

ROOT = Path(__file__).resolve().parent.parent
BUSY = "import os\nos.sched_setaffinity(0, {0})\nwhile True:\n    pass\n"


# ----------------------------------------------------------------------------- workers (subprocess)
def profile_worker(dir_: str, threads: int) -> dict:
    """Step 4: the linear engine under torch.profiler on the case in `dir_`."""
    import torch

    torch.set_num_threads(threads)
    from torch.profiler import ProfilerActivity, profile

    import attrgraph.engine.linear_backward as lbm
    from attrgraph.bundled.loading import load_model
    from attrgraph.engine.replacement import ReplacementModel
    from attrgraph.engine.sources import Injection, build_sources, feature_injections
    from attrgraph.engine.targets import select_logit_targets
    from transcoders.formats import load_transcoders

    d = Path(dir_)
    rm = ReplacementModel(load_model(d), load_transcoders(d / "transcoders"))
    tokens = torch.tensor(np.load(d / "input_tokens.npy"))
    state = rm.run(tokens, exclude_bos=True, embedding="token")
    sources = build_sources(rm, state)
    inj = feature_injections(rm, sources.features)
    inj += [
        Injection(t.vector, len(tokens) - 1, logits=True)
        for t in select_logit_targets(state.logits[-1], 10, 0.95)
    ]
    # count batches and the threads they run on by wrapping the engine's per-batch start
    seen = {"batches": 0, "threads": set()}
    start = lbm.LinearBackward.start

    def counted(self, injections, P):
        seen["batches"] += 1
        seen["threads"].add(torch.get_num_threads())
        return start(self, injections, P)

    lbm.LinearBackward.start = counted
    stats: dict = {}
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        lbm.linear_rows(rm, state, sources, inj, batch_size=512, stats=stats)
    seconds = time.perf_counter() - t0
    lbm.LinearBackward.start = start
    # ops the engine issued (top-level events) and self time by op name (events at every level)
    issued: dict = {}
    for e in prof.events():
        if e.cpu_parent is None and e.name.startswith("aten::"):
            issued[e.name] = issued.get(e.name, 0) + 1
    avg = [a for a in prof.key_averages() if a.key.startswith("aten::")]
    total_ms = sum(a.self_cpu_time_total for a in avg) / 1e3
    top = sorted(avg, key=lambda a: -a.self_cpu_time_total)[:12]
    n = seen["batches"]
    return dict(
        targets=len(inj),
        batches=n,
        threads_in_batches=sorted(seen["threads"]),
        seconds_profiled=round(seconds, 3),
        gflop=round(stats.get("flops", 0) / 1e9, 2),
        ops=sum(issued.values()),
        ops_per_batch=round(sum(issued.values()) / max(n, 1), 1),
        issued_per_batch={
            k: round(c / max(n, 1), 1) for k, c in sorted(issued.items(), key=lambda kv: -kv[1])
        },
        self_ms=round(total_ms, 1),
        top_ops=[
            dict(
                op=a.key,
                calls=a.count,
                per_batch=round(a.count / max(n, 1), 1),
                self_ms=round(a.self_cpu_time_total / 1e3, 1),
                share=round(a.self_cpu_time_total / 1e3 / total_ms, 3),
            )
            for a in top
        ],
    )


def micro_worker(d: int) -> list[dict]:
    """Step 5: float32 [n, d] @ [d, d] with 1 and 2 threads, mean time per product over ~0.5 s
    (the mean, not the median: the cost of spinning is rare long stalls)."""
    import torch

    torch.manual_seed(0)
    rows = []
    for n in (32, 128, 512, 2048, 8192, 32768):
        a, w = torch.randn(n, d), torch.randn(d, d)
        flops = 2.0 * n * d * d
        out = {}
        for t in (1, 2):
            torch.set_num_threads(t)
            a @ w
            reps, t0 = 0, time.perf_counter()
            while reps < 3 or time.perf_counter() - t0 < 0.5:
                a @ w
                reps += 1
            out[t] = (time.perf_counter() - t0) / reps
        rows.append(
            dict(n=n, gflop=flops / 1e9, ms_1=out[1] * 1e3, ms_2=out[2] * 1e3, ratio_2_1=out[2] / out[1])
        )
    return rows


# ----------------------------------------------------------------------------- driver
def clean_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "PYTHONPATH")}
    return dict(env, HF_HUB_OFFLINE="1", **extra)


def run_json(cmd: list[str], env: dict, cwd: Path) -> dict | list:
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=cwd)
    if res.returncode != 0:
        raise RuntimeError(f"failed: {' '.join(cmd)}\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def run_ct(dir_: str, threads: int, batch_size: int) -> dict:
    cmd = [PEER_PY, PEER_SCRIPT, "--load", dir_, "--threads", str(threads), "--batch-size", str(batch_size)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=clean_env())
    if res.returncode != 0:
        raise RuntimeError(f"peer harness failed: {' '.join(cmd)}\n{res.stderr[-2000:]}")
    st = dict(line.split(": ", 1) for line in res.stdout.splitlines() if ": " in line)
    return dict(
        seconds=float(st["attribute_s"]),
        peak_rss_mb=float(st["peak_rss_mb"]),
        threads=int(st["torch_threads"]),
        reload_max_abs_diff=float(st.get("reload_max_abs_diff", "nan")),
    )


def run_ours(tree: Path, dir_: str, threads: int, batch_size: int, passive: bool) -> dict:
    cmd = [
        sys.executable,
        str(tree / "benchmarks" / "peer_compare.py"),
        "--_worker",
        "peer",
        "--_target",
        dir_,
    ]
    cmd += ["--threads", str(threads), "--batch-size", str(batch_size)]
    extra = dict(OMP_WAIT_POLICY="PASSIVE") if passive else {}
    r = run_json(cmd, clean_env(PYTHONPATH=str(tree), **extra), tree)
    keep = ("seconds", "peak_rss_mb", "match", "max_rel_diff", "features", "nodes")
    return {k: r[k] for k in keep if k in r}


class Busy:
    """One busy-loop process pinned to CPU 0 while the block runs (step 2)."""

    def __init__(self, on: bool):
        self.on, self.proc = on, None

    def __enter__(self):
        if self.on:
            self.proc = subprocess.Popen([sys.executable, "-c", BUSY])
            time.sleep(1.0)
        return self

    def __exit__(self, *exc):
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait()


def summarize(samples: list[dict]) -> dict:
    s = [x["seconds"] for x in samples]
    return dict(median_s=float(np.median(s)), seconds=s, samples=samples)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--case", default="6/256/4096", choices=[label for label, _ in TIMING])
    ap.add_argument("--peer-dir", help="a harness output folder of this case to reuse (else one is made)")
    ap.add_argument("--repeats", type=int, default=3, help="rounds per condition (fresh processes)")
    ap.add_argument(
        "--threads", type=int, default=2, help="torch threads on both sides (2 = torch's default here)"
    )
    ap.add_argument("--batch-size", type=int, default=512)
    ap.add_argument(
        "--before", help="another source tree of ours to time beside this one (e.g. the previous commit)"
    )
    ap.add_argument("--before-label", default="", help="what --before is, for the results (e.g. a commit)")
    ap.add_argument("--conditions", default="as-is,busy")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "busy_machine"))
    ap.add_argument("--peer-python", help="the Python of the peer venv (VENV/bin/python)")
    ap.add_argument(
        "--peer-harness", default=str(ROOT.parent / "shared" / "peer"), help="folder of ct_graph.py"
    )
    ap.add_argument("--_worker", help=argparse.SUPPRESS)
    ap.add_argument("--_target", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    global PEER_PY, PEER_SCRIPT
    PEER_PY, PEER_SCRIPT = args.peer_python, str(Path(args.peer_harness) / "ct_graph.py")
    if args._worker == "profile":
        print(json.dumps(profile_worker(args._target, args.threads)))
        return 0
    if args._worker == "micro":
        print(json.dumps(micro_worker(int(args._target))))
        return 0
    if not args.peer_python:  # the workers above run without it
        ap.error("--peer-python is required: the Python of the peer venv (VENV/bin/python).")

    command = "python benchmarks/busy_machine.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    harness = dict(TIMING)[args.case]
    d_model = int(harness[harness.index("--d-model") + 1])
    dir_ = args.peer_dir
    if dir_ is None:
        dir_ = os.path.join(tempfile.mkdtemp(prefix="busy_machine_"), args.case.replace("/", "_"))
        cmd = [
            PEER_PY,
            PEER_SCRIPT,
            *harness,
            "--out",
            dir_,
            "--threads",
            "1",
            "--batch-size",
            str(args.batch_size),
        ]
        subprocess.run(cmd, check=True, capture_output=True, env=clean_env())
    trees = {"ours": ROOT} | ({"before": Path(args.before).resolve()} if args.before else {})
    me = [sys.executable, str(Path(__file__).resolve())]

    profiles = {}
    for name, tree in trees.items():
        cmd = me + ["--_worker", "profile", "--_target", dir_, "--threads", str(args.threads)]
        profiles[name] = run_json(cmd, clean_env(PYTHONPATH=str(tree)), tree)
        print(
            f"profile {name}: {json.dumps({k: v for k, v in profiles[name].items() if k != 'top_ops'})}",
            flush=True,
        )

    conditions = {}
    for cond in args.conditions.split(","):
        runs: dict = {"ct": [], "ours": [], "ours_passive": []} | ({"before": []} if args.before else {})
        loads = [os.getloadavg()]
        with Busy(cond == "busy"):
            micro = run_json(
                me + ["--_worker", "micro", "--_target", str(d_model)], clean_env(PYTHONPATH=str(ROOT)), ROOT
            )
            for rep in range(args.repeats):
                runs["ct"].append(run_ct(dir_, args.threads, args.batch_size))
                runs["ours"].append(run_ours(ROOT, dir_, args.threads, args.batch_size, False))
                runs["ours_passive"].append(run_ours(ROOT, dir_, args.threads, args.batch_size, True))
                if args.before:
                    runs["before"].append(
                        run_ours(trees["before"], dir_, args.threads, args.batch_size, False)
                    )
                loads.append(os.getloadavg())
                print(
                    f"{cond} round {rep}: "
                    + ", ".join(f"{k} {v[-1]['seconds']:.2f} s" for k, v in runs.items()),
                    flush=True,
                )
        conditions[cond] = dict(
            runners={k: summarize(v) for k, v in runs.items()},
            load_average_1min=[round(x[0], 2) for x in loads],
            micro=micro,
        )
    write_results(args, command, dir_, harness, profiles, conditions)
    ok = all(
        s["match"]
        for c in conditions.values()
        for k, r in c["runners"].items()
        if k != "ct"
        for s in r["samples"]
    )
    return 0 if ok else 1


def write_results(args, command, dir_, harness, profiles, conditions) -> None:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = dict(
        command=command,
        case=args.case,
        peer_dir=dir_,
        threads=args.threads,
        batch_size=args.batch_size,
        repeats=args.repeats,
        before=args.before,
        before_label=args.before_label,
        harness=harness,
        date=time.strftime("%Y-%m-%d %H:%M"),
        cpus=os.cpu_count(),
    )
    out.with_suffix(".json").write_text(
        json.dumps(dict(meta=meta, profiles=profiles, conditions=conditions), indent=1)
    )
    names = dict(
        ct="circuit-tracer",
        ours="attrgraph (library default)",
        ours_passive="attrgraph, OMP_WAIT_POLICY=PASSIVE (as the CLI)",
        before="attrgraph before this change",
    )
    lines = [
        f"# attrgraph vs circuit-tracer on a machine that is not idle ({args.case})",
        "",
        f"Command: `{command}`",
        "",
        f"{args.threads} torch threads on both sides (torch's default on this {os.cpu_count()}-core machine), "
        f"batch size {args.batch_size}, median of {args.repeats} fresh processes per runner and condition, "
        "runners interleaved. `busy`: one busy-loop process pinned to CPU 0 for the whole condition. "
        "`as is`: no process of ours beside, but the machine is shared (its 1-minute load average is "
        "given; 2.0 means both cores already busy).",
        "",
        f"Case folder `{dir_}`: the peer harness (`ct_graph.py {' '.join(harness)}`, seeded); circuit-tracer "
        "is timed on it with `--load`."
        + (
            f" Before this change: the source tree `{args.before}` ({args.before_label})."
            if args.before
            else ""
        ),
        "",
        "| condition | 1-min load avg (start..end) | runner | median time | samples | ct / runner | adjacency match |",
        "|---|---|---|---|---|---|---|",
    ]
    for cond, c in conditions.items():
        ct = c["runners"]["ct"]["median_s"]
        la = c["load_average_1min"]
        for k, r in c["runners"].items():
            match = "-" if k == "ct" else str(all(s["match"] for s in r["samples"]))
            lines.append(
                f"| {cond} | {min(la):.1f}..{max(la):.1f} | {names[k]} | {r['median_s']:.2f} s | "
                f"{', '.join(f'{x:.2f}' for x in r['seconds'])} | {ct / r['median_s']:.1f}x | {match} |"
            )
    lines += ["", "## Where the engine's time goes (torch.profiler around `linear_rows`, as is)", ""]
    for name, p in profiles.items():
        lines += [
            f"**{names[name]}**: {p['targets']} targets in {p['batches']} batches on "
            f"{p['threads_in_batches']} thread(s), {p['gflop']} GFLOP, {p['ops']} torch ops issued "
            f"({p['ops_per_batch']} per batch; most frequent: "
            + ", ".join(
                f"{k.removeprefix('aten::')} {v}" for k, v in list(p["issued_per_batch"].items())[:10]
            )
            + f"), {p['seconds_profiled']:.2f} s profiled.",
            "",
            "| op (any level) | calls | per batch | self ms | share of self time |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {o['op']} | {o['calls']} | {o['per_batch']} | {o['self_ms']} | {o['share']:.0%} |"
            for o in p["top_ops"]
        ]
        lines.append("")
    lines += [
        "## Thread threshold: float32 `[n, d] @ [d, d]`, 1 vs 2 threads (default wait policy)",
        "",
        "| condition | n | GFLOP per product | 1 thread ms | 2 threads ms | 2 / 1 |",
        "|---|---|---|---|---|---|",
    ]
    for cond, c in conditions.items():
        lines += [
            f"| {cond} | {m['n']} | {m['gflop']:.3f} | {m['ms_1']:.3f} | {m['ms_2']:.3f} | {m['ratio_2_1']:.2f} |"
            for m in c["micro"]
        ]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())

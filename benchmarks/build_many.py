"""`attrgraph build-many` throughput: graphs per minute with 1 and 2 Ray workers on the bundled model.

1. Prompts: 16 each of six tasks of attrgraph.bundled.tasks (seed 0; induction, ioi, greater_than,
   brackets, addition, facts), 96 in all, written as JSONL.
2. For each worker count, `build_many` into a fresh file with `build`'s defaults (default model,
   default-plt, standard method, one torch thread per worker) on its own local Ray cluster
   (started and shut down by the run, as the CLI does).
3. Two rates: overall (all graphs over the whole run: Ray start, model loading, writing) and steady
   (graphs after the first result over the time from the first to the last result), and their
   2-worker / 1-worker ratios. Writes benchmarks/results/build_many.{json,md}.

Usage: python benchmarks/build_many.py [--per-task 16] [--workers 1,2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
TASKS = ("induction", "ioi", "greater_than", "brackets", "addition", "facts")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--per-task", type=int, default=16)
    ap.add_argument("--workers", default="1,2")
    args = ap.parse_args()
    os.chdir(ROOT)  # Ray workers import attrgraph from the driver's working directory
    from attrgraph.bundled import tasks
    from attrgraph.cli.build_many import build_many

    options = dict(
        model="default",
        transcoders="default-plt",
        node_threshold=0.8,
        edge_threshold=0.98,
        max_logits=None,
        logit_prob=None,
        batch_size=256,
        method="standard",
        tau=None,
        max_feature_nodes=None,
        threads=1,
        full=False,
        strict=False,
        truncate=False,
    )
    rows = [
        {"prompt": ex.prompt, "name": f"{task}_{i}"}
        for task in TASKS
        for i, ex in enumerate(tasks.generate(task, args.per_task, seed=0))
    ]
    load_before = os.getloadavg()[0]
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        prompts = Path(tmp) / "prompts.jsonl"
        prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
        for workers in [int(w) for w in args.workers.split(",")]:
            stamps, worker_s = [], []

            def seen(result, stamps=stamps, worker_s=worker_s):
                stamps.append(time.perf_counter())
                worker_s.append(result.get("seconds", 0.0))

            t0 = time.perf_counter()
            counts = build_many(
                prompts,
                Path(tmp) / f"g{workers}.h5",
                options,
                workers=workers,
                progress=False,
                on_result=seen,
            )
            total = time.perf_counter() - t0
            assert counts["built"] == len(rows) and counts["failed"] == 0, counts
            steady = stamps[-1] - stamps[0]
            runs.append(
                {
                    "workers": workers,
                    "graphs": len(rows),
                    "total_s": round(total, 2),
                    "first_result_s": round(stamps[0] - t0, 2),
                    "graphs_per_min": round(60 * len(rows) / total, 1),
                    "steady_graphs_per_min": round(60 * (len(rows) - 1) / steady, 1),
                    "mean_worker_s_per_graph": round(sum(worker_s) / len(worker_s), 3),
                    "driver_write_s": counts["write_s"],
                }
            )
            print(runs[-1], flush=True)
    base = runs[0]
    for r in runs:
        r["ratio_vs_first"] = round(r["graphs_per_min"] / base["graphs_per_min"], 2)
        r["steady_ratio_vs_first"] = round(r["steady_graphs_per_min"] / base["steady_graphs_per_min"], 2)
    out = {
        "runs": runs,
        "cpu_count": os.cpu_count(),
        "load_average_before": round(load_before, 2),
        "load_average_after": round(os.getloadavg()[0], 2),
        "prompts": f"{args.per_task} each of {', '.join(TASKS)} (attrgraph.bundled.tasks, seed 0)",
        "options": "build defaults: default model, default-plt, standard, 1 torch thread per worker",
    }
    results = ROOT / "benchmarks" / "results"
    (results / "build_many.json").write_text(json.dumps(out, indent=2) + "\n")
    lines = [
        "# build-many throughput (benchmarks/build_many.py)",
        "",
        f"{len(rows)} prompts ({out['prompts']}); {out['options']}. One local Ray cluster per run.",
        f"Machine: {out['cpu_count']} CPUs shared with other users; 1-min load average "
        f"{out['load_average_before']} before, {out['load_average_after']} after.",
        "",
        "| workers | total s | first result s | graphs/min | ratio | steady graphs/min | steady ratio "
        "| worker s/graph | driver write s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        lines.append(
            f"| {r['workers']} | {r['total_s']} | {r['first_result_s']} | {r['graphs_per_min']} "
            f"| {r['ratio_vs_first']} | {r['steady_graphs_per_min']} | {r['steady_ratio_vs_first']} "
            f"| {r['mean_worker_s_per_graph']} | {r['driver_write_s']} |"
        )
    lines += [
        "",
        "graphs/min counts the whole run (Ray start, model and transcoder loading in every worker, "
        "writing); steady counts the graphs after the first result over the time to the last one. "
        "Every graph is written by the driver through save_graph, which copies the file and renames the copy "
        "over it (atomic), so writing costs grow with the file: driver write s is that time in all.",
    ]
    (results / "build_many.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

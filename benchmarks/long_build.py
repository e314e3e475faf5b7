"""The full graph of a 128-token prompt, built and pruned: time and peak memory of every step.

Seed: circuit-tracing appendix, "Attribution Graph Computation" and "Graph Pruning".

1. The prompt: benchmarks/long_prompt.py's (BOS plus task examples until the bundled model's 128
   positions); bundled default + default-plt (about 2.5 10^4 active features, 1.0 10^8 edges since the
   sets were retrained in issue 33).
2. Each path runs `--repeats` times, each time in a fresh process (torch's default threads and
   `OMP_WAIT_POLICY=PASSIVE`, as the `attrgraph` command sets them):
   - `held`: `attribute` (rows, then the influence pass), `prune_graph(influence=...)` (the
     influence attribute computed, not a second pass), `save_graph` of the pruned graph, then
     `save_graph` of the full graph (what `attrgraph build --full` adds);
   - `streamed`: `attribute_pruned` (engine/pruned_build.py: the rows streamed into the influence
     and dropped, the kept rows computed again, edge pruning), then `save_graph` of the pruned graph;
   - `cli`: `attrgraph build PROMPT --json` as a user runs it (the streamed path), its own times
     and the process's peak RSS.
   Per step: wall time and the peak RSS during the step (sampled every 5 ms from /proc; the
   process's kernel peak, ru_maxrss, is recorded too), and the RSS before it.
3. The held and streamed paths' pruned graphs are compared (same nodes and edges; largest
   difference of an edge, relative to the largest edge).
4. Medians over the repeats (every sample in the json) and the 1-minute load average before and
   after each process; writes benchmarks/results/long_build.{json,md}.

Usage: python benchmarks/long_build.py [--repeats 3] [--paths held,streamed,cli]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
PATHS = ("held", "streamed", "cli")


def _rss_gb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30


class Steps:
    """Wall time and sampled peak RSS of each step of one process."""

    def __init__(self):
        self.samples, self.rows, self.running = [], [], True  # (time, RSS GB)
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self):
        while self.running:
            self.samples.append((time.perf_counter(), _rss_gb()))
            time.sleep(0.005)

    def run(self, name: str, fn):
        before = _rss_gb()
        t = time.perf_counter()
        out = fn()
        t_end = time.perf_counter()
        peak = max([before, _rss_gb()] + [r for s, r in self.samples if t <= s <= t_end])
        self.samples.clear()
        self.rows.append(
            dict(
                step=name,
                seconds=round(t_end - t, 3),
                rss_before_gb=round(before, 3),
                peak_rss_gb=round(peak, 3),
            )
        )
        return out


def worker(path: str, out_dir: str) -> dict:
    from long_prompt import prompt_ids

    from attrgraph.bundled.loading import load_model
    from attrgraph.engine.attribute import attribute
    from attrgraph.engine.pruned_build import attribute_pruned
    from attrgraph.graph.prune import prune_graph
    from attrgraph.graph.scores import GraphScores
    from attrgraph.graph.store import save_graph
    from transcoders import load_transcoders

    steps = Steps()
    model, tc = steps.run("load", lambda: (load_model("default"), load_transcoders("default-plt")))
    ids = prompt_ids(model)
    out = Path(out_dir) / f"{path}.h5"
    out.unlink(missing_ok=True)  # a fresh file: adding to the previous repeat's would copy it first
    info = {}
    if path == "held":
        graph = steps.run("attribute", lambda: attribute(model, tc, ids))
        info["attribute_rows_s"] = graph.meta["attribution_seconds"]
        pruned = steps.run("prune", lambda: prune_graph(graph, influence=graph.nodes.influence))
        steps.run("save pruned", lambda: save_graph(pruned, out, "pruned"))
        scores = GraphScores(
            graph.meta["unpruned_replacement_score"], graph.meta["unpruned_completeness_score"]
        )
        steps.run("save full", lambda: save_graph(graph, out, "full", scores=scores))
        info.update(
            nodes=graph.n_nodes, edges=graph.n_edges, features=int((graph.nodes.kind == "feature").sum())
        )
    else:
        pruned = steps.run("attribute_pruned", lambda: attribute_pruned(model, tc, ids))
        steps.run("save pruned", lambda: save_graph(pruned, out, "pruned"))
        m = pruned.meta
        info.update(
            nodes=m["unpruned_n_nodes"], edges=m["unpruned_n_edges"], features=m["unpruned_n_features"]
        )
        info["pruning_s"] = m["pruning_seconds"]  # steps 3-4 of attribute_pruned
    steps.running = False
    info.update(
        n_pos=len(ids),
        pruned_nodes=pruned.n_nodes,
        pruned_edges=pruned.n_edges,
        steps=steps.rows,
        ru_maxrss_gb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3),
    )
    return info


def run_process(cmd: list[str]) -> tuple[str, float, float]:
    """stdout, wall seconds and peak RSS (GB, from wait4) of one process."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", OMP_WAIT_POLICY=os.environ.get("OMP_WAIT_POLICY", "PASSIVE"))
    t = time.perf_counter()
    with tempfile.TemporaryFile("w+") as so, tempfile.TemporaryFile("w+") as se:
        p = subprocess.Popen(cmd, stdout=so, stderr=se, cwd=ROOT, env=env)
        _, status, usage = os.wait4(p.pid, 0)
        p.returncode = os.waitstatus_to_exitcode(status)
        so.seek(0), se.seek(0)
        stdout, stderr = so.read(), se.read()
    if p.returncode != 0:
        raise RuntimeError(stderr[-3000:])
    return stdout, time.perf_counter() - t, usage.ru_maxrss / 2**20


def compare(held: Path, streamed: Path) -> dict:
    from attrgraph.graph.store import load_graph

    a, b = load_graph(held, "pruned"), load_graph(streamed, "pruned")
    same_nodes = a.n_nodes == b.n_nodes and all(
        np.array_equal(getattr(a.nodes, f), getattr(b.nodes, f))
        for f in ("kind", "layer", "position", "feature")
    )
    same_edges = same_nodes and ((a.adjacency != 0) != (b.adjacency != 0)).nnz == 0
    diff = float(abs(a.adjacency - b.adjacency).max() / abs(a.adjacency).max()) if same_edges else None
    return dict(same_nodes=bool(same_nodes), same_edges=bool(same_edges), max_edge_rel_diff=diff)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--paths", default=",".join(PATHS))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "long_build"))
    ap.add_argument("--_worker", help=argparse.SUPPRESS)
    ap.add_argument("--_dir", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._worker:
        print(json.dumps(worker(args._worker, args._dir)))
        return 0
    tmp = Path(tempfile.mkdtemp(prefix="long_build_"))
    samples: dict[str, list] = {p: [] for p in args.paths.split(",")}
    try:
        from long_prompt import prompt_ids

        from attrgraph.bundled.loading import load_model

        model = load_model("default")
        text = model.tokenizer.decode(prompt_ids(model)[1:])  # the CLI prepends the BOS again
        del model
        for r in range(args.repeats):
            for path in samples:
                load0 = os.getloadavg()[0]
                if path == "cli":
                    cmd = [
                        sys.executable,
                        "-m",
                        "attrgraph.cli",
                        "build",
                        text,
                        "-o",
                        str(tmp / "cli.h5"),
                        "--json",
                    ]
                    stdout, wall, peak = run_process(cmd)
                    res = json.loads(stdout)
                    row = dict(
                        times=res["times"],
                        full=res["full"],
                        pruned_nodes=res["pruned"]["n_nodes"],
                        wall_s=round(wall, 3),
                    )
                    row["ru_maxrss_gb"] = round(peak, 3)
                else:
                    cmd = [sys.executable, __file__, "--_worker", path, "--_dir", str(tmp)]
                    stdout, wall, peak = run_process(cmd)
                    row = json.loads(stdout.strip().splitlines()[-1])
                    row["wall_s"], row["ru_maxrss_wait4_gb"] = round(wall, 3), round(peak, 3)
                row["load_1min"] = [round(load0, 2), round(os.getloadavg()[0], 2)]
                samples[path].append(row)
                print(path, r, json.dumps(row), flush=True)
        check = (
            compare(tmp / "held.h5", tmp / "streamed.h5") if {"held", "streamed"} <= set(samples) else None
        )
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    write(args, samples, check)
    return 0


def _median(xs) -> float:
    return float(np.median(xs))


def write(args, samples: dict, check: dict | None) -> None:
    summary = {}
    for path, rows in samples.items():
        if path == "cli":
            keys = rows[0]["times"].keys()
            summary[path] = dict(
                times={k: _median([r["times"][k] for r in rows]) for k in keys},
                peak_rss_gb=_median([r["ru_maxrss_gb"] for r in rows]),
            )
        else:
            names = [s["step"] for s in rows[0]["steps"]]
            summary[path] = dict(
                steps={
                    n: dict(
                        seconds=_median([r["steps"][i]["seconds"] for r in rows]),
                        rss_before_gb=_median([r["steps"][i]["rss_before_gb"] for r in rows]),
                        peak_rss_gb=_median([r["steps"][i]["peak_rss_gb"] for r in rows]),
                    )
                    for i, n in enumerate(names)
                },
                peak_rss_gb=_median([r["ru_maxrss_gb"] for r in rows]),
            )
            if path == "held":
                summary[path]["attribute_rows_s"] = _median([r["attribute_rows_s"] for r in rows])
            if path == "streamed":
                summary[path]["pruning_s"] = _median([r["pruning_s"] for r in rows])
    first = next(iter(samples.values()))[0]
    size = first.get("full") or first
    loads = [x for rows in samples.values() for r in rows for x in r["load_1min"]]
    result = dict(
        repeats=args.repeats,
        cores=os.cpu_count(),
        load_1min_range=[min(loads), max(loads)],
        graph=dict(
            n_pos=128,
            nodes=size.get("nodes", size.get("n_nodes")),
            edges=size.get("edges", size.get("n_edges")),
        ),
        summary=summary,
        check=check,
        samples=samples,
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    g = result["graph"]
    lines = [
        f"# The full graph of a 128-token prompt: {g['nodes']:,} nodes, {g['edges']:,} edges",
        "",
        f"Bundled default + default-plt, `benchmarks/long_prompt.py`'s prompt. Medians of {args.repeats} "
        f"fresh processes per path; peak RSS sampled every 5 ms during each step (the process's "
        f"kernel peak in the last column of each path). This {result['cores']}-core machine was shared: "
        f"1-minute load average {result['load_1min_range'][0]:.1f}-{result['load_1min_range'][1]:.1f} "
        "during the runs, so times are noisy.",
        "",
        "| path | step | time | RSS before | peak RSS |",
        "|---|---|---|---|---|",
    ]
    for path, s in summary.items():
        if path == "cli":
            t = s["times"]
            lines.append(
                "| cli (`attrgraph build`) | "
                + ", ".join(f"{k[:-2]} {v:.1f} s" for k, v in t.items())
                + f" | | | {s['peak_rss_gb']:.2f} GB |"
            )
            continue
        for name, st in s["steps"].items():
            lines.append(
                f"| {path} | {name} | {st['seconds']:.2f} s | {st['rss_before_gb']:.2f} GB | {st['peak_rss_gb']:.2f} GB |"
            )
        lines.append(f"| {path} | process peak (ru_maxrss) | | | {s['peak_rss_gb']:.2f} GB |")
    if "held" in summary:
        lines += [
            "",
            f"Of `attribute`'s {summary['held']['steps']['attribute']['seconds']:.1f} s, the rows took "
            f"{summary['held']['attribute_rows_s']:.1f} s and the influence pass the rest.",
        ]
    if "streamed" in summary:
        lines += [
            "",
            f"Of `attribute_pruned`'s {summary['streamed']['steps']['attribute_pruned']['seconds']:.1f} s, "
            f"pruning (the kept rows again, edge pruning) took {summary['streamed']['pruning_s']:.2f} s.",
        ]
    if check:
        lines += [
            "",
            f"Held and streamed pruned graphs: same nodes {check['same_nodes']}, same edges {check['same_edges']}, "
            f"largest edge difference {check['max_edge_rel_diff']:.1e} of the largest edge (float32 rounding).",
        ]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())

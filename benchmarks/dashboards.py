"""Feature dashboards: throughput (tokens/s) and peak memory of the streaming pass, by corpus size.

1. For each corpus size, in a fresh process: load default + the set, then `compute_dashboards`
   over that many tokens of the bundled corpus (the shipped settings, DashboardConfig's defaults),
   writing to a temporary file. Record the wall time of the pass (tokens/s, model forward
   included), the share of it spent in the dashboards bookkeeping (`DashboardAccumulator.update`),
   the peak RSS of the process and its RSS before the pass, and the accumulator's state size.
2. Bounded memory: the peak RSS must not grow with the corpus; the state (per-feature top-k,
   reservoir, histogram) is fixed by the settings, one chunk's activations come on top.
3. Print a table and write benchmarks/results/dashboards.{md,json}.

Usage: python benchmarks/dashboards.py [--sizes 50000,200000,1000000] [--sets default-plt,default-clt] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def worker(name: str, n_tokens: int) -> dict:
    import transcoders.dashboards as dash
    from attrgraph.bundled.loading import load_model
    from transcoders import DashboardConfig, load_transcoders

    model = load_model("default")
    tc = load_transcoders(name)
    spent = [0.0]
    update = dash.DashboardAccumulator.update

    def timed(self, tokens, acts):
        t = time.perf_counter()
        update(self, tokens, acts)
        spent[0] += time.perf_counter() - t

    dash.DashboardAccumulator.update = timed
    before = rss_mb()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = DashboardConfig(transcoders=name, n_tokens=n_tokens, progress=False)
        t0 = time.perf_counter()
        path = dash.compute_dashboards(cfg, model=model, tc=tc, out=Path(tmp) / "d.h5")
        wall = time.perf_counter() - t0
        import h5py

        with h5py.File(path) as f:
            tokens, state = int(f.attrs["n_tokens"]), int(f.attrs["state_bytes"])
        size = path.stat().st_size
    return {
        "set": name,
        "n_tokens": tokens,
        "wall_s": round(wall, 2),
        "tokens_per_s": round(tokens / wall),
        "bookkeeping_share": round(spent[0] / wall, 3),
        "rss_before_mb": round(before),
        "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "state_mb": round(state / 2**20, 1),
        "file_kb": round(size / 1e3),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="50000,200000,1000000")
    p.add_argument("--sets", default="default-plt,default-clt")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = p.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    if args.worker:
        print(json.dumps(worker(args.worker[0], int(args.worker[1]))))
        return
    rows = []
    for name in args.sets.split(","):
        for n in [int(s) for s in args.sizes.split(",")]:
            cmd = [sys.executable, __file__, "--threads", str(args.threads), "--worker", name, str(n)]
            env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "HF_HUB_OFFLINE": "1"}
            out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env, cwd=ROOT)
            rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(rows[-1], flush=True)
    load = os.getloadavg()
    result = {"threads": args.threads, "load_average": [round(x, 2) for x in load], "rows": rows}
    res = ROOT / "benchmarks" / "results"
    res.mkdir(exist_ok=True)
    (res / "dashboards.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [
        "# Feature dashboards: streaming pass over the bundled corpus (default model, shipped settings)",
        "",
        f"torch threads {args.threads}; a fresh process per row; machine load average at the end "
        f"{load[0]:.1f} (shared machine: tokens/s are noisy). Model forward included; 'bookkeeping' is the "
        "share of the pass in DashboardAccumulator.update (top-k merges, reservoir, histogram).",
        "",
        "| set | tokens | tokens/s | bookkeeping | RSS before | peak RSS | state | file |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['set']} | {r['n_tokens']:,} | {r['tokens_per_s']:,} | {r['bookkeeping_share']:.0%} | "
            f"{r['rss_before_mb']} MB | {r['peak_rss_mb']} MB | {r['state_mb']} MB | {r['file_kb']} kB |"
        )
    (res / "dashboards.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

"""Per-rank peak memory of feature-sharded training at 1, 2 and 4 ranks (issue 23, part 2).

A CLT of `--d-sae` 16384 features per layer on the bundled model (4 layers, d_model 128): 29.4M
parameters, 118 MB of float32, and 470 MB with their gradients and Adam's two moments, which is
what feature sharding must divide; the batch (32 tokens), the activation block (2048 tokens) and
the run (4 steps, a checkpoint after 2 and at the end) are kept small so that the set and its
optimizer dominate. Each run is the training CLI,

    python -m transcoders.train ARGS                                            (1 process)
    python -m torch.distributed.run --standalone --nproc-per-node N -m transcoders.train ARGS

with ARGS = `--kind clt --parallel features --d-sae 16384 --n-tokens 128 --batch-size 32
--block-tokens 2048 --checkpoint-every 2 --out DIR`, except that each rank's process starts as
`benchmarks/sharded_memory.py --rank-report DIR ARGS`, which runs `transcoders.train.main(ARGS)`
unchanged and reads the process's peak resident set (VmHWM, /proc/self/status) when the model is
loaded (the baseline: torch, the model, the tokenizer), when training returns (initialization,
steps, checkpoints: each rank's slice only) and at exit (the set saved, gathered to rank 0 one
tensor at a time, and evaluated, every rank on its slice), writing them to DIR/rank<r>.json. The computed bytes are the rank's parameters
(its `d_sae / N` features of every sharded tensor, the replicated `b_dec` whole) times 16: weights,
gradients, and Adam's two moments in float32. No rank holds the whole trained set at any point;
the exit peak adds evaluation's activations (metrics.py; per rank, at most 2^24 of its features'
activations at a time) and, on rank 0, one gathered tensor at a time (the largest, 33.5 MB here).

    nice python benchmarks/sharded_memory.py [--ranks 1 2 4] [--d-sae 16384]

Writes benchmarks/results/sharded_memory.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).parent / "results"
ARGS = ["--kind", "clt", "--parallel", "features", "--n-tokens", "128", "--batch-size", "32"]
ARGS += ["--block-tokens", "2048", "--checkpoint-every", "2"]


def status_mb() -> dict:
    """VmHWM (peak resident set) and VmRSS of this process, MB."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            fields[key] = round(int(value.split()[0]) / 1024, 1)
    return {"peak_mb": fields["VmHWM"], "rss_mb": fields["VmRSS"]}


def rank_report(folder: str, argv: list[str]) -> int:
    """One rank: `transcoders.train.main(argv)`, with VmHWM read when the model is loaded, when
    `train` returns and at exit, written to `folder/rank<r>.json`."""
    import torch

    import transcoders.train as cli

    marks = {}
    load, train = cli.load_any_model, cli.train

    def load_marked(*args, **kw):
        model = load(*args, **kw)
        marks["model_loaded"] = status_mb()
        return model

    def train_marked(*args, **kw):
        out = train(*args, **kw)
        marks["trained"] = status_mb()
        return out

    cli.load_any_model, cli.train = load_marked, train_marked
    torch.set_num_threads(1)
    t0 = time.time()
    code = cli.main(argv)
    marks["exit"] = status_mb()
    rank = int(os.environ.get("RANK", "0"))
    report = {
        "rank": rank,
        "world": int(os.environ.get("WORLD_SIZE", "1")),
        "wall_s": round(time.time() - t0, 1),
    }
    Path(folder, f"rank{rank}.json").write_text(json.dumps({**report, **marks}))
    return code


def set_bytes_per_rank(d_sae: int, world: int) -> int:
    """Weights, gradients and Adam's two moments (float32) of one rank's parameters of the CLT."""
    import torch

    from transcoders import build_transcoders
    from transcoders.distributed import Dist, local_config
    from transcoders.train import TrainConfig, load_any_model, transcoder_config

    tcfg = transcoder_config(TrainConfig(kind="clt", d_sae=d_sae), load_any_model("default"))
    with torch.device("meta"):
        tc = build_transcoders(local_config(tcfg, Dist(0, world, "features" if world > 1 else "none")))
    return 16 * sum(p.numel() for p in tc.parameters())


def run(world: int, d_sae: int, work: Path) -> list[dict]:
    """The CLI at `world` ranks (1: no torchrun); every rank's report."""
    out = work / f"ranks{world}"
    out.mkdir(parents=True)
    args = [*ARGS, "--d-sae", str(d_sae), "--out", str(out / "run")]
    me = str(Path(__file__).resolve())
    if world == 1:
        cmd = [sys.executable, me, "--rank-report", str(out), *args]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(world)]
        cmd += [me, "--rank-report", str(out), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(ROOT)}
    t0 = time.time()
    done = subprocess.run(["nice", "-n", "10", *cmd], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"{world} rank(s) failed:\n{done.stderr[-3000:]}")
    print(f"{world} rank(s): {time.time() - t0:.0f} s", file=sys.stderr)
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def table(rows: list[dict], d_sae: int) -> str:
    lines = [
        "| ranks | rank | set + grads + Adam, computed (MB) | baseline peak (MB) | training peak - baseline (MB) | exit peak - baseline (MB) |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['world']} | {r['rank']} | {r['set_adam_mb']:.0f} | {r['model_loaded']['peak_mb']:.0f} | "
            f"{r['train_above_mb']:.0f} | {r['exit_above_mb']:.0f} |"
        )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--d-sae", type=int, default=16384)
    args = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for world in args.ranks:
            set_mb = set_bytes_per_rank(args.d_sae, world) / 2**20
            for r in run(world, args.d_sae, Path(work)):
                base = r["model_loaded"]["peak_mb"]
                r.update(
                    set_adam_mb=round(set_mb, 1),
                    train_above_mb=round(r["trained"]["peak_mb"] - base, 1),
                    exit_above_mb=round(r["exit"]["peak_mb"] - base, 1),
                )
                rows.append(r)
    one = next(r for r in rows if r["world"] == 1) if 1 in args.ranks else None
    summary = {}
    for world in args.ranks:
        ranks = [r for r in rows if r["world"] == world]
        worst = max(r["train_above_mb"] for r in ranks)
        summary[world] = {
            "set_adam_mb_per_rank": ranks[0]["set_adam_mb"],
            "max_training_peak_above_baseline_mb": worst,
            "max_exit_peak_above_baseline_mb": max(r["exit_above_mb"] for r in ranks),
            "fraction_of_one_process": round(worst / one["train_above_mb"], 3) if one else None,
        }
    result = {
        "d_sae": args.d_sae,
        "cli_args": [*ARGS, "--d-sae", str(args.d_sae)],
        "threads_per_rank": 1,
        "load": [round(v, 2) for v in os.getloadavg()],
        "rows": rows,
        "summary": summary,
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "sharded_memory.json").write_text(json.dumps(result, indent=1) + "\n")
    md = [
        f"# Per-rank peak memory of feature-sharded training (CLT, d_sae {args.d_sae}, bundled model)",
        "",
        "`nice python benchmarks/sharded_memory.py` (CLI args: `" + " ".join(result["cli_args"]) + "`).",
        "Baseline: the rank's peak resident set once the model is loaded; training peak: when `train` returns",
        "(each rank: its slice only); exit peak: the set has also been saved (gathered to rank 0 one tensor",
        "at a time) and evaluated (every rank on its slice).",
        "",
        table(rows, args.d_sae),
        "",
        "| ranks | set + grads + Adam per rank (MB) | worst rank's training peak - baseline (MB) | of one process | worst rank's exit peak - baseline (MB) |",
        "|---:|---:|---:|---:|---:|",
    ]
    for world, s in summary.items():
        frac = f"{s['fraction_of_one_process']:.2f}" if s["fraction_of_one_process"] is not None else "-"
        md.append(
            f"| {world} | {s['set_adam_mb_per_rank']:.0f} | {s['max_training_peak_above_baseline_mb']:.0f} | {frac} | "
            f"{s['max_exit_peak_above_baseline_mb']:.0f} |"
        )
    (RESULTS / "sharded_memory.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--rank-report"]:
        sys.exit(rank_report(sys.argv[2], sys.argv[3:]))
    sys.exit(main())

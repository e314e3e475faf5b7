"""Where our trainer's steps spend their time on a device (issue 29: training on the GPU).

On an H200 our trainer trained the bundled model's transcoders at about 64,000 tokens/s, fp32 and bf16
alike (benchmarks/results/gpu/2026-11-27_h200): a rate that does not move with the arithmetic is the
host's, not the device's. This script says where the time goes, for our real `Trainer`
(transcoders/trainer.py: a batch from the store's shard, its copy to the device, normalization, the
coder's forward and loss, the finite check, backward, clipping, Adam, the fired record), on the
bundled model's activations, for each `--runs` entry `ACTIVATION:BATCH` (default topk:512, the
frontier's setting, topk:4096 and jumprelu:4096):

1. setup: `Trainer(...)` with its shards written beforehand (the model runs once, not timed);
2. `--steps` steps after 5 warm-up steps, synchronized once at the end: ms per step, tokens/s;
3. as many more under torch.profiler (gpu_vs_circuit_tracer.py `profile_run`): the device's busy
   time per step and its share of the wall time (on a GPU the rest is the host launching kernels or
   waiting for them), kernel launches, copies and host waits per step, the top kernels.

On a CPU (this script's test) the same, with the CPU's ops in place of kernels.

    python benchmarks/gpu_train_steps.py --device cuda [--autocast]

Writes benchmarks/results/gpu_train_steps_{cuda,cpu}[_bf16].{json,md}.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT))  # this tree's transcoders, not an installed one
sys.path.insert(0, str(ROOT / "benchmarks"))
WARMUP = 5


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure(model, activation: str, batch: int, args, work: Path) -> dict:
    """Steps 1-3 for one run."""
    from gpu_vs_circuit_tracer import profile_run

    from transcoders.train import TrainConfig
    from transcoders.trainer import Trainer

    n_steps = WARMUP + 2 * args.steps
    cfg = TrainConfig(
        kind="plt",
        activation=activation,
        k=args.k,
        d_sae=args.d_sae,
        batch_size=batch,
        n_tokens=batch * n_steps,
        block_tokens=max(args.block_tokens, batch),
        cache_dir=str(work / "cache"),
        out=str(work / "run"),
        checkpoint_every=10**9,
        device=args.device,
        autocast=args.autocast,
    )
    built = Trainer(cfg, model=model)  # writes the shards the steps read (the model runs here)
    per_block = built.store.batches_per_block
    for b in range(-(-n_steps // per_block)):
        built.store.block(b)
    del built
    device = torch.device(args.device)
    sync(device)
    t0 = time.perf_counter()
    trainer = Trainer(cfg, model=model)
    sync(device)
    setup = time.perf_counter() - t0
    batches = trainer.store.batches(0)
    for _ in range(WARMUP):
        trainer.step(*next(batches))
    sync(device)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        trainer.step(*next(batches))
    sync(device)
    ms = (time.perf_counter() - t0) / args.steps * 1e3

    def steps():
        for _ in range(args.steps):
            trainer.step(*next(batches))

    prof = profile_run(steps, device, top=args.top)
    n = args.steps
    return dict(
        activation=activation,
        batch=batch,
        setup_s=round(setup, 3),
        step_ms=round(ms, 3),
        tokens_per_s=round(batch / (ms / 1e3)),
        busy_ms_per_step=round(prof["busy_seconds"] * 1e3 / n, 3),
        busy_share=round(prof["busy_seconds"] / prof["wall_seconds"], 3),
        **{k: round(prof[k] / n, 1) for k in ("launches", "copies", "host_waits", "products")},
        top=[dict(t, calls=t["calls"] / n, ms=t["ms"] / n) for t in prof["top"]],  # per step
    )


def write(out: Path, meta: dict, runs: list[dict]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(dict(meta=meta, runs=runs), indent=1))
    on = meta["device_name"] + (" under bfloat16 autocast" if meta["autocast"] else ", float32")
    lines = [
        f"# Our trainer's steps on {on}",
        "",
        f"Written by `python benchmarks/gpu_train_steps.py` (module docstring: method); {meta['date']}. "
        f"PLT on all {meta['n_layers']} layers of the bundled model (d_model {meta['d_model']}), d_sae "
        f"{meta['d_sae']}, k {meta['k']} for TopK; {meta['steps']} timed steps after {WARMUP} warm-up "
        "steps, then as many under torch.profiler. Busy: the device's kernel time per step (on a CPU, "
        "its ops' time), and its share of the step's wall time.",
        "",
        "| run | setup s | ms per step | tokens/s | busy ms per step | busy share | launches per step "
        "| copies per step | host waits per step |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        lines.append(
            f"| {r['activation']}, batch {r['batch']} | {r['setup_s']:.2f} | {r['step_ms']:.2f} | "
            f"{r['tokens_per_s']:,} | {r['busy_ms_per_step']:.2f} | {r['busy_share']:.0%} | "
            f"{r['launches']:g} | {r['copies']:g} | {r['host_waits']:g} |"
        )
    for r in runs:
        lines += ["", f"## {r['activation']}, batch {r['batch']}: top ops by device time", ""]
        lines += ["| op | calls per step | ms per step | share |", "|---|---|---|---|"]
        lines += [f"| `{t['op']}` | {t['calls']:g} | {t['ms']:.3f} | {t['share']:.0%} |" for t in r["top"]]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--autocast", action="store_true", help="train under bfloat16 autocast")
    ap.add_argument("--runs", nargs="+", default=["topk:512", "topk:4096", "jumprelu:4096"])
    ap.add_argument("--d-sae", type=int, default=1024)
    ap.add_argument("--k", type=int, default=30)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--block-tokens", type=int, default=65536)
    ap.add_argument("--top", type=int, default=8, help="ops listed per run")
    ap.add_argument("--out", help="default benchmarks/results/gpu_train_steps_DEVICE[_bf16]")
    args = ap.parse_args(argv)
    runs = []
    for spec in args.runs:
        activation, _, batch = spec.partition(":")
        if activation not in ("topk", "jumprelu", "batchtopk", "relu") or not batch.isdigit():
            ap.error(f"--runs takes ACTIVATION:BATCH (topk, jumprelu, batchtopk or relu), not {spec!r}")
        runs.append((activation, int(batch)))
    import attrgraph.bundled  # noqa: F401  (registers the bundled model: a checkout not pip-installed)
    from transcoders.train import load_any_model

    model = load_any_model("default", args.device)
    device_name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "the CPU"
    dev = args.device.split(":")[0]
    out = Path(args.out or RESULTS / f"gpu_train_steps_{dev}{'_bf16' if args.autocast else ''}")
    meta = dict(
        device_name=device_name,
        autocast=args.autocast,
        n_layers=model.cfg.n_layers,
        d_model=model.cfg.d_model,
        d_sae=args.d_sae,
        k=args.k,
        steps=args.steps,
        torch=torch.__version__,
        date=time.strftime("%Y-%m-%d %H:%M"),
    )
    results = []
    for activation, batch in runs:
        work = Path(tempfile.mkdtemp(prefix="gpu_train_steps_"))
        try:
            r = measure(model, activation, batch, args, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        results.append(r)
        print(
            f"{activation}, batch {batch}: setup {r['setup_s']:.2f} s, {r['step_ms']:.2f} ms per step "
            f"({r['tokens_per_s']:,} tokens/s), busy {r['busy_share']:.0%}, {r['launches']:g} launches and "
            f"{r['host_waits']:g} host waits per step",
            flush=True,
        )
        write(out, meta, results)  # a run cut short keeps the runs done
    print(f"wrote {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where our trainer's steps spend their time on a device (issue 29: training on the GPU).

On an H200 our trainer trained the bundled model's transcoders at about 64,000 tokens/s, fp32 and bf16
alike (benchmarks/results/gpu/2026-11-27_h200): a rate that does not move with the arithmetic is the
host's, not the device's. This script says where the time goes, for our real `Trainer`
(transcoders/trainer.py: a batch from the store's shard, its copy to the device, normalization, the
coder's forward and loss, the finite check, backward, clipping, Adam, the fired record), for each
`--runs` entry `MODEL:ACTIVATION:BATCH:D_SAE`. MODEL is `bundled` (4 layers, d_model 128, its corpus)
or `wide`: a randomly initialized 2-layer model of d_model `--wide-d-model` (2048, a Llama-1B's width)
on random tokens, whose activations have the shapes of real training at that width. By default
bundled:topk:512:1024 (the frontier's setting), bundled:topk:4096:1024, bundled:jumprelu:4096:1024,
wide:topk:4096:16384 and wide:jumprelu:4096:16384, TopK's k `--k`:

1. setup: `Trainer(...)`, which builds the first block (the model runs on its device); with `--store
   shards` the activations go through disk shards (`--cache-dir`), all written beforehand, untimed;
2. `--steps` steps after 5 warm-up steps, synchronized once at the end: ms per step, tokens/s. With
   `--store memory` (train.py's default), the blocks after the first are built within the timed steps,
   as in training: the model's forward is part of the cost (on a GPU the block then stays there, no
   copy per step: activation_store.py step 3b); with shards, each batch is read from disk and copied;
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
import warnings
from pathlib import Path
from typing import NamedTuple

import torch

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT))  # this tree's transcoders, not an installed one
sys.path.insert(0, str(ROOT / "benchmarks"))
WARMUP = 5
MODELS = ("bundled", "wide")
ACTIVATIONS = ("topk", "jumprelu", "batchtopk", "relu")
DEFAULT_RUNS = [
    "bundled:topk:512:1024",
    "bundled:topk:4096:1024",
    "bundled:jumprelu:4096:1024",
    "wide:topk:4096:16384",
    "wide:jumprelu:4096:16384",
]


class Run(NamedTuple):
    model: str
    activation: str
    batch: int
    d_sae: int

    @property
    def name(self) -> str:
        return f"{self.model}, {self.activation}, batch {self.batch}, d_sae {self.d_sae}"


def parse_run(spec: str) -> Run:
    parts = spec.split(":")
    ok = len(parts) == 4 and parts[0] in MODELS and parts[1] in ACTIVATIONS
    if not ok or not (parts[2].isdigit() and parts[3].isdigit()):
        raise ValueError(
            f"--runs takes MODEL:ACTIVATION:BATCH:D_SAE (MODEL {' or '.join(MODELS)}, ACTIVATION one of "
            f"{', '.join(ACTIVATIONS)}), not {spec!r}"
        )
    return Run(parts[0], parts[1], int(parts[2]), int(parts[3]))


def wide_model(d_model: int, device: str):
    """Step 0 for `wide`: a randomly initialized 2-layer model of width `d_model` (heads of 128)."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(
        n_layers=2,
        d_model=d_model,
        n_heads=max(1, d_model // 128),
        d_head=min(128, d_model),
        d_mlp=4 * d_model,
        d_vocab=1024,
        n_ctx=128,
        act_fn="gelu",
        normalization_type="LN",
        seed=0,
        device=device,
    )
    with warnings.catch_warnings():  # "HookedTransformer is deprecated": it is the project's backend
        warnings.simplefilter("ignore", DeprecationWarning)
        return HookedTransformer(cfg).eval()


def measure(model, sequences, run: Run, args, work: Path) -> dict:
    """Steps 1-4 for one run."""
    from gpu_vs_circuit_tracer import profile_run, sync

    from transcoders.train import TrainConfig
    from transcoders.trainer import Trainer

    n_steps = WARMUP + 2 * args.steps
    cfg = TrainConfig(
        kind="plt",
        activation=run.activation,
        k=args.k,
        d_sae=run.d_sae,
        batch_size=run.batch,
        n_tokens=run.batch * n_steps,
        block_tokens=max(args.block_tokens, run.batch),
        cache_dir=str(work / "cache") if args.store == "shards" else "",
        out=str(work / "run"),
        checkpoint_every=10**9,
        device=args.device,
        autocast=args.autocast,
    )
    if args.store == "shards":  # written beforehand: the steps only read them
        built = Trainer(cfg, model=model, sequences=sequences)
        for b in range(-(-n_steps // built.store.batches_per_block)):
            built.store.block(b)
        del built
    device = torch.device(args.device)
    sync(device)
    t0 = time.perf_counter()
    trainer = Trainer(cfg, model=model, sequences=sequences)
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

    prof = profile_run(steps, device, top=args.top, groups=None)  # every product: a step has a few shapes
    n = args.steps
    d_model, n_layers = model.cfg.d_model, model.cfg.n_layers
    encoder_tflops = 2 * run.batch * n_layers * d_model * run.d_sae / (ms / 1e3) / 1e12
    return dict(
        **run._asdict(),
        d_model=d_model,
        n_layers=n_layers,
        setup_s=round(setup, 3),
        step_ms=round(ms, 3),
        tokens_per_s=round(run.batch / (ms / 1e3)),
        busy_ms_per_step=round(prof["busy_seconds"] * 1e3 / n, 3),
        busy_share=round(prof["busy_seconds"] / prof["wall_seconds"], 3),
        **{k: round(prof[k] / n, 1) for k in ("launches", "copies", "host_waits", "products")},
        # 4 significant digits: on a CPU the rate is some 10^-4 TFLOP/s, which 4 decimals rounded by
        # a tenth (encoder_share, from the unrounded rate, then disagreed with the rounded one's)
        encoder_tflops=float(f"{encoder_tflops:.4g}"),
        encoder_share=float(f"{encoder_tflops / args.matmul_tflops:.4g}"),
        top=[dict(t, calls=t["calls"] / n, ms=t["ms"] / n) for t in prof["top"]],  # per step
        top_products=[
            dict(t, calls=t["calls"] / n, ms=t["ms"] / n, gflop=t["gflop"] / n) for t in prof["top_products"]
        ],
    )


def write(out: Path, meta: dict, runs: list[dict]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(dict(meta=meta, runs=runs), indent=1))
    on = meta["device_name"] + (" under bfloat16 autocast" if meta["autocast"] else ", float32")
    lines = [
        f"# Our trainer's steps on {on}",
        "",
        f"Written by `python benchmarks/gpu_train_steps.py` (module docstring: method); {meta['date']}. "
        f"PLT on every layer; k {meta['k']} for TopK; {meta['steps']} timed steps after {WARMUP} warm-up "
        "steps, then as many under torch.profiler; "
        + (
            f"blocks of {meta['block_tokens']:,} tokens in memory, built as the steps go (the model's forward "
            "included). "
            if meta["store"] == "memory"
            else "batches read from disk shards written beforehand. "
        )
        + "Busy: the device's kernel time per step (on a CPU, its "
        "ops' time), and its share of the step's wall time. Encoder: the encoder product's flops per "
        f"second of a step, and that rate's share of the device's float32 matmul rate ({meta['matmul_tflops']:.1f} TFLOP/s, "
        "TF32 off).",
        "",
        "| run | layers / d_model | setup s | ms per step | tokens/s | busy ms per step | busy share "
        "| launches per step | copies per step | host waits per step | encoder TFLOP/s (share) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        lines.append(
            f"| {Run(r['model'], r['activation'], r['batch'], r['d_sae']).name} | {r['n_layers']} / "
            f"{r['d_model']} | {r['setup_s']:.2f} | {r['step_ms']:.2f} | {r['tokens_per_s']:,} | "
            f"{r['busy_ms_per_step']:.2f} | {r['busy_share']:.0%} | {r['launches']:g} | {r['copies']:g} | "
            f"{r['host_waits']:g} | {r['encoder_tflops']:.2f} ({r['encoder_share']:.0%}) |"
        )
    for r in runs:
        name = Run(r["model"], r["activation"], r["batch"], r["d_sae"]).name
        lines += ["", f"## {name}: top ops by device time", ""]
        lines += ["| op | calls per step | ms per step | share |", "|---|---|---|---|"]
        lines += [f"| `{t['op']}` | {t['calls']:g} | {t['ms']:.3f} | {t['share']:.0%} |" for t in r["top"]]
        lines += ["", f"## {name}: matrix products by input shapes (their kernels' time, and rate)", ""]
        lines += ["| product | shapes | calls per step | ms per step | TFLOP/s |", "|---|---|---|---|---|"]
        lines += [
            f"| {t['op']} | {t['shapes']} | {t['calls']:g} | {t['ms']:.3f} | {t['tflops']:.2f} |"
            for t in r.get("top_products", [])
        ]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--autocast", action="store_true", help="train under bfloat16 autocast")
    ap.add_argument("--runs", nargs="+", default=DEFAULT_RUNS, help="MODEL:ACTIVATION:BATCH:D_SAE each")
    ap.add_argument("--wide-d-model", type=int, default=2048, help="the wide model's width")
    ap.add_argument("--k", type=int, default=30)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--block-tokens", type=int, default=65536)
    ap.add_argument(
        "--store",
        choices=("memory", "shards"),
        default="memory",
        help="blocks in memory, built as the steps go (train.py's default), or disk shards written beforehand",
    )
    ap.add_argument("--top", type=int, default=8, help="ops listed per run")
    ap.add_argument("--out", help="default benchmarks/results/gpu_train_steps_DEVICE[_bf16]")
    args = ap.parse_args(argv)
    try:
        runs = [parse_run(spec) for spec in args.runs]
    except ValueError as e:
        ap.error(str(e))
    from gpu_vs_circuit_tracer import matmul_tflops

    import attrgraph.bundled  # noqa: F401  (registers the bundled model: a checkout not pip-installed)
    from transcoders.train import load_any_model

    device = torch.device(args.device)
    args.matmul_tflops = matmul_tflops(device)
    device_name = torch.cuda.get_device_name(device) if device.type == "cuda" else "the CPU"
    out = Path(args.out or RESULTS / f"gpu_train_steps_{device.type}{'_bf16' if args.autocast else ''}")
    meta = dict(
        device_name=device_name,
        autocast=args.autocast,
        k=args.k,
        steps=args.steps,
        store=args.store,
        block_tokens=args.block_tokens,
        matmul_tflops=args.matmul_tflops,
        torch=torch.__version__,
        date=time.strftime("%Y-%m-%d %H:%M"),
    )
    models: dict = {}
    results = []
    for run in runs:
        if run.model not in models:
            if run.model == "bundled":
                models[run.model] = (load_any_model("default", args.device), None)  # its corpus
            else:
                g = torch.Generator().manual_seed(0)
                tokens = torch.randint(0, 1024, (4096, 128), generator=g)
                models[run.model] = (wide_model(args.wide_d_model, args.device), tokens)
        model, sequences = models[run.model]
        work = Path(tempfile.mkdtemp(prefix="gpu_train_steps_"))
        try:
            r = measure(model, sequences, run, args, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        results.append(r)
        print(
            f"{run.name}: setup {r['setup_s']:.2f} s, {r['step_ms']:.2f} ms per step "
            f"({r['tokens_per_s']:,} tokens/s), busy {r['busy_share']:.0%}, {r['launches']:g} launches and "
            f"{r['host_waits']:g} host waits per step, encoder {r['encoder_share']:.0%} of the matmul rate",
            flush=True,
        )
        write(out, meta, results)  # a run cut short keeps the runs done
    print(f"wrote {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

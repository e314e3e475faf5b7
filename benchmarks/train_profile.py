"""Where a TopK training step of `python -m transcoders.train` spends its time: dense step vs sparse step.

The step of benchmarks/train_vs_sparsify.py (4 layers, d_model 128, d_sae 1024, k 32, 1024 tokens,
AuxK on with `--dead` of the features dead, Adam, gradient clipping), on random activations:

- dense: `tc(x)` (full [batch, n_layers, d_sae] encoder, TopK, decoder) + losses.py `topk_aux_loss`
  (a second top-k over all features and a second dense decode), the path every set took before
  transcoders/sparse_topk.py;
- sparse: `sparse_topk.TopKStep`, the step train.py now takes for TopK PLT / SAE sets.

Per path: median wall time per step over `--steps` steps (after warm-up), then torch.profiler over
the same number of steps, the operators with the most self CPU time. One torch thread.

    python benchmarks/train_profile.py

Writes benchmarks/results/train_profile.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT))  # this tree's transcoders, not an installed one


def make_step(path: str, n_layers: int, d_model: int, d_sae: int, k: int, dead_frac: float, seed: int):
    from transcoders import TranscoderConfig, build_transcoders
    from transcoders.losses import mse_loss, topk_aux_loss
    from transcoders.sparse_topk import TopKStep

    cfg = TranscoderConfig(
        kind="plt", n_layers=n_layers, d_model=d_model, d_sae=d_sae, activation="topk", k=k
    )
    tc = build_transcoders(cfg).init_weights(torch.Generator().manual_seed(seed))
    opt = torch.optim.Adam(tc.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(seed + 1)
    dead = torch.rand(n_layers, d_sae, generator=g) < dead_frac
    step_fn = TopKStep(tc, 2 * k)

    def step(x, y):
        if path == "dense":
            res = tc(x)
            loss = mse_loss(res.out, y) + topk_aux_loss(tc, res.pre_acts, y - res.out, dead, 2 * k) / 32
        else:
            res = step_fn(x, y, dead)
            loss = mse_loss(res.out, y) + res.aux_loss / 32
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(tc.parameters(), 1.0)
        opt.step()

    return step


def measure(path: str, args) -> dict:
    from torch.profiler import ProfilerActivity, profile

    g = torch.Generator().manual_seed(args.seed + 2)
    shape = (args.batch_size, args.n_layers, args.d_model)
    batches = [(torch.randn(shape, generator=g), torch.randn(shape, generator=g)) for _ in range(4)]
    step = make_step(path, args.n_layers, args.d_model, args.d_sae, args.k, args.dead, args.seed)
    for i in range(3):
        step(*batches[i % 4])
    times = []
    for i in range(args.steps):
        t0 = time.perf_counter()
        step(*batches[i % 4])
        times.append(time.perf_counter() - t0)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for i in range(args.steps):
            step(*batches[i % 4])
    rows = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in rows)
    ops = [
        dict(
            op=e.key,
            calls_per_step=e.count / args.steps,
            self_ms_per_step=e.self_cpu_time_total / 1e3 / args.steps,
            share=e.self_cpu_time_total / total,
        )
        for e in rows[: args.top]
    ]
    ms = statistics.median(times) * 1e3
    return dict(step_ms=ms, tokens_per_s=args.batch_size / (ms / 1e3), ops=ops)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch-size", type=int, default=1024)
    ap.add_argument("--n-layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=128)
    ap.add_argument("--d-sae", type=int, default=1024)
    ap.add_argument("--k", type=int, default=32)
    ap.add_argument("--dead", type=float, default=0.05, help="fraction of features dead (AuxK on)")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--top", type=int, default=8, help="operators listed per path")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(RESULTS / "train_profile"))
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    torch.set_flush_denormal(True)
    res = {path: measure(path, args) for path in ("dense", "sparse")}
    meta = dict(vars(args), threads=1, load_average=os.getloadavg(), date=time.strftime("%Y-%m-%d %H:%M"))
    meta.pop("out")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(dict(meta=meta, results=res), indent=1))
    d, s = res["dense"], res["sparse"]
    lines = [
        "# One TopK training step: dense vs sparse (transcoders/sparse_topk.py)",
        "",
        f"{args.n_layers} layers, d_model {args.d_model}, d_sae {args.d_sae}, k {args.k}, {args.batch_size} tokens "
        f"per step, AuxK with {args.dead:.0%} of the features dead, Adam + clipping, 1 torch thread; median of "
        f"{args.steps} steps, then torch.profiler over {args.steps} more; load average at the end "
        f"{', '.join(f'{x:.1f}' for x in meta['load_average'])}.",
        "",
        "| step | ms per step | tokens/s |",
        "|---|---|---|",
        f"| dense | {d['step_ms']:.1f} | {d['tokens_per_s']:,.0f} |",
        f"| sparse | {s['step_ms']:.1f} | {s['tokens_per_s']:,.0f} |",
        "",
        f"Sparse / dense: {d['step_ms'] / s['step_ms']:.2f}x faster.",
    ]
    for path in ("dense", "sparse"):
        lines += [
            "",
            f"{path}: operators by self CPU time",
            "",
            "| operator | calls per step | ms per step | share |",
        ]
        lines.append("|---|---|---|---|")
        for o in res[path]["ops"]:
            lines.append(
                f"| {o['op']} | {o['calls_per_step']:.1f} | {o['self_ms_per_step']:.1f} | {o['share']:.0%} |"
            )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

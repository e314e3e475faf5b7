"""Adaptive graphs on a prompt of the bundled model's full context (128 tokens): memory and influence vs budget.

Seed: circuit-tracing appendix, end of "Attribution Graph Computation" (adaptive graphs).

1. The prompt: BOS plus task examples from attrgraph.bundled.tasks (seed 0) joined until n_ctx tokens.
2. For each feature budget, in a fresh process: `attribute_adaptive(max_feature_nodes=budget)`
   on default + default-plt; record wall time and peak RSS (ru_maxrss of that process), the graph's
   size, and its scores (scores.py): the replacement score is the share of the inputs' logit
   influence that runs through explored features rather than errors + unexplored features (the
   influence captured), the completeness score the influence-weighted share of non-error inputs.
3. Print a table and write benchmarks/results/long_prompt.{md,json,png}.

Usage: python benchmarks/long_prompt.py [--budgets 0,64,...] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
BUDGETS = "0,32,128,256,512,1024,2048"

from attrgraph.engine.adaptive import EXPLORE_STEP  # noqa: E402 (after the path)


def prompt_ids(model) -> list[int]:
    from attrgraph.bundled.tasks import stream

    ids = [int(model.tokenizer.bos_token_id)]
    for ex in stream(seed=0):
        ids += model.to_tokens(ex.text, prepend_bos=False)[0].tolist()
        if len(ids) >= model.cfg.n_ctx:
            return ids[: model.cfg.n_ctx]
    raise RuntimeError("the task stream ended")


def worker(budget: int, transcoders: str, k: int) -> dict:
    from attrgraph.bundled.loading import load_model
    from attrgraph.engine.adaptive import attribute_adaptive
    from attrgraph.graph.scores import compute_graph_scores
    from transcoders import load_transcoders

    model = load_model("default")
    tc = load_transcoders(transcoders)
    ids = prompt_ids(model)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    t0 = time.perf_counter()
    g = attribute_adaptive(model, tc, ids, max_feature_nodes=budget, k=k)
    seconds = time.perf_counter() - t0
    s = compute_graph_scores(g)
    return dict(
        budget=budget,
        n_pos=len(ids),
        n_active=g.meta["n_active_features"],
        n_explored=g.meta["n_explored"],
        nodes=g.n_nodes,
        edges=g.n_edges,
        replacement=s.replacement,
        completeness=s.completeness,
        seconds=round(seconds, 2),
        rss_before_mb=round(rss0),
        peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budgets", default=BUDGETS)
    ap.add_argument("--transcoders", default="default-plt")
    ap.add_argument(
        "--k", type=int, default=EXPLORE_STEP, help="features explored per step (default: the library's)"
    )
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "long_prompt"))
    ap.add_argument("--_budget", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._budget is not None:
        import torch

        torch.set_num_threads(args.threads)
        print(json.dumps(worker(args._budget, args.transcoders, args.k)))
        return 0
    rows = []
    for b in [int(x) for x in args.budgets.split(",")]:
        cmd = [
            sys.executable,
            __file__,
            "--_budget",
            str(b),
            "--transcoders",
            args.transcoders,
            "--k",
            str(args.k),
            "--threads",
            str(args.threads),
        ]
        res = subprocess.run(
            cmd, capture_output=True, text=True, cwd=ROOT, env=dict(os.environ, HF_HUB_OFFLINE="1")
        )
        if res.returncode != 0:
            raise RuntimeError(res.stderr[-3000:])
        rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(dict(threads=args.threads, k=args.k, rows=rows), indent=1))
    r0 = rows[0]
    lines = [
        f"# Adaptive graphs on a {r0['n_pos']}-token prompt (bundled default + {args.transcoders}, {r0['n_active']} active features)",
        "",
        f"k = {args.k} features explored per step, torch threads {args.threads}; peak RSS of a fresh process per budget "
        "(the model and transcoders alone take the 'before' figure).",
        "",
        "| budget | explored | nodes | edges | replacement (influence captured) | completeness | time | RSS before | peak RSS |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['budget']} | {r['n_explored']} | {r['nodes']} | {r['edges']} | {r['replacement']:.3f} | "
            f"{r['completeness']:.3f} | {r['seconds']:.1f} s | {r['rss_before_mb'] / 1024:.2f} GB | {r['peak_rss_mb'] / 1024:.2f} GB |"
        )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.6))
    xs = [max(r["n_explored"], 1) for r in rows]
    ax.plot(xs, [r["replacement"] for r in rows], "o-", label="replacement (influence captured)")
    ax.plot(xs, [r["completeness"] for r in rows], "s-", label="completeness")
    ax.set_xscale("log")
    ax.set_xlabel("features explored (budget)")
    ax.set_ylabel("score")
    ax.set_title(f"{r0['n_pos']}-token prompt, {r0['n_active']} active features")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The appendix's interference analysis on the bundled sets ("Interference Weights over More Features").

For [default-plt, default-attn-sae] and [default-clt, default-attn-sae]: sample `--per-layer`
features of every (site, layer) among those that fire on the corpus, take their input and output
virtual weights (norm denominators at their corpus means) and the coactivation of every such pair
over `--seqs` sequences of the bundled corpus (attrgraph/analysis/interference.py), and bin the
weights: per bin, how many, how many of their pairs ever fire together on one token, and the share.

Writes benchmarks/results/global_weights.{json,md,png}; re-run after retraining the sets with
    OMP_NUM_THREADS=1 python benchmarks/global_weights.py   (about a minute)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

SETS = ("default-plt", "default-clt")


def corpus(model, n_seqs: int, seed: int) -> torch.Tensor:
    """The first `n_seqs` packed sequences of the bundled corpus (the sets' training data)."""
    from transcoders.train import sequence_source

    it = sequence_source(model, "bundled", seed)()
    return torch.tensor([next(it) for _ in range(n_seqs)])


def summarize(r, n_bins: int) -> dict:
    """Counts, coactive shares and quantiles of one analysis (all weights, and the largest ones)."""
    from attrgraph.analysis.interference import bin_table

    table = bin_table(r.weight, r.ever, n_bins)
    w, ever = r.weight, r.ever
    out = dict(
        n_features=len(r.features),
        n_weights=int(len(w)),
        n_positions=int(r.n_positions),
        share_coactive_all=float(ever.mean()),
        bins=dict(
            edges=table["edges"].tolist(),
            count=table["count"].tolist(),
            coactive=table["coactive"].tolist(),
        ),
    )
    for q in (0.99, 0.999, 0.9999):
        hi = np.quantile(w, q)
        lo = np.quantile(w, 1 - q)
        out[f"share_coactive_above_q{q}"] = float(ever[w >= hi].mean())
        out[f"share_coactive_below_q{1 - q:.4f}"] = float(ever[w <= lo].mean())
        out[f"weight_q{q}"] = float(hi)
    small = np.abs(w) <= np.quantile(np.abs(w), 0.5)
    out["share_coactive_smallest_half"] = float(ever[small].mean())
    return out, table


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--per-layer", type=int, default=25, help="features sampled per (site, layer)")
    p.add_argument("--seqs", type=int, default=200, help="corpus sequences (128 tokens each)")
    p.add_argument("--bins", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "global_weights"))
    args = p.parse_args(argv)
    torch.set_num_threads(1)

    import attrgraph
    import transcoders
    from attrgraph.analysis.interference import interference

    model = attrgraph.load_model("default")
    seqs = corpus(model, args.seqs, args.seed)
    attn = transcoders.load_transcoders("default-attn-sae")
    results, tables = {}, {}
    for name in SETS:
        t0 = time.perf_counter()
        r = interference(
            model,
            [transcoders.load_transcoders(name), attn],
            seqs,
            n_per_layer=args.per_layer,
            seed=args.seed,
        )
        results[name], tables[name] = summarize(r, args.bins)
        results[name]["seconds"] = round(time.perf_counter() - t0, 1)
        print(name, json.dumps({k: v for k, v in results[name].items() if k != "bins"}))

    out = Path(args.out)
    meta = dict(
        command="OMP_NUM_THREADS=1 python benchmarks/global_weights.py",
        per_layer=args.per_layer,
        seqs=args.seqs,
        seed=args.seed,
        sets={n: f"[{n}, default-attn-sae]" for n in SETS},
        norm_scales="corpus means (1 / mean(1 / s)) per norm",
    )
    out.with_suffix(".json").write_text(json.dumps(dict(meta=meta, results=results), indent=1))
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # one PNG, one panel per set (plot_interference draws the same panel on its own figure)
    fig = plt.figure(figsize=(10, 9))
    for i, n in enumerate(SETS):
        ax = fig.add_subplot(len(SETS), 1, i + 1)
        t = tables[n]
        mid, width = (t["edges"][1:] + t["edges"][:-1]) / 2, np.diff(t["edges"])
        ax.bar(mid, t["count"], width=width, color="#bbbbbb", log=True, label="all virtual weights")
        ax.bar(
            mid, t["coactive"], width=width * 0.6, color="#d62728", log=True, label="pair ever coactivates"
        )
        for x, c, s in zip(mid, t["count"], t["share"]):
            if c > 0:
                ax.text(x, c * 1.15, f"{100 * s:.0f}%", ha="center", va="bottom", fontsize=6, rotation=90)
        ax.set_title(f"[{n}, default-attn-sae]: {results[n]['n_features']} sampled features")
        ax.set_ylabel("number of weights")
        ax.legend(loc="upper right", fontsize=8)
    ax.set_xlabel("virtual weight (norm denominators at their corpus means)")
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=100)

    lines = [
        "# Global weights: how many virtual weights are ever used (bundled sets)",
        "",
        f"`{meta['command']}`; {args.per_layer} features sampled per (site, layer) among those that fire, "
        f"{args.seqs} sequences of the bundled corpus; norm denominators at their corpus means.",
        "",
        "| sets | features | weights | positions | coactive (all) | smallest half by abs | top 1% | top 0.1% | top 0.01% | bottom 1% | bottom 0.1% | seconds |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n in SETS:
        r = results[n]
        lines.append(
            f"| [{n}, default-attn-sae] | {r['n_features']} | {r['n_weights']:,} | {r['n_positions']:,} | "
            f"{100 * r['share_coactive_all']:.1f}% | {100 * r['share_coactive_smallest_half']:.1f}% | "
            f"{100 * r['share_coactive_above_q0.99']:.1f}% | {100 * r['share_coactive_above_q0.999']:.1f}% | "
            f"{100 * r['share_coactive_above_q0.9999']:.1f}% | {100 * r['share_coactive_below_q0.0100']:.1f}% | "
            f"{100 * r['share_coactive_below_q0.0010']:.1f}% | {r['seconds']} |"
        )
    lines += [
        "",
        "Shares: of the weights in that range, the share whose pair fires together on at least one token.",
        "",
    ]
    out.with_suffix(".md").write_text("\n".join(lines))
    print("wrote", out.with_suffix(".md"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Hierarchical vs standard attribution on the bundled model's IOI prompts (seed: linear-computation-graphs,
section 3, Figure 2b).

1. For each of `--n` IOI prompts (attrgraph.bundled.tasks, seed 0), build the full graph with one target,
   the logit difference `logit(IO) - logit(S)` at the last position (attribute, default-plt).
2. Standard attribution: one pass (hierarchical_attribution with tau = -inf) gives every feature's
   attribution `a_v grad_v`; keep the features with attribution >= tau; the kept subgraph's share
   of the root is the leaf sum of the same algorithm restricted to that set (Theorem 3.1).
3. Hierarchical attribution: Algorithm 1 with the same tau (detaching during the pass).
4. Thresholds: 30 values of tau, log-spaced from 1e-4 to 0.5 times each prompt's root value.
   Per method and tau, average over prompts the number of kept features and the logit recovered
   (kept share / root value). Also check on one prompt that the model-based
   `attribute_hierarchical` keeps the same features as the graph-based pass.
5. At equal size, per (prompt, tau) point of the hierarchical curve: interpolate standard's curve
   at the same feature count and count both the points where hierarchical recovers at least as
   much and those where its recovered share is at least as close to 1 (recovering more is not
   better once both over-shoot 1); ties count for both and are reported.
6. Print a table; write benchmarks/results/hierarchical_vs_standard.{md,json,png}
   (hierarchical_vs_standard_abs.* with --absolute).

Usage: python benchmarks/hierarchical_vs_standard.py [--n 20] [--transcoders default-plt] [--absolute]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=20, help="number of IOI prompts")
    ap.add_argument("--transcoders", default="default-plt")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument(
        "--absolute", action="store_true", help="threshold |attribution| instead of the seed's signed rule"
    )
    ap.add_argument(
        "--out",
        help="results path without suffix (default: benchmarks/results/hierarchical_vs_standard, "
        "with _abs appended under --absolute)",
    )
    ap.add_argument("--replot", action="store_true", help="only redraw the figure from the stored JSON")
    args = ap.parse_args(argv)
    if args.out is None:
        args.out = str(
            ROOT / "benchmarks" / "results" / f"hierarchical_vs_standard{'_abs' if args.absolute else ''}"
        )
    if args.replot:
        stored = json.loads(Path(args.out).with_suffix(".json").read_text())
        plot(stored["rows"], stored["meta"].get("n_prompts", args.n), Path(args.out), args.absolute)
        return 0
    torch.set_num_threads(args.threads)
    from attrgraph.bundled.loading import load_model
    from attrgraph.bundled.tasks import ioi_pairs
    from attrgraph.engine.attribute import attribute
    from attrgraph.engine.hierarchical import attribute_hierarchical, hierarchical_attribution
    from attrgraph.engine.replacement import ReplacementModel
    from attrgraph.engine.targets import logit_difference
    from transcoders import load_transcoders

    model = load_model("default")
    rm = ReplacementModel(model, load_transcoders(args.transcoders))
    fracs = np.logspace(-4, math.log10(0.5), 30)
    std = np.zeros((args.n, len(fracs), 2))
    hier = np.zeros((args.n, len(fracs), 2))
    n_features, roots, check = [], [], None
    t0 = time.perf_counter()
    for i, ex in enumerate(ioi_pairs(args.n, seed=0)):
        target = logit_difference(model, ex.meta["io"], ex.meta["s"])
        g = attribute(model, rm, ex.prompt, targets=[target])
        kinds = g.nodes.kind
        one = hierarchical_attribution(g, -math.inf)
        root = one.root_value
        roots.append(root)
        n_features.append(g.n_features)
        feats = kinds == "feature"
        for j, frac in enumerate(fracs):
            tau = frac * abs(root)
            score = np.abs(one.attribution) if args.absolute else one.attribution
            s = hierarchical_attribution(g, keep=score >= tau)
            h = hierarchical_attribution(g, tau, absolute=args.absolute)
            std[i, j] = (int((s.kept & feats).sum()), s.leaf_sum(kinds) / root)
            hier[i, j] = (int((h.kept & feats).sum()), h.leaf_sum(kinds) / root)
        if i == 0:
            tau = float(fracs[10] * abs(root))
            gm = attribute_hierarchical(model, rm, ex.prompt, tau=tau, root=target, absolute=args.absolute)
            h = hierarchical_attribution(g, tau, absolute=args.absolute)
            res, n = gm.meta, gm.nodes
            # Theorem 3.1 with the bias leaves measured independently: the frozen model with every source at 0
            state = rm.run(model.to_tokens(ex.prompt)[0], exclude_bos=res["exclude_bos"])
            z = rm.forward(
                state,
                torch.zeros_like(state.acts),
                torch.zeros_like(state.errors),
                torch.zeros_like(state.embed),
            )
            attr, f = np.asarray(res["attribution"]), n.kind == "feature"
            bias = (attr[f] / n.activation[f].astype(np.float64)) @ z.pre_acts[
                n.layer[f], n.position[f], n.feature[f]
            ].double().numpy()
            bias += float(z.logits[-1].double() @ target.vector.double())
            leaves = attr[(n.kind == "embedding") | (n.kind == "error")].sum()
            check = dict(
                tau=tau,
                features_model=int(gm.n_features),
                features_graph=int((h.kept & feats).sum()),
                theorem_rel_error=abs(leaves + bias + res["detached_attribution"] - res["root_value"])
                / abs(res["root_value"]),
                seconds_model=res["attribution_seconds"],
                seconds_full_graph=g.meta["attribution_seconds"],
            )
    seconds = time.perf_counter() - t0
    rows = []
    for j, frac in enumerate(fracs):
        rows.append(
            dict(
                tau_over_root=float(frac),
                std_nodes=float(std[:, j, 0].mean()),
                std_recovered=float(std[:, j, 1].mean()),
                hier_nodes=float(hier[:, j, 0].mean()),
                hier_recovered=float(hier[:, j, 1].mean()),
            )
        )
    # at equal size: interpolate each method's recovered share at the other's node counts
    # (ties, where both recover the same share, e.g. both keep no feature, count for both shares)
    better = closer = ties = n_pts = 0
    for i in range(args.n):
        xs, ys = std[i, ::-1, 0], std[i, ::-1, 1]
        for x, y in hier[i]:
            if xs.min() <= x <= xs.max():
                y_std = np.interp(x, xs, ys)
                n_pts += 1
                better += int(y >= y_std - 1e-9)
                closer += int(abs(1 - y) <= abs(1 - y_std) + 1e-9)
                ties += int(abs(y - y_std) <= 1e-9)
    meta = dict(
        n_prompts=args.n,
        transcoders=args.transcoders,
        mean_features=float(np.mean(n_features)),
        mean_root=float(np.mean(roots)),
        seconds=round(seconds, 1),
        model_vs_graph=check,
        hier_at_least_standard_share=better / max(1, n_pts),
        hier_closer_to_one_share=closer / max(1, n_pts),
        tie_share=ties / max(1, n_pts),
        n_points=n_pts,
        absolute=args.absolute,
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    lines = [
        f"# Hierarchical vs standard attribution ({args.n} IOI prompts, default + {args.transcoders}, root = logit(IO) - logit(S))",
        "",
        f"mean active features {meta['mean_features']:.0f}, mean root {meta['mean_root']:.3f}; "
        f"share of (prompt, tau) points where hierarchical recovers at least what standard recovers at the same size: "
        f"{meta['hier_at_least_standard_share']:.2f}; where its recovered share is at least as close to 1: "
        f"{meta['hier_closer_to_one_share']:.2f} (both counts include the {meta['tie_share']:.2f} of ties, "
        f"out of {n_pts} points). Threshold rule: {'|attr| >= tau' if args.absolute else 'attr >= tau (seed)'}.",
        "",
        "| tau / root | standard: features | standard: logit recovered | hierarchical: features | hierarchical: logit recovered |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['tau_over_root']:.2e} | {r['std_nodes']:.1f} | {r['std_recovered']:.3f} | {r['hier_nodes']:.1f} | {r['hier_recovered']:.3f} |"
        )
    lines += ["", f"model-based check (prompt 0): {json.dumps(check)}"]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    plot(rows, args.n, out, args.absolute)
    return 0


def plot(rows: list[dict], n: int, out: Path, absolute: bool = False) -> None:
    """`out`.png: logit difference recovered against features kept, both methods, with the root at 1."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    ax.plot(
        [r["std_nodes"] for r in rows],
        [r["std_recovered"] for r in rows],
        "o-",
        ms=3,
        label="standard (one pass, then threshold)",
    )
    ax.plot(
        [r["hier_nodes"] for r in rows],
        [r["hier_recovered"] for r in rows],
        "s--",
        ms=3,
        label="hierarchical",
    )
    ax.axhline(1.0, color="grey", lw=0.8, label="the whole logit difference")
    ax.set_xscale("symlog", linthresh=1)
    ax.set_xlim(0, None)
    ax.set_xlabel("features kept (mean over prompts)")
    ax.set_ylabel("logit difference recovered (mean)")
    rule = "|attr| >= tau" if absolute else "attr >= tau"
    ax.set_title(f"IOI, bundled model ({n} prompts, {len(rows)} thresholds, {rule})", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out.with_suffix(".png"), dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())

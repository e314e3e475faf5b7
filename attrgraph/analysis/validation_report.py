"""The validation report: headline numbers over graphs, a JSON file, a Markdown table and PNG plots.

1. `summarize_results`: per evaluation of validate.py, the mean over graphs (node-to-logit log-log
   Pearson averaged over windows; feature-to-feature Spearman, mean per graph and pooled over all
   pairs; faithfulness cosine (mean) and normalized MSE (median per graph, then mean) per layer
   after the perturbation).
2. `write_report`: `<stem>.json` (summary and per-graph numbers), `<stem>.md`, and three plots
   `<stem>_node_to_logit.png`, `<stem>_feature_to_feature.png`, `<stem>_faithfulness.png`.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from attrgraph.analysis.stats import nan_stat, spearman
from attrgraph.errors import OptionError


def strip_private(d):
    """`d` without the `_`-prefixed plot data (for JSON reports)."""
    if isinstance(d, dict):
        return {k: strip_private(v) for k, v in d.items() if not str(k).startswith("_")}
    if isinstance(d, list):
        return [strip_private(v) for v in d]
    return d


def summarize_results(results: list[dict]) -> dict:
    """Means over graphs of every headline number, plus the pooled feature-to-feature Spearman."""
    n2l = {
        k: nan_stat(np.mean, [r["node_to_logit"]["mean"][k] for r in results])
        for k in results[0]["node_to_logit"]["mean"]
    }
    ff = [r["feature_to_feature"]["spearman"] for r in results]
    infl = np.concatenate([r["feature_to_feature"]["_scatter"]["influence"] for r in results])
    eff = np.concatenate([r["feature_to_feature"]["_scatter"]["effect"] for r in results])
    faith = {}
    for kind in ("encoder", "random", "upstream"):
        per = [r["faithfulness"][kind] for r in results if kind in r["faithfulness"]]
        if per:
            depth = max(len(p["cosine"]) for p in per)
            faith[kind] = {
                m: [nan_stat(np.mean, [p[m][k] for p in per if len(p[m]) > k]) for k in range(depth)]
                for m in ("cosine", "nmse")
            }
    return {
        "n_graphs": len(results),
        "node_to_logit_loglog_pearson": n2l,
        "feature_to_feature_spearman_mean": nan_stat(np.mean, ff),
        "feature_to_feature_spearman_pooled": spearman(infl, eff) if len(infl) > 2 else math.nan,
        "faithfulness_by_layer_after": faith,
    }


def write_report(
    results: list[dict],
    names: list[str],
    out_dir: str | Path,
    title: str = "validation",
    stem: str = "validate",
) -> dict:
    """Write `<stem>.json`, `<stem>.md` and `<stem>_*.png` into `out_dir`; returns the summary. They
    are made in a temporary folder inside it and moved into place once all are written: a full disk
    (or another write error) leaves the old report as it was and is `OptionError` in one line."""
    from transcoders.h5file import write_error

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{stem}.", dir=out_dir))  # the report is whole or not written
    try:
        summary = _write_report(results, names, tmp, title, stem)
        for path in tmp.iterdir():  # renames within one folder: no write, so no full disk, can fail
            os.replace(path, out_dir / path.name)
        return summary
    except OSError as e:
        raise write_error(out_dir, e, OptionError) from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _write_report(results: list[dict], names: list[str], out_dir: Path, title: str, stem: str) -> dict:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = summarize_results(results)
    (out_dir / f"{stem}.json").write_text(
        json.dumps({"summary": summary, "graphs": dict(zip(names, strip_private(results)))}, indent=1)
    )

    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for ax, key in zip(axes, ("influence", "activation", "direct_logit_edge")):
        for r in results:
            s = r["node_to_logit"]["_scatter"]
            ax.loglog(np.maximum(s[key], 1e-12), np.maximum(s["kl"], 1e-12), ".", ms=3, alpha=0.5)
        ax.set_xlabel(key)
        ax.set_ylabel("ablation KL (constrained to the end)")
        ax.set_title(f"{key}: log-log r = {summary['node_to_logit_loglog_pearson'][key]:.2f}")
    fig.tight_layout()
    fig.savefig(out_dir / f"{stem}_node_to_logit.png", dpi=90)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(5, 4))
    for r in results:
        s = r["feature_to_feature"]["_scatter"]
        ax.loglog(np.maximum(s["influence"], 1e-9), np.maximum(s["effect"], 1e-9), ".", ms=2, alpha=0.4)
    ax.set_xlabel("graph influence B[t, s]")
    ax.set_ylabel("|delta a_t| / a_t after ablating s")
    ax.set_title(f"feature to feature: Spearman {summary['feature_to_feature_spearman_mean']:.2f} (mean)")
    fig.tight_layout()
    fig.savefig(out_dir / f"{stem}_feature_to_feature.png", dpi=90)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for kind, v in summary["faithfulness_by_layer_after"].items():
        axes[0].plot(v["cosine"], "o-", label=kind)
        axes[1].semilogy(v["nmse"], "o-", label=kind)
    axes[0].set_ylabel("cosine (replacement vs model)")
    axes[1].set_ylabel("normalized MSE")
    for ax in axes:
        ax.set_xlabel("layers after the perturbed layer")
        ax.legend()
    fig.tight_layout()
    fig.savefig(out_dir / f"{stem}_faithfulness.png", dpi=90)
    plt.close(fig)

    lines = [f"# {title}", "", f"{summary['n_graphs']} graph(s): " + ", ".join(names), ""]
    lines += [
        "## Node to logit (log-log Pearson of ablation KL, mean over windows)",
        "",
        "| predictor | r |",
        "|---|---|",
    ]
    lines += [f"| {k} | {v:.3f} |" for k, v in summary["node_to_logit_loglog_pearson"].items()]
    lines += [
        "",
        "## Feature to feature",
        "",
        f"Spearman(influence, |delta a|/a), constrained [l, l+2]: mean over graphs "
        f"{summary['feature_to_feature_spearman_mean']:.3f}, pooled {summary['feature_to_feature_spearman_pooled']:.3f}",
        "",
    ]
    lines += [
        "## Local replacement faithfulness (per layer after the perturbation)",
        "",
        "| kind | cosine | normalized MSE |",
        "|---|---|---|",
    ]
    for kind, v in summary["faithfulness_by_layer_after"].items():
        lines.append(
            f"| {kind} | {' '.join(f'{c:.3f}' for c in v['cosine'])} | {' '.join(f'{e:.3g}' for e in v['nmse'])} |"
        )
    lines += [
        "",
        f"Plots: {stem}_node_to_logit.png, {stem}_feature_to_feature.png, {stem}_faithfulness.png",
        "",
    ]
    (out_dir / f"{stem}.md").write_text("\n".join(lines))
    return summary

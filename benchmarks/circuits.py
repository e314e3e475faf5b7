"""Faithfulness against circuit size for EAP, PEAP, Edge Pruning and HAP on IOI and greater-than.

Run: `python -m benchmarks.circuits [--model default] [--n 48] [--steps 120] [--threads 1] [--out-dir DIR]`.
Writes (by default into benchmarks/results/) circuits_{task}.json, circuits_{task}.md, circuits_{task}.png and
circuits_summary.md (runtimes). Discovery uses `--n` pairs, evaluation `--n` fresh ones.

Methods:
  eap        non-positional EAP scores, greedy construction (Hanna et al.)
  peap       positional scores (greater-than: per position; IOI: the built-in IOI schema), greedy
  peap-auto  IOI only: positional scores over the automatic saliency-guided schema
  ep         Edge Pruning at target sparsities matching a few edge counts
  hap        EAP keeps 30% of edges, EP (initialised from the scores) decides
EP and HAP run at most `--steps` steps and stop early once their circuit has been stable for
15 steps after the warm-up (the same rule for both).
Times (the `seconds` column) cover discovery only, never evaluation, each method from scratch:
eap its scores; peap and peap-auto the per-example scores they share (counted in both), then the
schema (peap-auto: proposed from the discovery set) and their positional scores; ep and hap the
training loop as `prune_edges` and `hap` report it, hap's including its own EAP pass.
Edge counts of positional circuits count each (edge, position) once; the tables also give,
for every circuit, the number of position-expanded edges (a non-positional edge counts once
per position, plus every cross-position q/k/v edge of a head it feeds).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

from attrgraph.bundled.loading import load_model
from attrgraph.circuits import (
    PruneConfig,
    example_scores,
    greedy,
    ioi_schema,
    propose_schema,
    prune_edges,
    task_data,
)
from attrgraph.circuits.eap import eap
from attrgraph.circuits.evaluate import evaluate
from attrgraph.circuits.hap import hap
from attrgraph.circuits.peap import peap
from attrgraph.circuits.schema import align_schema, salient_token_set

RESULTS = Path(__file__).resolve().parent / "results"
SIZES = (5, 10, 20, 40, 80, 160, 320)
EP_SIZES = (15, 40)
PATIENCE = 15  # EP and HAP stop once their circuit is unchanged for this many steps after warm-up


def expanded_edges(circuit, n_pos: int) -> int:
    """Edges counted per position (module docstring)."""
    if circuit.layout.positional:
        return circuit.n_edges
    g = circuit.layout.graph
    per_head_qkv = n_pos * (n_pos + 1) // 2
    fed = circuit.resid[:, : g.down_logits].any(0)  # head inputs that receive some edge
    n_attn = sum(
        int(fed[g.down_head(layer, s, h)])
        for layer in range(g.n_layers)
        for s in range(3)
        for h in range(g.n_heads)
    )
    return circuit.n_edges * n_pos + n_attn * per_head_qkv


def row(method, circuit, f, seconds, n_pos, steps=None):
    print(
        f"  {method:9s} {circuit.n_edges:5d} edges  F_S {f.soft:.3f}  norm {f.normalized:.3f}  F_H {f.hard:.3f}",
        flush=True,
    )
    return {
        "steps": steps,
        "method": method,
        "edges": circuit.n_edges,
        "edges_expanded": expanded_edges(circuit, n_pos),
        "soft": f.soft,
        "normalized": f.normalized,
        "hard": f.hard,
        "kl": f.kl,
        "metric": f.metric_circuit,
        "seconds": seconds,
    }


def run_task(model, task: str, n: int, steps: int) -> dict:
    train_p, test_p, train, test = task_data(model, task, n, seed=0)
    n_pos = int(train_p.last.max()) + 1
    rows, runtime = [], {}

    t = time.perf_counter()
    s_eap = eap(model, train_p)
    runtime["eap"] = time.perf_counter() - t
    for k in SIZES:
        c = greedy(s_eap, k)
        rows.append(row("eap", c, evaluate(model, test_p, c), runtime["eap"], n_pos))

    t = time.perf_counter()
    ex = example_scores(model, train_p, cross_position=True)
    t_example = time.perf_counter() - t  # shared by peap and peap-auto; counted in both
    t = time.perf_counter()
    schema, schema_test = (ioi_schema(train), ioi_schema(test)) if task == "ioi" else (None, None)
    s_peap = peap(model, train_p, schema=schema, example=ex)
    runtime["peap"] = t_example + time.perf_counter() - t
    for k in SIZES:
        c = greedy(s_peap, k)
        rows.append(row("peap", c, evaluate(model, test_p, c, schema=schema_test), runtime["peap"], n_pos))
    if task == "ioi":
        # the automatic schema is proposed on the discovery set; the evaluation set gets the same
        # rule with the discovery set's salient tokens, aligned onto the circuit's spans
        t = time.perf_counter()
        words = [[model.tokenizer.bos_token, *e.tokens[: e.graded[0]]] for e in train]
        auto = propose_schema(train_p, ex, tokens=words)
        s_auto = peap(model, train_p, schema=auto, example=ex)
        runtime["peap-auto"] = t_example + time.perf_counter() - t
        salient = salient_token_set(train_p, ex, words)
        test_words = [[model.tokenizer.bos_token, *e.tokens[: e.graded[0]]] for e in test]
        auto_test = align_schema(propose_schema(test_p, None, test_words, salient_tokens=salient), auto.spans)
        for k in SIZES:
            c = greedy(s_auto, k)
            rows.append(
                row("peap-auto", c, evaluate(model, test_p, c, schema=auto_test), runtime["peap-auto"], n_pos)
            )
        runtime["peap-auto spans"] = list(auto.spans)

    n_edges = s_eap.layout.n_edges
    for k in EP_SIZES:
        sparsity = 1 - k / n_edges
        cfg = PruneConfig(sparsity=sparsity, steps=steps, batch_size=16, patience=PATIENCE)
        r = prune_edges(model, train_p, cfg)
        rows.append(row("ep", r.circuit, evaluate(model, test_p, r.circuit), r.seconds, n_pos, len(r.kl)))
        r = hap(model, train_p, cfg, keep_frac=0.3)  # its seconds include its own EAP pass
        rows.append(row("hap", r.circuit, evaluate(model, test_p, r.circuit), r.seconds, n_pos, len(r.kl)))
    full = evaluate(model, test_p, greedy(s_eap, n_edges))
    return {
        "task": task,
        "n": n,
        "steps": steps,
        "n_edges": n_edges,
        "n_pos": n_pos,
        "rows": rows,
        "runtime": runtime,
        "model_metric": full.metric_model,
        "corrupt_metric": full.metric_corrupt,
    }


def write_task(result: dict, out: Path = RESULTS) -> None:
    task = result["task"]
    (out / f"circuits_{task}.json").write_text(json.dumps(result, indent=1))
    lines = [
        f"# Circuits on {task} (n={result['n']} discovery + {result['n']} evaluation pairs)",
        "",
        f"Full model M = {result['model_metric']:.4f}, corrupted M = {result['corrupt_metric']:.4f}; "
        f"{result['n_edges']} non-positional edges, prompts of {result['n_pos']} positions.",
        "",
        "| method | edges | edges (position-expanded) | F_S | normalized | F_H | KL | seconds | steps |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        lines.append(
            f"| {r['method']} | {r['edges']} | {r['edges_expanded']} | {r['soft']:.3f} | {r['normalized']:.3f} "
            f"| {r['hard']:.3f} | {r['kl']:.4f} | {r['seconds']:.1f} | {r['steps'] or ''} |"
        )
    (out / f"circuits_{task}.md").write_text("\n".join(lines) + "\n")
    plot_task(result, out)


STYLES = {  # method -> (marker, line style, x offset in decades): coinciding curves stay visible
    "eap": ("o", "-", 0.0),
    "peap": ("s", "-", -0.02),
    "peap-auto": ("^", "--", 0.02),
    "ep": ("D", ":", 0.0),
    "hap": ("v", "-.", 0.0),
}


def plot_task(result: dict, out: Path = RESULTS) -> None:
    """circuits_{task}.png: normalized faithfulness against circuit size, one line per method."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    task = result["task"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, key, label in (
        (axes[0], "edges", "edges in the circuit"),
        (axes[1], "edges_expanded", "edges, position-expanded (non-positional edges x positions)"),
    ):
        for method in dict.fromkeys(r["method"] for r in result["rows"]):
            marker, ls, shift = STYLES.get(method, ("o", "-", 0.0))
            pts = sorted((r[key], r["normalized"]) for r in result["rows"] if r["method"] == method)
            x, y = zip(*pts)
            ax.plot([v * 10**shift for v in x], y, marker=marker, ls=ls, label=method)
        ax.set_xscale("log")
        ax.set_xlabel(label)
        ax.axhline(1.0, color="grey", lw=0.8, label="the full model")
    axes[0].set_ylabel("normalized faithfulness (evaluation pairs)")
    axes[0].set_title(f"{task}: one sample of {result['n']} discovery + {result['n']} evaluation pairs")
    axes[1].set_title("the same, counting non-positional edges per position")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / f"circuits_{task}.png", dpi=120)
    plt.close(fig)


def write_summary(results: list[dict], out: Path = RESULTS) -> None:
    lines = [
        "# Circuit discovery runtimes (seconds, this machine)",
        "",
        f"torch threads {torch.get_num_threads()}, load average at the end "
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())} (other processes share the cores: times vary "
        "from run to run; steps are in the per-task tables).",
        "",
        "| task | EAP | PEAP | PEAP-auto | EP (mean per sparsity) | HAP (mean, incl. EAP) | HAP / EP |",
        "|---|---|---|---|---|---|---|",
    ]
    for res in results:
        ep = [r["seconds"] for r in res["rows"] if r["method"] == "ep"]
        hp = [r["seconds"] for r in res["rows"] if r["method"] == "hap"]
        e, h = sum(ep) / len(ep), sum(hp) / len(hp)
        auto = res["runtime"].get("peap-auto")
        lines.append(
            f"| {res['task']} | {res['runtime']['eap']:.2f} | {res['runtime']['peap']:.2f} | "
            f"{'-' if auto is None else f'{auto:.2f}'} | {e:.1f} | {h:.1f} | {h / e:.2f} |"
        )
    (out / "circuits_summary.md").write_text("\n".join(lines) + "\n")


def main(argv=None) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="default")
    p.add_argument("--n", type=int, default=48, help="discovery pairs, and as many evaluation pairs")
    p.add_argument("--steps", type=int, default=120, help="most EP / HAP training steps")
    p.add_argument("--tasks", default="ioi,greater-than")
    p.add_argument("--threads", type=int, default=1, help="torch threads (1 is fastest for small models)")
    p.add_argument("--out-dir", type=Path, default=RESULTS, help="folder for the results files")
    p.add_argument("--replot", action="store_true", help="only redraw the figures from the stored JSON files")
    args = p.parse_args(argv)
    if args.replot:
        for task in args.tasks.split(","):
            plot_task(json.loads((args.out_dir / f"circuits_{task}.json").read_text()), args.out_dir)
        return 0
    torch.set_num_threads(args.threads)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    model = load_model(args.model)
    results = []
    for task in args.tasks.split(","):
        t = time.perf_counter()
        res = run_task(model, task, args.n, args.steps)
        write_task(res, args.out_dir)
        results.append(res)
        print(f"{task}: done in {time.perf_counter() - t:.0f}s", flush=True)
    write_summary(results, args.out_dir)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Influence and pruning on a graph of about 10^6 edges, against one sparse triangular solve.

Seed: circuit-tracing appendix, "Graph Pruning"; DESIGN.md "Pruning": the logit influence is one
sparse triangular solve, `z = (I - A)^-T w`.

1. The graph: the full (unpruned) graph of the README's IOI prompt on the bundled model and
   `default-plt` (2,465 nodes, 1.16 10^6 edges), built once.
2. Timed, each `--repeats` times in this process (median; the load average is recorded):
   - influence: `streamed_influence.logit_influence(adjacency, w)`, what `prune_graph` computes
     on the full graph (normalization included, from the raw float32 adjacency);
   - whole pruning: `prune_graph(graph)` (that pass, node pruning, the node-pruned graph's pass,
     edge pruning);
   - one triangular solve, scipy's `spsolve_triangular`, on the normalized matrix already built:
     (a) as `prune.compute_influence` calls it (`(-A)^T`, a CSC view, unit diagonal), and
     (b) on `(I - A)^T` prepared in CSC with its unit diagonal stored, `overwrite_A=True`: the
     solve with the least work around it. The smaller of the two is the reference cost.
3. Peak memory of each (tracemalloc: numpy's allocations above what was held before), and the
   check that all three give the same influence.
4. Writes benchmarks/results/influence.{json,md}.

Usage: python benchmarks/influence.py [--repeats 20] [--threads 1]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
PROMPT = "When Mary and John went to the store, John gave a drink to"


def measure(fn, repeats: int) -> tuple[float, float, object]:
    """Median seconds over `repeats` calls, the peak traced bytes of one more call, its result."""
    seconds = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        seconds.append(time.perf_counter() - t)
    tracemalloc.start()
    tracemalloc.reset_peak()
    out = fn()
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return float(np.median(seconds)), peak / 2**20, out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "influence"))
    args = ap.parse_args(argv)
    import scipy.sparse as sp
    import torch
    from scipy.sparse.linalg import spsolve_triangular

    from attrgraph.bundled.loading import load_model
    from attrgraph.engine.attribute import attribute
    from attrgraph.graph.prune import normalize_matrix, prune_graph
    from attrgraph.graph.streamed_influence import logit_influence
    from transcoders import load_transcoders

    torch.set_num_threads(args.threads)
    load = [os.getloadavg()[0]]
    graph = attribute(load_model("default"), load_transcoders("default-plt"), PROMPT)
    A_raw, w = graph.adjacency, graph.logit_weights()
    A = normalize_matrix(A_raw)  # float64, built once for the solves
    neg_T = sp.csc_array((-A.data, A.indices, A.indptr), shape=A.shape[::-1])  # (-A)^T as CSC
    unit_T = (sp.eye_array(A.shape[0], format="csr") - A).T.tocsc()  # (I - A)^T, diagonal stored
    unit_T.sort_indices()

    def solve_as_called():
        return spsolve_triangular(neg_T, w, lower=False, unit_diagonal=True) - w

    def solve_prepared():
        return spsolve_triangular(unit_T, w, lower=False, unit_diagonal=True, overwrite_A=True) - w

    rows = {}
    for name, fn in (
        ("influence", lambda: logit_influence(A_raw, w).influence),
        ("prune_graph", lambda: prune_graph(graph)),
        ("solve_as_called", solve_as_called),
        ("solve_prepared", solve_prepared),
    ):
        seconds, peak_mb, out = measure(fn, args.repeats)
        rows[name] = dict(seconds=seconds, peak_mb=round(peak_mb, 2))
        if name == "influence":
            reference = out
        elif name.startswith("solve"):
            rows[name]["max_rel_diff"] = float(np.abs(out - reference).max() / np.abs(reference).max())
        load.append(os.getloadavg()[0])
        print(name, rows[name], flush=True)
    solve = min(rows["solve_as_called"]["seconds"], rows["solve_prepared"]["seconds"])
    result = dict(
        prompt=PROMPT,
        nodes=graph.n_nodes,
        edges=graph.n_edges,
        repeats=args.repeats,
        threads=args.threads,
        load_1min=[round(x, 2) for x in load],
        rows=rows,
        solve_seconds=solve,
        influence_over_solve=rows["influence"]["seconds"] / solve,
        prune_over_solve=rows["prune_graph"]["seconds"] / solve,
        adjacency_mb=round((A_raw.data.nbytes + A_raw.indices.nbytes + A_raw.indptr.nbytes) / 2**20, 2),
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    labels = {
        "influence": "influence (`logit_influence`, streamed)",
        "prune_graph": "whole pruning (`prune_graph`)",
        "solve_as_called": "`spsolve_triangular`, (-A)^T view (as `compute_influence`)",
        "solve_prepared": "`spsolve_triangular`, (I - A)^T prepared, `overwrite_A`",
    }
    lines = [
        f"# Influence and pruning on a {result['edges']:,}-edge graph",
        "",
        f"The full graph of {PROMPT!r} (bundled default + default-plt, {result['nodes']:,} nodes, "
        f"adjacency {result['adjacency_mb']} MB); median of {args.repeats} runs, {args.threads} torch "
        f"thread(s), one process; peak = numpy allocations (tracemalloc) of one run. 1-minute load "
        f"average during the run: {min(load):.1f}-{max(load):.1f} on {os.cpu_count()} cores.",
        "",
        "| step | time | x one solve | peak extra memory |",
        "|---|---|---|---|",
    ]
    for name, r in rows.items():
        lines.append(
            f"| {labels[name]} | {r['seconds'] * 1e3:.1f} ms | {r['seconds'] / solve:.2f} | {r['peak_mb']:.1f} MB |"
        )
    lines += [
        "",
        f"Influence costs {result['influence_over_solve']:.2f}x one triangular solve and the whole pruning "
        f"{result['prune_over_solve']:.2f}x (the solve: the faster of the two calls). The solves agree "
        f"with the streamed influence to {max(rows[k]['max_rel_diff'] for k in rows if 'max_rel_diff' in rows[k]):.0e} "
        "of its largest value.",
    ]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

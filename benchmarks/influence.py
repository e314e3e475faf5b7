"""Influence and pruning on a graph of about 5 10^5 edges, against one sparse triangular solve.

Seed: circuit-tracing appendix, "Graph Pruning"; DESIGN.md "Pruning": the logit influence is one
sparse triangular solve, `z = (I - A)^-T w`.

1. The graph: the full (unpruned) graph of the README's IOI prompt on the bundled model and
   `default-plt` (1,646 nodes, 5.3 10^5 edges since the sets were retrained in issue 33), built once.
2. Timed `--repeats` times in this process, the calls taking turns (one of each per round, so
   that a change in the machine's load falls on all of them alike); medians; the load average is
   recorded:
   - influence: `streamed_influence.logit_influence(adjacency, w)`, what `prune_graph` computes
     on the full graph (normalization included, from the raw float32 adjacency);
   - whole pruning: `prune_graph(graph)` (that pass, node pruning, the node-pruned graph's pass,
     edge pruning);
   - one triangular solve, scipy's `spsolve_triangular`, on the normalized matrix already built:
     (a) as `prune.compute_influence` calls it (`(-A)^T`, a CSC view, unit diagonal), and
     (b) on `(I - A)^T` prepared in CSC with its unit diagonal stored, `overwrite_A=True`: the
     solve with the least work around it. The smaller of the two is the reference cost.
   Influence and pruning get a fresh CSR object on the same arrays each call (as a graph
   loaded or built anew), so that scipy's cached canonical-format check is paid every time.
3. The profile of `prune_graph`: its stages timed alone in the same rounds (scipy's canonical
   check, `row_blocks`, the streamed pass, `select_nodes`, the node-pruned adjacency, the
   node-pruned `Graph`, `prune_graph_edges` on it).
4. Peak memory of the main rows (tracemalloc: numpy's allocations above what was held before),
   and the check that all three give the same influence.
5. Writes benchmarks/results/influence.{json,md}. `--before JSON`: the json of this script run
   on an earlier tree (copy the script there), shown beside this run's figures.

Usage: python benchmarks/influence.py [--repeats 30] [--threads 1] [--before OLD.json --before-label TEXT]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import tracemalloc
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
PROMPT = "When Mary and John went to the store, John gave a drink to"


def peak_mb(fn, arg) -> tuple[float, object]:
    """Peak traced bytes of one call `fn(arg)` (MB), its result."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    out = fn(arg)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return peak / 2**20, out


def interleaved(calls: dict, repeats: int) -> tuple[dict[str, float], dict[str, float], dict[str, float]]:
    """Seconds of each call, the calls taking turns, `repeats` rounds (after one warm-up): median
    wall clock, median CPU time of this thread (what the call itself used, insensitive to other
    processes taking turns on the cores, not to their sharing of caches and memory bandwidth),
    and the fastest round's wall clock."""
    wall = {name: [] for name in calls}
    cpu = {name: [] for name in calls}
    for r in range(repeats + 1):
        for name, (prepare, fn) in calls.items():
            arg = prepare()
            t, c = time.perf_counter(), time.thread_time()
            fn(arg)
            if r:
                wall[name].append(time.perf_counter() - t)
                cpu[name].append(time.thread_time() - c)
    median = lambda d: {name: float(np.median(v)) for name, v in d.items()}  # noqa: E731
    return median(wall), median(cpu), {name: float(min(v)) for name, v in wall.items()}


def back_to_back(calls: dict, repeats: int) -> dict[str, float]:
    """Median seconds of each call repeated `repeats` times in a row (warm caches; how the
    earlier version of this script measured)."""
    out = {}
    for name, (prepare, fn) in calls.items():
        args = [prepare() for _ in range(repeats)]
        seconds = []
        for arg in args:
            t = time.perf_counter()
            fn(arg)
            seconds.append(time.perf_counter() - t)
        out[name] = float(np.median(seconds))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "influence"))
    ap.add_argument("--before", help="json of this script run on an earlier tree, shown beside")
    ap.add_argument("--before-label", default="before", help="what --before measured (e.g. a commit)")
    args = ap.parse_args(argv)
    import scipy.sparse as sp
    import torch
    from scipy.sparse.linalg import spsolve_triangular

    from attrgraph.bundled.loading import load_model
    from attrgraph.engine.attribute import attribute
    from attrgraph.graph.prune import normalize_matrix, prune_graph, prune_graph_edges, select_nodes
    from attrgraph.graph.streamed_influence import logit_influence, row_blocks, streamed_influence
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

    fresh_A = lambda: sp.csr_array(A_raw)  # noqa: E731  same arrays, no cached format flags
    fresh_graph = lambda: replace(graph, adjacency=fresh_A())  # noqa: E731
    blocks = row_blocks(A_raw)
    influence = logit_influence(A_raw, w).influence
    keep = select_nodes(graph.nodes.kind, influence, 0.8)
    idx = np.flatnonzero(keep)
    node_pruned = graph.subgraph(keep)
    none = lambda: None  # noqa: E731
    main_calls = {
        "influence": (fresh_A, lambda a: logit_influence(a, w).influence),
        "prune_graph": (fresh_graph, prune_graph),
        "solve_as_called": (none, lambda _: solve_as_called()),
        "solve_prepared": (none, lambda _: solve_prepared()),
    }
    stage_calls = {
        "canonical": (fresh_A, lambda a: a.has_canonical_format),
        "row_blocks": (none, lambda _: row_blocks(A_raw)),
        "streamed": (none, lambda _: streamed_influence(A_raw, w, blocks)),
        "select_nodes": (none, lambda _: select_nodes(graph.nodes.kind, influence, 0.8)),
        "slice": (none, lambda _: A_raw[idx][:, idx]),
        "subgraph": (none, lambda _: graph.subgraph(keep)),
        "edge_step": (none, lambda _: prune_graph_edges(node_pruned, 0.98, node_threshold=0.8)),
    }
    times, cpu_times, fastest = interleaved({**main_calls, **stage_calls}, args.repeats)
    load.append(os.getloadavg()[0])
    warm = back_to_back(main_calls, args.repeats)
    load.append(os.getloadavg()[0])
    rows = {}
    for name, (prepare, fn) in main_calls.items():
        mb, out = peak_mb(fn, prepare())
        rows[name] = dict(
            seconds=times[name],
            cpu_seconds=cpu_times[name],
            fastest_seconds=fastest[name],
            peak_mb=round(mb, 2),
        )
        if name == "influence":
            reference = out
        elif name.startswith("solve"):
            rows[name]["max_rel_diff"] = float(np.abs(out - reference).max() / np.abs(reference).max())
        print(name, rows[name], flush=True)
    load.append(os.getloadavg()[0])
    solve = min(rows["solve_as_called"]["seconds"], rows["solve_prepared"]["seconds"])
    stages = {name: dict(seconds=times[name], over_solve=times[name] / solve) for name in stage_calls}
    cpu_solve = min(rows["solve_as_called"]["cpu_seconds"], rows["solve_prepared"]["cpu_seconds"])
    result = dict(
        prompt=PROMPT,
        nodes=graph.n_nodes,
        edges=graph.n_edges,
        node_pruned=dict(nodes=node_pruned.n_nodes, edges=node_pruned.n_edges),
        repeats=args.repeats,
        threads=args.threads,
        load_1min=[round(x, 2) for x in load],
        rows=rows,
        stages=stages,
        solve_seconds=solve,
        influence_over_solve=rows["influence"]["seconds"] / solve,
        prune_over_solve=rows["prune_graph"]["seconds"] / solve,
        fastest=dict(
            influence_over_solve=fastest["influence"]
            / min(fastest["solve_as_called"], fastest["solve_prepared"]),
            prune_over_solve=fastest["prune_graph"]
            / min(fastest["solve_as_called"], fastest["solve_prepared"]),
        ),
        cpu=dict(
            solve_seconds=cpu_solve,
            influence_over_solve=rows["influence"]["cpu_seconds"] / cpu_solve,
            prune_over_solve=rows["prune_graph"]["cpu_seconds"] / cpu_solve,
        ),
        back_to_back=dict(
            seconds=warm,
            influence_over_solve=warm["influence"] / min(warm["solve_as_called"], warm["solve_prepared"]),
            prune_over_solve=warm["prune_graph"] / min(warm["solve_as_called"], warm["solve_prepared"]),
        ),
        adjacency_mb=round((A_raw.data.nbytes + A_raw.indices.nbytes + A_raw.indptr.nbytes) / 2**20, 2),
    )
    before = json.loads(Path(args.before).read_text()) if args.before else None
    if before is not None:
        result["before"] = dict(label=args.before_label, **before)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    out.with_suffix(".md").write_text(markdown(result, args) + "\n")
    print(markdown(result, args))
    return 0


LABELS = {
    "influence": "influence (`logit_influence`, streamed)",
    "prune_graph": "whole pruning (`prune_graph`)",
    "solve_as_called": "`spsolve_triangular`, (-A)^T view (as `compute_influence`)",
    "solve_prepared": "`spsolve_triangular`, (I - A)^T prepared, `overwrite_A`",
}
STAGES = {
    "canonical": "scipy's canonical-format check (`has_canonical_format`, sorted and no duplicates)",
    "row_blocks": "`row_blocks` (block split of the rows)",
    "streamed": "streamed pass on the full graph (`streamed_influence`)",
    "select_nodes": "`select_nodes` (node threshold)",
    "slice": "node-pruned adjacency (`adjacency[idx][:, idx]`)",
    "subgraph": "node-pruned `Graph` (`graph.subgraph`: slice, nodes, validate)",
    "edge_step": "`prune_graph_edges` on the node-pruned graph (its pass, edge threshold, final graph)",
}


def markdown(result: dict, args) -> str:
    rows, solve, before = result["rows"], result["solve_seconds"], result.get("before")
    load = result["load_1min"]
    np_ = result["node_pruned"]
    lines = [
        f"# Influence and pruning on a {result['edges']:,}-edge graph",
        "",
        f"The full graph of {PROMPT!r} (bundled default + default-plt, {result['nodes']:,} nodes, "
        f"adjacency {result['adjacency_mb']} MB); median of {result['repeats']} rounds in one process, "
        f"the calls taking turns within a round, {result['threads']} torch thread(s); peak = numpy "
        f"allocations (tracemalloc) of one call. 1-minute load average during the run: "
        f"{min(load):.1f}-{max(load):.1f} on {os.cpu_count()} cores (shared with other jobs).",
        "",
        "| step | time | x one solve | CPU time | x one solve | fastest round | x one solve | peak extra memory |",
        "|---|---|---|---|---|---|---|---|",
    ]
    cpu_solve = result["cpu"]["solve_seconds"]
    fast_solve = min(rows["solve_as_called"]["fastest_seconds"], rows["solve_prepared"]["fastest_seconds"])
    for name, r in rows.items():
        lines.append(
            f"| {LABELS[name]} | {r['seconds'] * 1e3:.1f} ms | {r['seconds'] / solve:.2f} | "
            f"{r['cpu_seconds'] * 1e3:.1f} ms | {r['cpu_seconds'] / cpu_solve:.2f} | "
            f"{r['fastest_seconds'] * 1e3:.1f} ms | {r['fastest_seconds'] / fast_solve:.2f} | {r['peak_mb']:.1f} MB |"
        )
    lines += [
        "",
        f"Influence costs {result['influence_over_solve']:.2f}x one triangular solve and the whole pruning "
        f"{result['prune_over_solve']:.2f}x (the solve: the faster of the two calls); in CPU time of the "
        f"calling thread {result['cpu']['influence_over_solve']:.2f}x and {result['cpu']['prune_over_solve']:.2f}x; "
        f"in the fastest round of each {result['fastest']['influence_over_solve']:.2f}x and "
        f"{result['fastest']['prune_over_solve']:.2f}x"
        + (
            f" ({before['label']}, same script, another process: wall {before['influence_over_solve']:.2f}x and "
            f"{before['prune_over_solve']:.2f}x, CPU {before['cpu']['influence_over_solve']:.2f}x and "
            f"{before['cpu']['prune_over_solve']:.2f}x, fastest {before['fastest']['influence_over_solve']:.2f}x "
            f"and {before['fastest']['prune_over_solve']:.2f}x)"
            if before
            else ""
        )
        + ". The solves agree "
        f"with the streamed influence to {max(r['max_rel_diff'] for r in rows.values() if 'max_rel_diff' in r):.0e} "
        "of its largest value.",
        "",
        f"Each call instead repeated {result['repeats']} times back to back (warm caches, how the earlier "
        f"version of this script measured), in the same process: influence "
        f"{result['back_to_back']['influence_over_solve']:.2f}x, whole pruning "
        f"{result['back_to_back']['prune_over_solve']:.2f}x one solve"
        + (
            f" ({before['label']}: {before['back_to_back']['influence_over_solve']:.2f}x and "
            f"{before['back_to_back']['prune_over_solve']:.2f}x)."
            if before
            else "."
        ),
        "",
        "## Profile of `prune_graph`",
        "",
        f"Its stages timed alone in the same rounds (node threshold 0.8 keeps {np_['nodes']} nodes and "
        f"{np_['edges']:,} edges). Today's `prune_graph` runs the canonical check, `row_blocks`, the "
        "streamed pass, `select_nodes`, the slice and the edge step; it builds no node-pruned `Graph`.",
        "",
    ]
    if before is None:
        lines += ["| stage | time | x one solve |", "|---|---|---|"]
        for name, label in STAGES.items():
            st = result["stages"][name]
            lines.append(f"| {label} | {st['seconds'] * 1e3:.2f} ms | {st['over_solve']:.2f} |")
        return "\n".join(lines)
    b_solve = before["solve_seconds"]
    lines += [
        f"Beside it, the same script on {before['label']} (another process, load "
        f"{min(before['load_1min']):.1f}-{max(before['load_1min']):.1f}: compare the x-one-solve "
        "columns, each against the solve of its own run; that version's `prune_graph` also built "
        "the node-pruned `Graph`).",
        "",
        f"| stage | {before['label']} | x one solve | now | x one solve |",
        "|---|---|---|---|---|",
    ]
    for name, label in STAGES.items():
        st, bt = result["stages"][name], before.get("stages", {}).get(name)
        old = f"{bt['seconds'] * 1e3:.2f} ms | {bt['over_solve']:.2f}" if bt else "- | -"
        lines.append(f"| {label} | {old} | {st['seconds'] * 1e3:.2f} ms | {st['over_solve']:.2f} |")
    for name in ("influence", "prune_graph"):
        bt = before["rows"][name]["seconds"]
        lines.append(
            f"| **{LABELS[name]}** | {bt * 1e3:.2f} ms | {bt / b_solve:.2f} | "
            f"{rows[name]['seconds'] * 1e3:.2f} ms | {rows[name]['seconds'] / solve:.2f} |"
        )
    lines.append(
        f"| one triangular solve (reference) | {b_solve * 1e3:.2f} ms | 1.00 | {solve * 1e3:.2f} ms | 1.00 |"
    )
    fixed = lambda r: r["rows"]["prune_graph"]["cpu_seconds"] - r["rows"]["influence"]["cpu_seconds"]  # noqa: E731
    lines += [
        "",
        f"What pruning adds to the influence pass (CPU time, `prune_graph` minus `logit_influence`): "
        f"{fixed(before) * 1e3:.2f} ms ({fixed(before) / before['cpu']['solve_seconds']:.2f}x one solve) on "
        f"{before['label']}, {fixed(result) * 1e3:.2f} ms ({fixed(result) / result['cpu']['solve_seconds']:.2f}x) now: "
        "the block split (a Python step per row before, a vectorized search in windows now), the "
        "node-pruned `Graph` (no longer built: its nodes, weights and sliced adjacency go straight to "
        "the edge step), and the edge step on about a hundred nodes, fixed costs of numpy and scipy "
        "calls (its influence pass, the feature-removal loop, by bincount now instead of slicing the "
        "matrix each round, and the final `Graph`). The streamed pass reads the caller's CSR object "
        "(scipy caches its format check there: once per graph, though here each call gets a fresh "
        "object and pays it), takes each row's largest column from its sorted indices, casts then "
        "takes |.| in place, builds each chunk's CSC directly and sets up no progress bar unless "
        "shown; each chunk's arithmetic is unchanged, so every figure is bit for bit the same.",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())

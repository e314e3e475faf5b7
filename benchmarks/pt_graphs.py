"""circuit-tracer's `.pt` graphs: time and peak memory of reading one, ours (`load_pt`) against
circuit-tracer's own `Graph.from_pt`, and the size of the file against our HDF5 graph file.

A random graph of circuit-tracer's layout (`--layers` x `--positions`, `--features` active
features, 10 logits, a share `--density` of the lower triangle nonzero, as its dense graphs are) is
written once with `save_pt`; then, in fresh processes, each side reads it (circuit-tracer in the
peer venv, `--peer-python`; skipped where absent) and reports its wall time (imports not counted:
circuit-tracer's loads transformer-lens and more) and its peak resident
set (VmHWM) over a process that read a tiny graph the same way (imports, torch). circuit-tracer's
`from_pt` loads the whole dense matrix; `load_pt` compares every record with its CRC-32, maps the
file and converts a block of rows at a time into CSR, so its peak is about the sparse graph plus one
block.

    python benchmarks/pt_graphs.py [--features 12000 --density 0.3] [--peer-python /tmp/peer/venv/bin/python]

Writes benchmarks/results/pt_graphs.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"
CT_READ = r"""
import json, sys, time
from circuit_tracer.graph import Graph
t = time.perf_counter()
g = Graph.from_pt(sys.argv[1])
n = int((g.adjacency_matrix != 0).sum())
seconds = time.perf_counter() - t
peak = [int(l.split()[1]) / 1024 for l in open("/proc/self/status") if l.startswith("VmHWM:")][0]
print(json.dumps({"seconds": seconds, "peak_mb": peak, "nonzeros": n}))
"""


def peak_rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no /proc/self/status")


def worker(path: str) -> None:
    import warnings

    import torch  # noqa: F401 (imported before the clock starts, as circuit-tracer's side has it)

    from attrgraph.graph.circuit_tracer_pt import load_pt

    t = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no tokenizer: tokens as [id]
        g = load_pt(path)
    print(json.dumps({"seconds": time.perf_counter() - t, "peak_mb": peak_rss_mb(), "nonzeros": g.n_edges}))


def random_graph(n_layers: int, n_pos: int, n_feat: int, density: float, seed: int = 0):
    """A graph in attrgraph's order whose adjacency has `density` of its lower triangle nonzero."""
    import numpy as np
    import scipy.sparse as sp

    from attrgraph.graph.graph import Graph, Nodes

    rng = np.random.default_rng(seed)
    keys = np.stack(
        [rng.integers(0, n_layers, n_feat), rng.integers(1, n_pos, n_feat), rng.integers(0, 16384, n_feat)], 1
    )
    keys = np.unique(keys, axis=0)
    n_feat, n_logits = len(keys), 10
    n_err = n_layers * n_pos
    kind = ["embedding"] * n_pos + ["error"] * n_err + ["feature"] * n_feat + ["logit"] * n_logits
    layer = np.concatenate(
        [np.full(n_pos, -1), np.repeat(np.arange(n_layers), n_pos), keys[:, 0], np.full(n_logits, n_layers)]
    )
    position = np.concatenate(
        [np.arange(n_pos), np.tile(np.arange(n_pos), n_layers), keys[:, 1], np.full(n_logits, n_pos - 1)]
    )
    feature = np.concatenate([np.full(n_pos + n_err, -1), keys[:, 2], np.full(n_logits, -1)])
    n = len(kind)
    rows, cols = [], []
    for start in range(n_pos + n_err, n, 2048):  # features and logits have inputs; a block at a time
        t = np.arange(start, min(n, start + 2048))
        counts = rng.binomial(t, density)
        rows.append(np.repeat(t, counts))
        cols.append(np.concatenate([rng.choice(i, c, replace=False) if c else [] for i, c in zip(t, counts)]))
    rows, cols = np.concatenate(rows), np.concatenate(cols).astype(np.int64)
    A = sp.csr_array((rng.standard_normal(len(rows)).astype(np.float32), (rows, cols)), shape=(n, n))
    nodes = Nodes(
        kind=np.array(kind), layer=layer, position=position, feature=feature,
        activation=np.ones(n, np.float32), token=np.concatenate([rng.integers(0, 1000, n_pos), np.full(n_err + n_feat, -1), np.arange(n_logits)]),
    )  # fmt: skip
    probs = np.sort(rng.random(n_logits))[::-1] / n_logits
    return Graph(
        nodes=nodes, adjacency=A, prompt_ids=nodes.token[:n_pos], prompt_tokens=[f"t{i}" for i in range(n_pos)],
        logit_tokens=np.arange(n_logits), logit_probs=probs, meta={"n_layers": n_layers, "embedding": "token"},
    )  # fmt: skip


def measure(cmd: list[str]) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--positions", type=int, default=32)
    ap.add_argument("--features", type=int, default=12000)
    ap.add_argument("--density", type=float, default=0.3)
    ap.add_argument("--peer-python", default="/tmp/peer/venv/bin/python")
    ap.add_argument("--_worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._worker:
        return worker(args._worker)
    from transformer_lens import HookedTransformerConfig

    from attrgraph.graph.circuit_tracer_pt import save_pt
    from attrgraph.graph.store import save_graph

    cfg = HookedTransformerConfig(
        n_layers=args.layers, d_model=64, n_ctx=args.positions, d_head=16, d_vocab=1000, act_fn="relu"
    )
    peer = args.peer_python if os.access(args.peer_python, os.X_OK) else None
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for label, n_feat in (("tiny", 10), ("graph", args.features)):
            g = random_graph(args.layers, args.positions, n_feat, args.density if label == "graph" else 0.01)
            pt, h5 = Path(tmp) / f"{label}.pt", Path(tmp) / f"{label}.h5"
            t = time.perf_counter()
            save_pt(g, pt, cfg)
            write_s = time.perf_counter() - t
            save_graph(g, h5, "g")
            row = {"nodes": g.n_nodes, "edges": g.n_edges, "pt_mb": pt.stat().st_size / 2**20,
                   "h5_mb": h5.stat().st_size / 2**20, "save_pt_seconds": write_s}  # fmt: skip
            row["ours"] = measure([sys.executable, __file__, "--_worker", str(pt)])
            if peer:
                row["circuit_tracer"] = measure([peer, "-c", CT_READ, str(pt)])
            rows[label] = row
    out = rows["graph"]
    for side in ("ours", "circuit_tracer"):
        if side in out:
            out[side]["extra_peak_mb"] = out[side]["peak_mb"] - rows["tiny"][side]["peak_mb"]
            assert out[side]["nonzeros"] == out["edges"], (side, out[side]["nonzeros"], out["edges"])
    shape = {k: getattr(args, k) for k in ("layers", "positions", "features", "density")}
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "pt_graphs.json").write_text(json.dumps({"shape": shape, "result": out}, indent=1))
    lines = [
        f"# Reading a circuit-tracer .pt graph ({out['nodes']:,} nodes, {out['edges']:,} edges; "
        f"{args.layers} layers x {args.positions} positions, density {args.density})",
        "",
        f"`.pt` file {out['pt_mb']:.0f} MB (dense, as circuit-tracer writes it); the same graph in our HDF5 file "
        f"{out['h5_mb']:.0f} MB; `save_pt` {out['save_pt_seconds']:.1f} s.",
        "",
        "| reader | wall (s) | peak RSS over baseline (MB) |",
        "|---|---|---|",
    ]
    names = {"circuit_tracer": "circuit-tracer `Graph.from_pt`", "ours": "attrgraph `load_pt` (to CSR)"}
    for side in ("circuit_tracer", "ours"):
        if side in out:
            lines.append(f"| {names[side]} | {out[side]['seconds']:.2f} | {out[side]['extra_peak_mb']:.0f} |")
    (RESULTS / "pt_graphs.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()

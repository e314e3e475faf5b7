"""How close a graph of the bundled model in each dtype comes to the float64 graph (engine/precision.py).

1. Reference: the bundled model and transcoder set cast to float64; for each of `--n` IOI prompts
   (attrgraph.bundled.tasks, seed 0) its full graph (`attribute`, linear backend) with logit targets
   fixed to the reference's top tokens, so that every dtype has the same targets.
2. For each model dtype (float64, float32, bfloat16, float16) and backend (linear: computes in
   float32 at least; autograd: differentiates through the model in its own dtype), the model and
   set are cast to that dtype (from float32, where they were trained) and attributed the same way.
3. Against the reference, on the nodes both graphs have ((kind, layer, position, feature)):
   `feature_jaccard`, the active-feature sets' overlap (a feature near 0 may switch on or off);
   `edge_max_rel`, max |A - A64| / max |A64|; `edge_fro_rel`, ||A - A64||_F / ||A64||_F;
   `logit_rows_max_rel`, the same max over the logit nodes' rows (what pruning weights).
4. `compute_max_rel` (linear only): the rows of the same recorded state computed in float32 (what
   the linear backend does for every model of float32 or less) against the same rows computed in
   float64: the backward's own precision, apart from the model's (the rest of step 3's error is
   the half-precision forward and weights).
5. Maxima over prompts; write benchmarks/results/dtypes.{json,md} with the machine's load.

Usage: python benchmarks/dtypes.py [--n 4] [--transcoders default-plt]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

DTYPES = ("float64", "float32", "bfloat16", "float16")
BACKENDS = ("linear", "autograd")


def node_keys(graph) -> list[tuple]:
    n = graph.nodes
    return list(
        zip(n.kind.tolist(), n.layer.tolist(), n.position.tolist(), n.feature.tolist(), n.token.tolist())
    )


def compare(graph, ref) -> dict:
    """Step 3: errors on the common nodes."""
    keys, ref_keys = node_keys(graph), node_keys(ref)
    where = {k: i for i, k in enumerate(keys)}
    common = [k for k in ref_keys if k in where]
    ref_where = {k: r for r, k in enumerate(ref_keys)}
    i = np.array([where[k] for k in common])
    j = np.array([ref_where[k] for k in common])
    A = graph.adjacency.tocsr()[i][:, i].toarray().astype(np.float64)
    B = ref.adjacency.tocsr()[j][:, j].toarray().astype(np.float64)
    feats = {k for k in keys if k[0] == "feature"}
    ref_feats = {k for k in ref_keys if k[0] == "feature"}
    logit = np.array([k[0] == "logit" for k in common])
    scale = np.abs(B).max()
    return dict(
        feature_jaccard=len(feats & ref_feats) / max(1, len(feats | ref_feats)),
        edge_max_rel=float(np.abs(A - B).max() / scale),
        edge_fro_rel=float(np.linalg.norm(A - B) / np.linalg.norm(B)),
        logit_rows_max_rel=float(np.abs(A[logit] - B[logit]).max() / np.abs(B[logit]).max()),
    )


def compute_error(model, tc, tokens) -> float:
    """Step 4: float32 rows against float64 rows of one recorded state (logit and feature targets)."""
    from attrgraph.engine.linear_backward import linear_rows
    from attrgraph.engine.replacement import ReplacementModel
    from attrgraph.engine.sources import Injection, build_sources, feature_injections
    from attrgraph.engine.targets import select_logit_targets

    rm = ReplacementModel(model, tc)
    state = rm.run(tokens, exclude_bos=True)
    rows = {}
    for dt in (torch.float32, torch.float64):
        s = state._replace(
            **{
                k: v.to(dt)
                for k, v in state._asdict().items()
                if torch.is_tensor(v) and v.is_floating_point()
            },
            frozen={k: v.to(dt) for k, v in state.frozen.items()},
        )
        sources = build_sources(rm, s)
        targets = select_logit_targets(s.logits[-1], 10, 0.95)
        inj = feature_injections(rm, sources.features) + [
            Injection(t.vector, len(tokens) - 1, logits=True) for t in targets
        ]
        rows[dt] = linear_rows(rm, s, sources, inj).toarray().astype(np.float64)
    a, b = rows[torch.float32], rows[torch.float64]
    return float(np.abs(a - b).max() / np.abs(b).max())


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=4, help="number of IOI prompts")
    ap.add_argument("--transcoders", default="default-plt")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "dtypes"))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from attrgraph.bundled.loading import load_model
    from attrgraph.bundled.tasks import ioi_pairs
    from attrgraph.engine.attribute import attribute
    from attrgraph.engine.sources import to_tokens
    from attrgraph.engine.targets import logit_target
    from transcoders import load_transcoders

    load0 = os.getloadavg()
    t0 = time.perf_counter()
    base, base_tc = load_model("default"), load_transcoders(args.transcoders)
    models = {}
    for name in DTYPES:
        dt = getattr(torch, name)
        models[name] = (copy.deepcopy(base).to(dt), copy.deepcopy(base_tc).to(dt))
    m64, tc64 = models["float64"]
    prompts = [ex.prompt for ex in ioi_pairs(args.n, seed=0)]
    rows: dict[tuple[str, str], list[dict]] = {}
    compute = {name: [] for name in DTYPES if name != "float64"}
    n_features = []
    for prompt in prompts:
        ref = attribute(m64, tc64, prompt, backend="linear")
        n_features.append(ref.n_features)
        for name in DTYPES:
            model, tc = models[name]
            targets = [logit_target(model, int(t)) for t in ref.logit_tokens]
            for backend in BACKENDS:
                g = attribute(model, tc, prompt, targets=targets, backend=backend)
                rows.setdefault((name, backend), []).append(compare(g, ref))
            if name != "float64":
                compute[name].append(compute_error(model, tc, to_tokens(model, prompt)))
    table = []
    for (name, backend), rs in rows.items():
        worst = {k: (min if k == "feature_jaccard" else max)(r[k] for r in rs) for k in rs[0]}
        if backend == "linear" and name in compute:
            worst["compute_max_rel"] = max(compute[name])
        table.append(dict(dtype=name, backend=backend, **worst))
    result = dict(
        transcoders=args.transcoders,
        n_prompts=len(prompts),
        mean_features=float(np.mean(n_features)),
        rows=table,
        seconds=round(time.perf_counter() - t0, 1),
        threads=args.threads,
        loadavg_start=load0,
        loadavg_end=os.getloadavg(),
        machine=f"{platform.machine()}, {os.cpu_count()} cores, CPU only",
        torch=torch.__version__,
        command=f"python benchmarks/dtypes.py --n {args.n} --transcoders {args.transcoders}",
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=1) + "\n")
    lines = [
        f"# Graphs of the bundled model by dtype against float64 ({len(prompts)} IOI prompts, default + "
        f"{args.transcoders}, mean {result['mean_features']:.0f} active features)",
        "",
        "Model and set cast from float32 to each dtype; logit targets fixed to the float64 graph's; "
        "errors on the nodes both graphs have, maxima over prompts (jaccard: minimum). compute: the "
        "float32 backward against a float64 backward of the same recorded state.",
        "",
        "| model dtype | backend | feature jaccard | edge max rel | edge fro rel | logit rows max rel | compute max rel |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in table:
        c = f"{r['compute_max_rel']:.1e}" if "compute_max_rel" in r else "-"
        lines.append(
            f"| {r['dtype']} | {r['backend']} | {r['feature_jaccard']:.3f} | {r['edge_max_rel']:.1e} | "
            f"{r['edge_fro_rel']:.1e} | {r['logit_rows_max_rel']:.1e} | {c} |"
        )
    lines += [
        "",
        f"`{result['command']}`, {result['seconds']} s, load {load0[0]:.1f} at start; {result['machine']}.",
    ]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

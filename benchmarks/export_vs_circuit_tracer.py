"""The exported graph against circuit-tracer's own `create_graph_files`, on identical weights.

1. For each case (a gpt2-like model with per-layer transcoders, a gemma2-like one with a
   cross-layer transcoder, a llama-like one with per-layer transcoders and skip connections), run
   the peer harness (`ct_graph.py --out DIR` in `../shared/peer/`) with the Python of its own venv
   (`--peer-python`; `../shared/peer/install_env.sh VENV` creates it): a seeded random model and
   transcoders, circuit-tracer's graph (`DIR/graph.pt`).
2. For each (node, edge) threshold pair, circuit-tracer's `create_graph_files(graph.pt, ...)` in
   the peer venv writes its JSON (its `prune_graph`).
3. Ours, in this process on the same files (`attrgraph.load_model(DIR)`, `load_transcoders`,
   circuit-tracer's conventions: BOS excluded, token-only embeddings), by both paths a user takes:
     unpruned   `attribute` -> `export_json(node_threshold=, edge_threshold=)` (default rule);
     stored     `attribute_pruned(thresholds)` (what `attrgraph build` does without --full) ->
                `save_graph` -> `load_graph` -> `export_json()` with no options.
4. Compare with circuit-tracer's file: node Jaccard (nodes keyed by type, layer, position and
   feature: circuit-tracer 0.5.0 names errors `0_{layer}_{pos}`, we `{layer}_-1_{pos}`), link
   Jaccard (source and target keys), the largest |weight| and |influence| differences over what
   both have (influence: the cumulative share, absolute), activations, and the slider
   (`metadata.node_threshold`).
5. Print a table and write `benchmarks/results/export_vs_circuit_tracer.{md,json}`.

Usage: python benchmarks/export_vs_circuit_tracer.py --peer-python VENV/bin/python [--peer-harness DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from peer_compare import SMALL  # benchmarks/, on the path when run as a script

ROOT = Path(__file__).resolve().parent.parent
PEER_HARNESS = ROOT.parent / "shared" / "peer"
SHAPE = SMALL  # the peer benchmark's small shape
CASES = [  # (label, harness arguments)
    ("gpt2 PLT", ["--arch", "gpt2", "--transcoder", "plt", "--seed", "1"]),
    ("gemma2 CLT", ["--arch", "gemma2", "--transcoder", "clt", "--seed", "2"]),
    ("llama PLT+skip", ["--arch", "llama", "--transcoder", "plt", "--skip", "--seed", "3"]),
]
THRESHOLDS = [(0.8, 0.98), (0.6, 0.9), (0.9, 0.99)]

CT_EXPORT = r"""
import json, sys
from circuit_tracer.graph import Graph
from circuit_tracer.utils.create_graph_files import create_graph_files

d, out, pairs = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
for nt, et in pairs:
    graph = Graph.from_pt(f"{d}/graph.pt")
    graph.cfg.tokenizer_name = f"{d}/tokenizer"
    create_graph_files(graph, f"ct_{nt}_{et}", out, scan="peer", node_threshold=nt, edge_threshold=et)
print(json.dumps({"ok": True}))
"""


def peer(python: str, *args: str) -> str:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", OMP_NUM_THREADS="1")
    res = subprocess.run([python, *args], capture_output=True, text=True, env=env)
    if res.returncode:
        sys.exit(f"circuit-tracer failed: {' '.join(args[:2])}\n{res.stderr[-3000:]}")
    return res.stdout


def key(node: dict) -> tuple:
    """A node's identity in both files (step 4)."""
    if "error" in node["feature_type"]:
        return ("error", node["layer"], node["ctx_idx"])
    return (node["feature_type"], node["layer"], node["ctx_idx"], node["feature"])


def compare(ours: dict, theirs: dict) -> dict:
    """Step 4 on two graph JSONs."""
    mine, ct = ({key(n): n for n in d["nodes"]} for d in (ours, theirs))
    ids = [{n["node_id"]: key(n) for n in d["nodes"]} for d in (ours, theirs)]
    dup = len(theirs["nodes"]) - len({n["node_id"] for n in theirs["nodes"]})
    links = [
        {(i[x["source"]], i[x["target"]]): x["weight"] for x in d["links"]}
        for i, d in zip(ids, (ours, theirs))
    ]
    both_nodes = set(mine) & set(ct)
    both_links = set(links[0]) & set(links[1])
    jacc = lambda a, b: len(a & b) / max(len(a | b), 1)  # noqa: E731
    infl = [
        abs(mine[k]["influence"] - ct[k]["influence"]) for k in both_nodes if ct[k]["influence"] is not None
    ]
    act = [
        abs(mine[k]["activation"] - ct[k]["activation"])
        for k in both_nodes
        if ct[k]["activation"] is not None and mine[k]["activation"] is not None
    ]
    w = [abs(links[0][e] - links[1][e]) for e in both_links]
    wrel = [abs(links[0][e] - links[1][e]) / abs(links[1][e]) for e in both_links if links[1][e]]
    return dict(
        nodes=(len(mine), len(ct)),
        links=(len(links[0]), len(links[1])),
        node_jaccard=jacc(set(mine), set(ct)),
        link_jaccard=jacc(set(links[0]), set(links[1])),
        max_weight_diff=max(w, default=0.0),
        max_weight_rel_diff=max(wrel, default=0.0),
        max_influence_diff=max(infl, default=0.0),
        max_activation_diff=max(act, default=0.0),
        slider=(ours["metadata"]["node_threshold"], theirs["metadata"]["node_threshold"]),
        rule=ours["metadata"].get("pruning_settings", {}).get("prune_rule"),
        ct_duplicate_ids=dup,
    )


def ours(d: Path, out: Path, pairs) -> dict:
    """Step 3: both paths for every threshold pair; {(nt, et): {path: graph JSON}}."""
    import torch

    torch.set_num_threads(1)
    from attrgraph.bundled.loading import load_model
    from attrgraph.engine.attribute import attribute
    from attrgraph.engine.pruned_build import attribute_pruned
    from attrgraph.graph.neuronpedia import export_json
    from attrgraph.graph.store import load_graph, save_graph
    from transcoders.formats import load_transcoders

    model = load_model(d)
    tc = load_transcoders(d / "transcoders")
    tokens = np.load(d / "input_tokens.npy")
    opts = dict(exclude_bos=True, embedding="token", batch_size=64)
    full = attribute(model, tc, tokens, progress=False, **opts)
    result = {}
    for nt, et in pairs:
        a = export_json(full, out / "unpruned", slug=f"u_{nt}_{et}", node_threshold=nt, edge_threshold=et)
        pruned = attribute_pruned(model, tc, tokens, nt, et, **opts)
        save_graph(pruned, out / "built.h5", f"g_{nt}_{et}")
        b = export_json(load_graph(out / "built.h5", f"g_{nt}_{et}"), out / "stored", slug=f"s_{nt}_{et}")
        result[(nt, et)] = {p: json.loads(r.path.read_text()) for p, r in (("unpruned", a), ("stored", b))}
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--peer-python", required=True, help="the peer venv's bin/python (has circuit-tracer)")
    ap.add_argument("--peer-harness", type=Path, default=PEER_HARNESS, help="folder of ct_graph.py")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "export_vs_circuit_tracer")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, harness_args in CASES:
            d = Path(tmp) / label.replace(" ", "_").replace("+", "_")
            peer(
                args.peer_python,
                str(args.peer_harness / "ct_graph.py"),
                *SHAPE,
                *harness_args,
                "--out",
                str(d),
            )
            peer(args.peer_python, "-c", CT_EXPORT, str(d), str(d / "ct"), json.dumps(THRESHOLDS))
            mine = ours(d, d / "ours", THRESHOLDS)
            for nt, et in THRESHOLDS:
                theirs = json.loads((d / "ct" / f"ct_{nt}_{et}.json").read_text())
                for path, data in mine[(nt, et)].items():
                    row = dict(case=label, node_threshold=nt, edge_threshold=et, path=path)
                    row.update(compare(data, theirs))
                    rows.append(row)
                    print(json.dumps(row), flush=True)
    lines = [
        "| case | thresholds | path | nodes ours / ct | links ours / ct | node J | link J | "
        "max weight diff (rel) | max influence diff | slider |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['case']} | {r['node_threshold']} / {r['edge_threshold']} | {r['path']} | "
            f"{r['nodes'][0]} / {r['nodes'][1]} | {r['links'][0]} / {r['links'][1]} | "
            f"{r['node_jaccard']:.3f} | {r['link_jaccard']:.3f} | {r['max_weight_diff']:.1e} "
            f"({r['max_weight_rel_diff']:.1e}) | {r['max_influence_diff']:.1e} | "
            f"{r['slider'][0]} / {r['slider'][1]} |"
        )
    table = "\n".join(lines)
    print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps({"shape": SHAPE, "rows": rows}, indent=1))
    args.out.with_suffix(".md").write_text(
        "circuit-tracer's create_graph_files vs attrgraph's export on identical weights "
        f"(`{' '.join(SHAPE)}`); paths: unpruned = `attribute` + `export_json(thresholds)`, "
        "stored = `attribute_pruned` + `save_graph` / `load_graph` + `export_json()`.\n\n" + table + "\n"
    )


if __name__ == "__main__":
    main()

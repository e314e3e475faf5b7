"""Our graph against circuit-tracer's on the blocks of issue 32, identical weights.

1. For each block, run the peer harness (`ct_graph.py` in `../shared/peer/`, in its own venv with
   circuit-tracer) on one of its architectures with the block's flags added to the
   `HookedTransformerConfig` keyword arguments it builds (`BLOCKS`: the harness' `model_kwargs` is
   wrapped, nothing of it is copied): Qwen3 = its llama case with QK-norm; Gemma-3 = its gemma2 case
   with QK-norm and without the attention soft cap (Gemma-3 has none); a parallel block = its gpt2
   case with `parallel_attn_mlp` (GPT-J / GPT-NeoX). circuit-tracer's TransformerLens backend builds
   the model and saves its adjacency.
2. In a fresh process of ours, `peer_compare.ours` builds our graph on the saved files with each
   backend and maps circuit-tracer's node order onto ours (`peer_compare.compare`).
3. Print a table and write `benchmarks/results/peer_blocks.{md,json}`; a case circuit-tracer cannot
   build is listed with its error.

Usage: python benchmarks/peer_blocks.py --peer-python VENV/bin/python [--peer-harness DIR]
(default harness: ../shared/peer beside the project)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = {
    "qwen3": ("llama", {"use_qk_norm": True}),
    "gemma3": ("gemma2", {"use_qk_norm": True, "attn_scores_soft_cap": 0.0}),
    "parallel": ("gpt2", {"parallel_attn_mlp": True}),
}
"""Block -> (the harness' architecture, config flags added to it)."""
TRANSCODERS = (("plt", []), ("plt", ["--skip"]), ("clt", []))
DRIVER = """
import json, sys
sys.path.insert(0, sys.argv[1])
import ct_graph
extra = json.loads(sys.argv[2])
base = ct_graph.model_kwargs
ct_graph.model_kwargs = lambda *a, **k: dict(base(*a, **k), **extra)
sys.argv = [ct_graph.__file__, *sys.argv[3:]]
sys.exit(0 if ct_graph.main() else 1)
"""


def run_peer(block: str, kind: str, flags: list, out: str, peer_python: str, harness: Path) -> str | None:
    """Step 1: the harness on `block`; None when it built the case, else the end of its error."""
    arch, extra = BLOCKS[block]
    cmd = [peer_python, "-c", DRIVER, str(harness), json.dumps(extra), "--arch", arch, "--transcoder", kind]
    cmd += [*flags, "--n-layers", "3", "--d-model", "64", "--d-transcoder", "256", "--prompt-len", "12"]
    cmd += ["--d-vocab", "256", "--threads", "1", "--out", out]
    res = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, HF_HUB_OFFLINE="1"))
    return None if res.returncode == 0 else res.stderr.strip().splitlines()[-1][:300]


def run_ours(out: str, backend: str) -> dict:
    """Step 2 in a fresh process of ours (peer_compare.ours)."""
    code = (
        "import json, sys; sys.path.insert(0, 'benchmarks'); import peer_compare as p; "
        f"print(json.dumps(p.ours({out!r}, 512, 1, {backend!r})))"
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env)
    if res.returncode != 0:
        return dict(match=False, reason=res.stderr.strip().splitlines()[-1][:300])
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peer-python", required=True, help="python of the venv with circuit-tracer")
    ap.add_argument("--peer-harness", type=Path, default=ROOT.parent / "shared" / "peer")
    args = ap.parse_args(argv)
    if not (args.peer_harness / "ct_graph.py").is_file():
        ap.error(f"{args.peer_harness} holds no ct_graph.py; pass --peer-harness, the peer harness folder.")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for block in BLOCKS:
            for kind, flags in TRANSCODERS:
                label = f"{block} {kind}{'+skip' if flags else ''}"
                out = os.path.join(tmp, label.replace(" ", "_").replace("+", "_"))
                error = run_peer(block, kind, flags, out, args.peer_python, args.peer_harness)
                row = dict(case=label, circuit_tracer=error or "built")
                if error is None:
                    # the flags reached the model both sides build (config.json holds its kwargs)
                    cfg = json.loads(Path(out, "config.json").read_text())
                    assert all(cfg.get(k) == v for k, v in BLOCKS[block][1].items()), (block, cfg)
                    for backend in ("linear", "autograd"):
                        got = run_ours(out, backend)
                        row[backend] = {k: got.get(k) for k in ("match", "max_rel_diff", "backend", "reason")}
                rows.append(row)
                print(json.dumps(row), flush=True)
    write_results(rows)
    return 0 if all(r.get("linear", {}).get("match", True) for r in rows) else 1


def write_results(rows: list[dict]) -> None:
    """Step 3."""
    res = ROOT / "benchmarks" / "results"
    (res / "peer_blocks.json").write_text(json.dumps(rows, indent=1) + "\n")
    lines = [
        "# Our graph vs circuit-tracer's on identical weights: QK-norm, Gemma-3 and parallel blocks",
        "",
        "`python benchmarks/peer_blocks.py --peer-python VENV/bin/python` (3 layers, d_model 64, 256 features,",
        "12 tokens + BOS; max |A_ours - A_ct| / max |A_ct| node for node)",
        "",
        "| case | circuit-tracer | linear | autograd |",
        "|---|---|---|---|",
    ]

    def cell(side):
        if side is None:
            return "-"
        if side.get("max_rel_diff") is None:
            return f"no match: {side.get('reason')}"
        return f"{'match' if side['match'] else 'DIFFERS'}, {side['max_rel_diff']:.1e}"

    for r in rows:
        lines.append(
            f"| {r['case']} | {r['circuit_tracer']} | {cell(r.get('linear'))} | {cell(r.get('autograd'))} |"
        )
    (res / "peer_blocks.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())

"""What the attention SAE finds on the bundled model: IOI and induction graphs with both sets.

For one IOI prompt and one induction prompt (random words, then the same words again, cut one
token before the end), build the graph with `default-plt` (MLP transcoders) and `default-attn-sae`
(attention-output SAE) and measure, for the top logit (the correct answer on both prompts):

1. Path-mass shares. With `W = normalize_matrix(adjacency)` (rows of |A| scaled to sum to 1, the
   seed's influence matrix), the logit's attribution is a unit of mass spread over the paths from
   the leaves (embeddings, MLP errors, attention errors) to the logit, each path weighted by the
   product of its normalized edges. The share "through" a node set S is the mass of the paths that
   visit at least one node of S: `1 - (leaf influence with the edges out of S removed)`. The three
   leaf kinds partition the mass (each path starts at exactly one leaf), so their shares sum to 1;
   the feature shares overlap (a path can visit MLP and attention features).
2. The top attention features by logit influence (`compute_influence(W, one-hot top logit)`), with
   their dashboard labels, position, the earlier position they read most from (largest summed
   |edge| in), and two flags for features at the last position: "copies answer" (the answer is
   among the top-10 logits of the feature's direct path, the dashboard's top logits) and "reads
   answer" (the position it reads most from holds the answer token: the indirect object on IOI, the
   answer's first occurrence on induction). A late-layer feature at the last position that copies
   names, or reads the indirect object, looks like a name mover; one that reads the token after
   the previous occurrence of the current token looks like an induction feature.

Writes benchmarks/results/attention_features.{json,md}. Usage:
    OMP_NUM_THREADS=1 python benchmarks/attention_features.py   (about 20 s)
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import scipy.sparse as sp  # noqa: E402

CATEGORIES = (
    ("embeddings", "embedding", ""),
    ("MLP errors", "error", "mlp"),
    ("attention errors", "error", "attn"),
    ("MLP features", "feature", "mlp"),
    ("attention features", "feature", "attn"),
)
LEAVES = ("embeddings", "MLP errors", "attention errors")


def prompts():
    """The IOI prompt of the other notebooks and the first induction example of seed 0, cut before
    its last token (the answer)."""
    from attrgraph.bundled import tasks

    ex = tasks.induction(random.Random(0))
    return {
        "IOI": ("When Mary and John went to the store , John gave a drink to", "Mary"),
        "induction": (" ".join(ex.tokens[:-1]), ex.tokens[-1]),
    }


def path_shares(graph) -> dict[str, float]:
    """Share of the top logit's path mass through each node category (module docstring, 1)."""
    from attrgraph import compute_influence
    from attrgraph.graph.prune import normalize_matrix

    n = graph.nodes
    W = normalize_matrix(graph.adjacency)
    w = np.zeros(len(n))
    w[np.flatnonzero(n.kind == "logit")[0]] = 1.0  # logits come in probability order: the top one
    leaf = (n.kind == "embedding") | (n.kind == "error")
    out = {}
    for name, kind, site in CATEGORIES:
        S = n.mask(kind, site or None)
        keep = sp.diags_array((~S).astype(np.float64))
        avoiding = compute_influence(sp.csr_array(W @ keep), w)  # paths that never leave a node of S
        out[name] = float(1.0 - avoiding[leaf & ~S].sum())
    return out


def top_attention_features(graph, dashboards, answer: str, k: int = 8) -> list[dict]:
    """The `k` attention features of largest influence on the top logit (module docstring, 2)."""
    from attrgraph import compute_influence
    from attrgraph.graph.prune import normalize_matrix

    n = graph.nodes
    w = np.zeros(len(n))
    w[np.flatnonzero(n.kind == "logit")[0]] = 1.0
    influence = compute_influence(normalize_matrix(graph.adjacency), w)
    attn = np.flatnonzero(n.mask("feature", "attn"))
    A = sp.csr_array(graph.adjacency)
    last = int(n.position.max())
    rows = []
    for i in attn[np.argsort(-influence[attn])][:k]:
        layer, pos, f = int(n.layer[i]), int(n.position[i]), int(n.feature[i])
        lo, hi = A.indptr[i], A.indptr[i + 1]
        src_pos = n.position[A.indices[lo:hi]]
        mass = np.bincount(src_pos, np.abs(A.data[lo:hi]), minlength=last + 1)
        mass[pos] = 0  # the position it reads from, other than its own
        reads = int(mass.argmax())
        logits = [t for t, _ in dashboards.feature(layer, f)["top_logits"][:10]]
        rows.append(
            {
                "layer": layer,
                "position": pos,
                "token": graph.prompt_tokens[pos],
                "feature": f,
                "influence": float(influence[i]),
                "activation": float(n.activation[i]),
                "label": dashboards.label(layer, f),
                "reads_from": reads,
                "reads_token": graph.prompt_tokens[reads],
                "top_logits": logits[:5],
                "copies_answer": pos == last and answer in logits,
                "reads_answer": pos == last and graph.prompt_tokens[reads] == answer,
            }
        )
    return rows


def analyse(model, sets, dashboards, prompt: str, answer: str) -> tuple[object, dict]:
    import attrgraph

    graph = attrgraph.attribute(model, sets, prompt)
    n = graph.nodes
    counts = {name: int(n.mask(kind, site or None).sum()) for name, kind, site in CATEGORIES}
    shares = path_shares(graph)
    assert abs(sum(shares[k] for k in LEAVES) - 1) < 1e-6, shares  # the leaves partition the path mass
    return graph, {
        "prompt": prompt,
        "answer": answer,
        "top_logit": graph.logit_strings[0],
        "top_prob": float(graph.logit_probs[0]),
        "node_counts": counts,
        "shares": shares,
        "top_attention_features": top_attention_features(graph, dashboards, answer),
    }


def markdown(out: dict) -> str:
    lines = [
        "# Attention features on the bundled model",
        "",
        f"`{out['command']}`; {out['seconds']:.1f} s, load {out['loadavg']}.",
        "",
        "Share of the top logit's path mass (normalized |A|) through each node kind:",
        "",
        "| prompt | " + " | ".join(name for name, _, _ in CATEGORIES) + " |",
        "|---" * (len(CATEGORIES) + 1) + "|",
    ]
    for task, r in out["tasks"].items():
        lines.append(
            f"| {task} | " + " | ".join(f"{r['shares'][name]:.3f}" for name, _, _ in CATEGORIES) + " |"
        )
    for task, r in out["tasks"].items():
        lines += [
            "",
            f"## {task}: `{r['prompt']}` -> {r['top_logit']} (p = {r['top_prob']:.2f})",
            "",
            "| layer | position (token) | feature | influence | label | reads from | top logits | copies answer | reads answer |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for f in r["top_attention_features"]:
            lines.append(
                f"| {f['layer']} | {f['position']} ({f['token']}) | {f['feature']} | {f['influence']:.4f} | "
                f"{f['label']} | {f['reads_from']} ({f['reads_token']}) | {', '.join(f['top_logits'])} | "
                f"{'yes' if f['copies_answer'] else 'no'} | {'yes' if f['reads_answer'] else 'no'} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    import torch

    import attrgraph
    import transcoders
    from transcoders.dashboard_file import default_path, load_dashboards

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    model = attrgraph.load_model("default")
    sets = attrgraph.TranscoderSets(
        mlp=transcoders.load_transcoders("default-plt"), attn=transcoders.load_transcoders("default-attn-sae")
    )
    dashboards = load_dashboards(default_path("default-attn-sae"))
    results = {task: analyse(model, sets, dashboards, p, a)[1] for task, (p, a) in prompts().items()}
    out = {
        "command": "OMP_NUM_THREADS=1 python benchmarks/attention_features.py",
        "seconds": time.perf_counter() - t0,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "tasks": results,
    }
    res = ROOT / "benchmarks" / "results"
    (res / "attention_features.json").write_text(json.dumps(out, indent=2) + "\n")
    (res / "attention_features.md").write_text(markdown(out))
    print(markdown(out))


if __name__ == "__main__":
    main()

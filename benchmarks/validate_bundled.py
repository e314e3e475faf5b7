"""Validate attribution graphs of the bundled model by interventions (attrgraph.analysis.validate), over
~20 prompts spanning the corpus tasks, and show QK attribution on two known heads.

    python benchmarks/validate_bundled.py [--transcoders default-plt default-clt] [--n-prompts 20]

Writes `benchmarks/results/validate_<set>.{md,json}` and `validate_<set>_*.png` per transcoder set:
node-to-logit log-log Pearson (influence, activation, direct logit edge), feature-to-feature
Spearman, local replacement faithfulness per layer, and the top QK pairs of the induction head
(query: a repeated token; key: the token after its first occurrence) and of the IOI name-mover
head (query: the last token; key: the indirect object). The heads are found from attention
patterns on task examples drawn with their own seeds, not hard-coded.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from attrgraph.analysis.qk import qk_attribution  # noqa: E402
from attrgraph.analysis.validate import ValidateConfig, validate_graph  # noqa: E402
from attrgraph.analysis.validation_report import write_report  # noqa: E402
from attrgraph.bundled import tasks  # noqa: E402
from attrgraph.bundled.loading import load_model  # noqa: E402
from attrgraph.engine.attribute import attribute  # noqa: E402
from attrgraph.engine.replacement import ReplacementModel  # noqa: E402
from attrgraph.graph.prune import prune_graph  # noqa: E402

MIX = (
    ("induction", 3),
    ("ioi", 3),
    ("greater_than", 3),
    ("brackets", 3),
    ("addition", 3),
    ("facts", 3),
    ("filler", 2),
)


def prompts(n: int, seed: int = 1) -> list[tuple[str, str]]:
    out = []
    scale = n / sum(k for _, k in MIX)
    for task, k in MIX:
        for ex in tasks.generate(task, max(1, round(k * scale)), seed=seed):
            if not ex.graded:  # filler: no graded token, take a sentence prefix
                text = " ".join(ex.tokens[:12])
            elif task == "induction":  # stop inside the repeat, so that induction is needed
                text = " ".join(ex.tokens[: ex.graded[len(ex.graded) // 2]])
            else:
                text = ex.prompt
            out.append((f"{task}_{len([o for o in out if o[0].startswith(task)])}", text))
    return out[:n]


@torch.no_grad()
def find_heads(model) -> dict:
    """The induction head (attention from a repeated token to the token after its first occurrence)
    and the IOI mover head (attention from the last token to the indirect object)."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    ind, n_ind = torch.zeros(L, H), 0
    for ex in tasks.generate("induction", 8, seed=99):
        toks = model.to_tokens(ex.text)[0]
        _, cache = model.run_with_cache(toks[None], names_filter=lambda n: n.endswith("hook_pattern"))
        words = toks.tolist()
        for i in range(len(words)):
            prev = [j for j in range(i) if words[j] == words[i]]
            if prev and prev[-1] + 1 < i:
                for l in range(L):
                    ind[l] += cache[f"blocks.{l}.attn.hook_pattern"][0, :, i, prev[-1] + 1]
                n_ind += 1
    io = torch.zeros(L, H)
    for ex in tasks.generate("ioi", 16, seed=99):
        toks = model.to_tokens(ex.prompt)[0]
        _, cache = model.run_with_cache(toks[None], names_filter=lambda n: n.endswith("hook_pattern"))
        pos = 1 + ex.prompt.split().index(ex.answer)  # +1: BOS
        for l in range(L):
            io[l] += cache[f"blocks.{l}.attn.hook_pattern"][0, :, -1, pos]
    ind, io = ind / max(n_ind, 1), io / 16
    li, hi = divmod(int(ind.argmax()), H)
    lo, ho = divmod(int(io.argmax()), H)
    return {"induction": (li, hi, float(ind[li, hi])), "ioi_mover": (lo, ho, float(io[lo, ho]))}


def qk_examples(model, rm, heads: dict, k: int = 8) -> dict:
    out = {}
    ex = tasks.generate("induction", 1, seed=7)[0]
    toks = model.to_tokens(ex.text)[0]
    words = toks.tolist()
    i = next(
        i for i in range(len(words) - 1, 0, -1) if words[i] in words[1:i] and words.index(words[i]) + 1 < i
    )
    j = words.index(words[i]) + 1
    l, h, s = heads["induction"]
    qk = qk_attribution(model, rm, toks, l, h, i, j)
    strs = model.to_str_tokens(toks)
    out["induction"] = {
        "head": f"L{l}H{h}",
        "head_score": s,
        "prompt": ex.text,
        "query": f"{i} {strs[i]!r}",
        "key": f"{j} {strs[j]!r}",
        "score": qk.score,
        "top_pairs": qk.top_pairs(k),
    }
    ex = tasks.generate("ioi", 1, seed=7)[0]
    toks = model.to_tokens(ex.prompt)[0]
    j = 1 + ex.prompt.split().index(ex.answer)
    l, h, s = heads["ioi_mover"]
    qk = qk_attribution(model, rm, toks, l, h, len(toks) - 1, j)
    strs = model.to_str_tokens(toks)
    out["ioi_mover"] = {
        "head": f"L{l}H{h}",
        "head_score": s,
        "prompt": ex.prompt,
        "query": f"{len(toks) - 1} {strs[-1]!r}",
        "key": f"{j} {strs[j]!r}",
        "score": qk.score,
        "top_pairs": qk.top_pairs(k),
    }
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--transcoders", nargs="+", default=["default-plt", "default-clt"])
    p.add_argument("--n-prompts", type=int, default=20)
    p.add_argument("--max-features", type=int, default=100)
    p.add_argument("--n-perturbations", type=int, default=16)
    p.add_argument("--out", default=str(Path(__file__).parent / "results"))
    args = p.parse_args(argv)
    from transcoders import load_transcoders

    torch.manual_seed(0)
    model = load_model("default")
    heads = find_heads(model)
    cfg = ValidateConfig(max_features=args.max_features, n_perturbations=args.n_perturbations)
    for name in args.transcoders:
        t0 = time.perf_counter()
        tc = load_transcoders(name)
        rm = ReplacementModel(model, tc)
        stem = "validate_" + Path(name).name.replace("default-", "")
        results, names, sizes = [], [], []
        for label, prompt in prompts(args.n_prompts):
            graph = prune_graph(attribute(model, rm, prompt))
            results.append(validate_graph(model, rm, graph, cfg))
            names.append(label)
            sizes.append(graph.n_features)
            print(
                f"{name} {label}: {graph.n_features} features, "
                f"ff spearman {results[-1]['feature_to_feature']['spearman']:.3f}",
                flush=True,
            )
        summary = write_report(
            results, names, args.out, title=f"Validation of bundled graphs ({name})", stem=stem
        )
        qk = qk_examples(model, rm, heads)
        lines = ["", "## QK attribution", ""]
        for key, v in qk.items():
            lines += [
                f"{key}: head {v['head']} (pattern score {v['head_score']:.2f}), prompt {v['prompt']!r}, "
                f"query {v['query']} -> key {v['key']}, score {v['score']:.3f}",
                "",
                "| query-side source | key-side source | contribution |",
                "|---|---|---|",
            ]
            lines += [f"| {a} | {b} | {c:.3f} |" for a, b, c in v["top_pairs"]] + [""]
        lines += [
            f"Graphs: pruned (0.8 / 0.98), {sum(sizes) / len(sizes):.0f} features on average; "
            f"config {cfg}; wall time {time.perf_counter() - t0:.0f} s.",
            "",
        ]
        md = Path(args.out) / f"{stem}.md"
        md.write_text(md.read_text() + "\n".join(lines))
        js = Path(args.out) / f"{stem}.json"
        data = json.loads(js.read_text())
        data["qk"] = qk
        js.write_text(json.dumps(data, indent=1))
        print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Head loadings on the bundled IOI graph: timing, and which heads carry the name-moving edges.

1. Build the graph of "When Mary and John went to the store, John gave a drink to" with
   `default-plt` (no attention set: every edge between positions runs through attention).
2. Time `head_loadings` for the 100 strongest edges (one forward-mode and one backward sweep per
   batch; analysis/head_loadings.py) and check every split sums to its edge.
3. Name-mover-like edges: edges into the top logit (" Mary") from nodes at the position of the
   indirect object "Mary" (earlier in the prompt). Sum their head loadings per head.
4. Check on the real model, two ways: cut one head's attention from the last position to the
   indirect object (its pattern entry set to 0: the path the loadings split, with everything
   downstream live) and measure the change of the demeaned answer logit; and zero one head's
   whole output there (`hook_z`), measuring the logit difference " Mary" - " John" (every path
   through the head, from every position).

Writes benchmarks/results/head_loadings.{json,md}. Usage:
    OMP_NUM_THREADS=1 python benchmarks/head_loadings.py   (about 20 s)
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

PROMPT = "When Mary and John went to the store, John gave a drink to"


def ablation_effects(model, tokens, good: int, bad: int) -> np.ndarray:
    """[n_layers, n_heads] change of logit(good) - logit(bad) at the last position when one head's
    output there is zeroed (its `hook_z`), on the real model."""
    L, H = model.cfg.n_layers, model.cfg.n_heads

    def diff(hooks=()):
        with torch.no_grad():
            logits = model.run_with_hooks(tokens[None], fwd_hooks=list(hooks))[0, -1]
        return float(logits[good] - logits[bad])

    base = diff()
    out = np.zeros((L, H))
    for l in range(L):
        for h in range(H):

            def zero(z, hook, h=h):
                z = z.clone()
                z[:, -1, h] = 0.0
                return z

            out[l, h] = diff([(f"blocks.{l}.attn.hook_z", zero)]) - base
    return out


def knockout_effects(model, tokens, good: int, key: int, hold: bool = False) -> np.ndarray:
    """[n_layers, n_heads] change of the demeaned logit of `good` at the last position when one
    head's attention from the last position to position `key` is cut (that pattern entry set to 0,
    not renormalized), on the real model: the path a head loading of an edge from `key` measures,
    with everything downstream left live (norms, MLPs, later heads), or with `hold` the MLP outputs
    from the head's layer on and the final norm's scale held at their clean values (as the graph
    freezes them; later heads stay live)."""
    L, H = model.cfg.n_layers, model.cfg.n_heads
    clean = {}
    if hold:
        names = [f"blocks.{l}.hook_mlp_out" for l in range(L)] + ["ln_final.hook_scale"]
        with torch.no_grad():
            _, cache = model.run_with_cache(tokens[None], names_filter=lambda n: n in names)
        clean = {n: cache[n] for n in names}

    def held(layer: int) -> list:
        if not hold:
            return []
        names = [f"blocks.{l}.hook_mlp_out" for l in range(layer, L)] + ["ln_final.hook_scale"]
        return [(n, lambda x, hook: clean[hook.name]) for n in names]

    def target(hooks=()):
        with torch.no_grad():
            logits = model.run_with_hooks(tokens[None], fwd_hooks=list(hooks))[0, -1]
        return float(logits[good] - logits.mean())

    base = target()
    out = np.zeros((L, H))
    for l in range(L):
        for h in range(H):

            def cut(pattern, hook, h=h):  # [batch, head, query, key]
                pattern = pattern.clone()
                pattern[:, h, -1, key] = 0.0
                return pattern

            out[l, h] = target([(f"blocks.{l}.attn.hook_pattern", cut), *held(l)]) - base
    return out


def main() -> int:
    torch.set_num_threads(1)
    import attrgraph
    import transcoders
    from attrgraph.analysis.head_loadings import head_loadings

    model = attrgraph.load_model("default")
    tc = transcoders.load_transcoders("default-plt")
    t0 = time.perf_counter()
    graph = attrgraph.attribute(model, tc, PROMPT)
    t_graph = time.perf_counter() - t0
    tokens = torch.as_tensor(graph.prompt_ids)
    words = graph.prompt_tokens

    t0 = time.perf_counter()
    hl = head_loadings(model, tc, graph, top=100)
    t_heads = time.perf_counter() - t0
    A = graph.adjacency
    edge = np.array([A[t, s] for t, s in hl.edges.tolist()])
    worst = float(np.max(np.abs(hl.heads.sum(-1) + hl.bypass - edge[:, None]) / np.abs(edge)[:, None]))
    through_heads = float(np.mean(np.abs(hl.heads).sum((1, 2)) > 1e-6 * np.abs(edge)))

    n = graph.nodes
    logit = int(np.nonzero(n.kind == "logit")[0][0])
    answer = graph.logit_strings[0]
    io_pos = next(i for i, w in enumerate(words) if w.strip() == answer.strip())
    sources = [
        int(s)
        for s in np.nonzero((n.position == io_pos) & np.isin(n.kind, ("embedding", "feature", "error")))[0]
        if A[logit, s] != 0
    ]
    mover = head_loadings(model, tc, graph, edges=[(logit, s) for s in sources])
    per_head = mover.heads.sum(0)  # [L, H], summed over the name-moving edges
    other = " John" if answer.strip() == "Mary" else " Mary"
    good = int(n.token[logit])
    bad = int(model.tokenizer.convert_tokens_to_ids(other.strip()))
    ablate = ablation_effects(model, tokens, good, bad)
    knock = knockout_effects(model, tokens, good, io_pos)
    knock_held = knockout_effects(model, tokens, good, io_pos, hold=True)
    order = np.argsort(-np.abs(per_head), axis=None)[:5]
    top = [
        dict(
            layer=int(o // per_head.shape[1]),
            head=int(o % per_head.shape[1]),
            loading=float(per_head.flat[o]),
            ablation_delta_logit_diff=float(ablate.flat[o]),
            knockout_delta_logit=float(knock.flat[o]),
            knockout_held_delta_logit=float(knock_held.flat[o]),
        )
        for o in order
    ]
    ab_order = np.argsort(ablate, axis=None)[:3]  # the most harmful ablations
    rank_corr = float(
        np.corrcoef(np.argsort(np.argsort(-per_head.ravel())), np.argsort(np.argsort(ablate.ravel())))[0, 1]
    )
    held_corr = float(
        np.corrcoef(np.argsort(np.argsort(per_head.ravel())), np.argsort(np.argsort(-knock_held.ravel())))[
            0, 1
        ]
    )
    knock_corr = float(
        np.corrcoef(np.argsort(np.argsort(per_head.ravel())), np.argsort(np.argsort(-knock.ravel())))[0, 1]
    )
    result = dict(
        command="OMP_NUM_THREADS=1 python benchmarks/head_loadings.py",
        prompt=PROMPT,
        answer=answer,
        indirect_object_position=io_pos,
        graph_seconds=round(t_graph, 2),
        n_edges=int(len(hl.edge)),
        head_loadings_seconds=round(t_heads, 2),
        worst_relative_sum_error=worst,
        share_of_edges_through_heads=through_heads,
        name_moving_edges=len(sources),
        name_moving_edge_total=float(mover.edge.sum()),
        name_moving_bypass_total=float(mover.bypass.sum(0).min()),
        top_heads=top,
        most_harmful_ablations=[
            dict(layer=int(o // ablate.shape[1]), head=int(o % ablate.shape[1]), delta=float(ablate.flat[o]))
            for o in ab_order
        ],
        spearman_loading_vs_ablation_harm=rank_corr,
        spearman_loading_vs_knockout_drop=knock_corr,
        spearman_loading_vs_held_knockout_drop=held_corr,
    )
    out = ROOT / "benchmarks" / "results" / "head_loadings"
    out.with_suffix(".json").write_text(json.dumps(result, indent=1))
    lines = [
        "# Head loadings on the bundled IOI graph",
        "",
        f"`{result['command']}`; prompt {PROMPT!r}, `default-plt`, answer {answer!r}.",
        "",
        f"- head loadings of the {result['n_edges']} strongest edges: {result['head_loadings_seconds']} s "
        f"(graph: {result['graph_seconds']} s); worst |sum of parts - edge| / |edge| over every layer: "
        f"{worst:.1e}; {100 * through_heads:.0f}% of these edges pass at least one head.",
        f"- name-moving edges (from the {len(sources)} nodes at {words[io_pos]!r}, position {io_pos}, into the "
        f"{answer!r} logit): total {result['name_moving_edge_total']:.3f}.",
        "",
        "| layer.head | summed loading on the name-moving edges | real model: change of the demeaned "
        f"{answer!r} logit when the head's attention from the last position to {words[io_pos]!r} is cut | "
        "the same cut, later MLP outputs and the final norm's scale held | "
        "real model: change of logit diff when the head's output at the last position is zeroed |",
        "|---|---|---|---|---|",
    ]
    lines += [
        f"| {t['layer']}.{t['head']} | {t['loading']:.3f} | {t['knockout_delta_logit']:+.3f} | "
        f"{t['knockout_held_delta_logit']:+.3f} | {t['ablation_delta_logit_diff']:+.3f} |"
        for t in top
    ]
    lines += [
        "",
        "Most harmful single-head ablations on the real model: "
        + ", ".join(f"{a['layer']}.{a['head']} ({a['delta']:+.3f})" for a in result["most_harmful_ablations"])
        + f"; Spearman correlation over all heads of the loading with the drop when its attention to "
        f"{words[io_pos]!r} is cut: {knock_corr:.2f} (held: {held_corr:.2f}); with the harm of zeroing its "
        f"whole output: {rank_corr:.2f}.",
        "",
    ]
    out.with_suffix(".md").write_text("\n".join(lines))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

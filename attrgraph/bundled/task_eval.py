"""Task metrics on fresh examples for a model trained on `attrgraph.bundled.tasks` (the bundled model's quality bar).

For each task, `n` fresh examples (drawn with a seed the training stream does not use) are run as
BOS + instance, teacher-forced, and graded at their `graded` positions. Fresh draws are not held
out: the generators draw from small pools, so many are training instances (every facts and
addition example for the bundled model; `benchmarks/eval_overlap.py` counts them per task).

1. induction, brackets, addition, facts: top-1 accuracy over graded tokens.
2. ioi: top-1 == indirect object at the final position, and the mean logit
   difference logit(IO) - logit(S) there.
3. greater_than: mean probability mass on valid years (ZZ > YY) at the final position.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from attrgraph.bundled import tasks

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

EVAL_SEED = 1_000_003  # training streams use small seeds; evaluation draws its own examples with this one
EVALUATION_NOTE = (
    "Metrics on fresh draws from the task generators with a seed training does not use. They are not "
    f"held out: the generators draw from small pools (facts: the same {len(tasks.CAPITALS)} capitals as "
    "in training; addition: 8100 sums), so many are training instances (benchmarks/eval_overlap.py "
    "counts them per task for the bundled model)."
)


def encode(model: HookedTransformer, examples: list[tasks.Example]) -> tuple[torch.Tensor, list[list[int]]]:
    """Right-padded token ids [n, 1 + max_len] (BOS first) for word-level examples."""
    vocab = model.tokenizer.get_vocab()
    rows = [[model.tokenizer.bos_token_id] + [vocab[w] for w in ex.tokens] for ex in examples]
    width = max(map(len, rows))
    pad = model.tokenizer.pad_token_id
    return torch.tensor([r + [pad] * (width - len(r)) for r in rows]), rows


@torch.no_grad()
def logits_for(
    model: HookedTransformer, examples: list[tasks.Example], batch_size: int = 128
) -> list[torch.Tensor]:
    """Per-example logits [len, d_vocab] predicting each instance token (position i predicts token i)."""
    out = []
    for start in range(0, len(examples), batch_size):
        chunk = examples[start : start + batch_size]
        ids, rows = encode(model, chunk)
        logits = model(ids.to(model.cfg.device)).float().cpu()
        # logits at position j (BOS=0) predict the token at instance index j
        out += [logits[i, : len(rows[i]) - 1] for i in range(len(chunk))]
    return out


def top1(model: HookedTransformer, examples: list[tasks.Example]) -> float:
    vocab = model.tokenizer.get_vocab()
    hits = total = 0
    for ex, lg in zip(examples, logits_for(model, examples)):
        for g in ex.graded:
            hits += int(lg[g].argmax().item() == vocab[ex.tokens[g]])
            total += 1
    return hits / max(total, 1)


def evaluate_tasks(model: HookedTransformer, n: int = 200, seed: int = EVAL_SEED) -> dict[str, float]:
    """The quality-bar metrics on `n` fresh examples per task (not held out: module docstring)."""
    vocab = model.tokenizer.get_vocab()
    metrics: dict[str, float] = {}
    for task in ("induction", "brackets", "addition", "facts"):
        metrics[f"{task}_top1"] = top1(model, tasks.generate(task, n, seed))

    ioi = tasks.generate("ioi", n, seed)
    lgs = logits_for(model, ioi)
    io = torch.tensor([vocab[ex.meta["io"]] for ex in ioi])
    s = torch.tensor([vocab[ex.meta["s"]] for ex in ioi])
    last = torch.stack([lg[ex.graded[0]] for ex, lg in zip(ioi, lgs)])
    metrics["ioi_top1"] = (last.argmax(-1) == io).float().mean().item()
    metrics["ioi_logit_diff"] = (last.gather(1, io[:, None]) - last.gather(1, s[:, None])).mean().item()

    gt = tasks.generate("greater_than", n, seed)
    mass = []
    for ex, lg in zip(gt, logits_for(model, gt)):
        probs = lg[ex.graded[0]].softmax(-1)
        mass.append(probs[[vocab[v] for v in ex.valid]].sum().item())
    metrics["greater_than_prob_mass"] = sum(mass) / len(mass)
    return metrics


QUALITY_BAR = {
    "induction_top1": 0.9,
    "ioi_top1": 0.9,
    "ioi_logit_diff": 0.0,
    "greater_than_prob_mass": 0.8,
    "brackets_top1": 0.9,
    "addition_top1": 0.9,
    "facts_top1": 0.9,
}


def shortfalls(metrics: dict[str, float]) -> dict[str, str]:
    """Metrics under the quality bar, each with its bar (empty when all pass)."""
    return {k: f"{metrics[k]:.3f} < {bar}" for k, bar in QUALITY_BAR.items() if not metrics[k] > bar - 1e-12}

"""How many of the bundled model's evaluation examples also occur in its training corpus.

The task metrics in `data/default/manifest.json` (`attrgraph.task_eval.evaluate_tasks`) are
computed on fresh draws from the task generators with a seed the training stream does not use.
The generators draw from small pools (36 countries, 8,100 two-digit sums, ...), so a fresh draw
can still be an instance the model was trained on. This counts them.

1. Read the training run from the manifest: seed, steps, batch size, n_ctx, and the number of
   evaluation examples per task (`eval_n`).
2. Replay the training corpus as `attrgraph.bundled.train_model.sequences` builds it (BOS, instances
   joined by <eos>, cut at n_ctx; an instance cut at the end is dropped) for steps x batch size
   sequences, recording every instance whose tokens all lie inside one training sequence. The
   replay is checked against `sequences` itself on the first sequences.
3. Draw each task's evaluation examples as `evaluate_tasks` does (`tasks.generate(task, eval_n,
   EVAL_SEED)`) and count those whose token sequence is a training instance.
4. Print a table and write benchmarks/results/eval_overlap.{md,json}.

Usage: python benchmarks/eval_overlap.py [--check 2000]   (about 30 s)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from itertools import islice
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

GRADED = ("induction", "ioi", "greater_than", "brackets", "addition", "facts")


def training_instances(seed: int, n_seq: int, n_ctx: int, vocab: dict[str, int] | None = None):
    """Per task, the set of instances (token tuples) lying whole inside one of the first `n_seq`
    training sequences; with `vocab`, also the replayed sequences as token ids (for the check)."""
    from attrgraph.bundled import tasks

    stream = tasks.stream(seed)
    seen: dict[str, set] = {}
    replay: list[list[int]] = []
    for _ in range(n_seq):
        seq = ["<bos>"]
        while len(seq) < n_ctx:
            ex = next(stream)
            take = min(n_ctx - len(seq), len(ex.tokens) + 1)
            seq += [*ex.tokens, "<eos>"][:take]
            if take >= len(ex.tokens):
                seen.setdefault(ex.task, set()).add(ex.tokens)
        if vocab is not None:
            replay.append([vocab[w] for w in seq])
    return seen, replay


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument(
        "--check", type=int, default=2000, help="training sequences compared with train_model.sequences"
    )
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "eval_overlap"))
    args = ap.parse_args(argv)
    from attrgraph.bundled import tasks
    from attrgraph.bundled.paths import BUNDLED
    from attrgraph.bundled.task_eval import EVAL_SEED
    from attrgraph.bundled.tokenizer import load_tokenizer
    from attrgraph.bundled.train_model import sequences

    t0 = time.perf_counter()
    manifest = json.loads((BUNDLED["default"] / "manifest.json").read_text())
    cfg = manifest["config"]
    n_seq = cfg["steps"] * cfg["batch_size"]
    assert n_seq * cfg["n_ctx"] == manifest["tokens_seen"]
    vocab = load_tokenizer(BUNDLED["default"] / "tokenizer").get_vocab()
    _, replay = training_instances(cfg["seed"], args.check, cfg["n_ctx"], vocab)
    if replay != list(islice(sequences(vocab, cfg["n_ctx"], cfg["seed"]), args.check)):
        raise SystemExit(
            "the replay differs from attrgraph.bundled.train_model.sequences; update this script."
        )
    seen, _ = training_instances(cfg["seed"], n_seq, cfg["n_ctx"])

    rows = []
    for task in GRADED:
        examples = tasks.generate(task, cfg["eval_n"], EVAL_SEED)
        hits = sum(ex.tokens in seen[task] for ex in examples)
        rows.append(
            dict(
                task=task,
                eval_examples=len(examples),
                also_in_training=hits,
                share=hits / len(examples),
                distinct_training_instances=len(seen[task]),
            )
        )
    meta = dict(
        training_sequences=n_seq,
        n_ctx=cfg["n_ctx"],
        training_seed=cfg["seed"],
        eval_seed=EVAL_SEED,
        replay_checked_sequences=args.check,
        seconds=round(time.perf_counter() - t0, 1),
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    lines = [
        "# Evaluation examples of the bundled model that also occur in its training corpus",
        "",
        f"Training corpus replayed: {n_seq} sequences of {cfg['n_ctx']} tokens (seed {cfg['seed']}, checked "
        f"against attrgraph.bundled.train_model.sequences on the first {args.check}); evaluation: "
        f"tasks.generate(task, {cfg['eval_n']}, {EVAL_SEED}) as in attrgraph.task_eval.evaluate_tasks. "
        "An example counts when its whole token sequence is a training instance.",
        "",
        "| task | evaluation examples | also in training | share | distinct training instances |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['task']} | {r['eval_examples']} | {r['also_in_training']} | {r['share']:.2f} "
            f"| {r['distinct_training_instances']} |"
        )
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())

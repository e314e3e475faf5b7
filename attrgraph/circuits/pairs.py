"""Clean/corrupted prompt pairs and the task metric M (PEAP seed sec. 3; HAP seed sec. 4).

1. A batch holds clean and corrupted token ids of equal length per pair (right
   padded; causal attention makes padding after the last prompt token inert), the
   position `last[b]` whose next-token prediction is scored, and one weight row
   `weights[b]` over the vocabulary.
2. M_b = weights[b] . logits[b, last[b]]           (kind "logit": logit difference)
   M_b = weights[b] . softmax(logits[b, last[b]])  (kind "prob": probability difference)
   IOI: +1 on the indirect object, -1 on the subject (logit difference).
   Greater-than: +1 on years > YY, -1 on years <= YY (probability difference).
3. A metric that cannot vary (all-zero weights; for "prob", a weight row that is
   constant over the vocabulary) is refused before any model run.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float, Int
from torch import Tensor

from attrgraph.errors import ConstantMetricError, OptionError, PairLengthError, PromptError

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

METRIC_KINDS = ("logit", "prob")


@dataclass(frozen=True)
class Pairs:
    """A batch of clean/corrupted prompts and the metric read at one position of each."""

    clean: Int[Tensor, "batch pos"]
    """Clean token ids (BOS included, right padded)."""
    corrupt: Int[Tensor, "batch pos"]
    """Corrupted token ids, the same length as `clean`."""
    last: Int[Tensor, " batch"]
    """Position whose next-token logits the metric reads."""
    weights: Float[Tensor, "batch d_vocab"]
    """Metric weights over the vocabulary (see the module docstring)."""
    kind: str = "logit"
    """"logit": M = w . logits; "prob": M = w . softmax(logits)."""

    def __post_init__(self):
        if self.kind not in METRIC_KINDS:
            raise OptionError(f"metric kind {self.kind!r} is unknown; use one of {METRIC_KINDS}.")
        if self.clean.shape != self.corrupt.shape:
            raise PairLengthError(
                f"clean tokens have shape {tuple(self.clean.shape)} but corrupted tokens "
                f"{tuple(self.corrupt.shape)}; give every corrupted prompt the same length as its clean pair."
            )
        w = self.weights
        dead = (w == 0).all(-1) if self.kind == "logit" else (w == w[:, :1]).all(-1)
        if bool(dead.all()):
            raise ConstantMetricError(
                "the metric is constant (its weights are zero or uniform over the vocabulary); "
                "give distinct correct and incorrect tokens."
            )

    def __len__(self) -> int:
        return self.clean.shape[0]

    def __getitem__(self, idx) -> Pairs:
        return Pairs(self.clean[idx], self.corrupt[idx], self.last[idx], self.weights[idx], self.kind)

    def to(self, device) -> Pairs:
        return Pairs(
            self.clean.to(device),
            self.corrupt.to(device),
            self.last.to(device),
            self.weights.to(device),
            self.kind,
        )


def last_logits(logits: Float[Tensor, "batch pos d_vocab"], last: Int[Tensor, " batch"]) -> Tensor:
    return logits[torch.arange(logits.shape[0], device=logits.device), last]


def metric(logits_last: Float[Tensor, "batch d_vocab"], pairs: Pairs) -> Float[Tensor, " batch"]:
    """M per example, from the logits at each example's scored position."""
    x = logits_last if pairs.kind == "logit" else logits_last.float().softmax(-1).to(logits_last.dtype)
    return (x * pairs.weights.to(x.dtype)).sum(-1)


def make_pairs(
    clean: list[list[int]], corrupt: list[list[int]], weights: Tensor, kind: str = "logit", pad: int = 0
) -> Pairs:
    """Pad token-id lists on the right into a `Pairs` (each clean/corrupted pair must match in length)."""
    for i, (a, b) in enumerate(zip(clean, corrupt, strict=True)):
        if len(a) != len(b):
            raise PairLengthError(
                f"pair {i}: the clean prompt has {len(a)} tokens and the corrupted one {len(b)}; "
                "give every corrupted prompt the same length as its clean pair."
            )
    n_pos = max(len(a) for a in clean)
    # host tensors: the functions that run the model move the pairs to its device (`Pairs.to`)
    c = torch.full((len(clean), n_pos), pad, dtype=torch.long, device="cpu")
    x = torch.full_like(c, pad)
    for i, (a, b) in enumerate(zip(clean, corrupt, strict=True)):
        c[i, : len(a)] = torch.tensor(a, device="cpu")
        x[i, : len(b)] = torch.tensor(b, device="cpu")
    last = torch.tensor([len(a) - 1 for a in clean], device="cpu")
    return Pairs(c, x, last, weights, kind)


def _ids(model, words) -> list[int]:
    tok = model.tokenizer
    ids = tok.convert_tokens_to_ids(list(words))
    if tok.unk_token_id is not None and tok.unk_token_id in ids:
        bad = [w for w, i in zip(words, ids) if i == tok.unk_token_id]
        raise PromptError(
            f"words {bad[:3]} of the bundled tasks are not in this model's vocabulary; the tasks are "
            "written in the bundled model's words: run them on it (--model default)."
        )
    return [tok.bos_token_id, *ids]


def check_pairs(pairs) -> None:
    """`OptionError` unless `pairs` is a `Pairs` (the circuit methods' first read of it)."""
    if not isinstance(pairs, Pairs):
        raise OptionError(
            f"pairs is a {type(pairs).__name__}, not Pairs; make them with task_pairs(model, examples) or "
            "task_data(model, task, n), or Pairs(clean, corrupt, last, weights)."
        )


def task_pairs(model: HookedTransformer, examples) -> Pairs:
    """`Pairs` for IOI (logit difference IO - S) or greater-than (probability difference) examples."""
    from attrgraph.bundled.tasks import Example

    if isinstance(examples, str) or not examples or not all(isinstance(e, Example) for e in examples):
        raise OptionError(
            f"examples are {type(examples).__name__} {str(examples)[:60]!r}, not the bundled tasks' examples; "
            "pass a non-empty list such as attrgraph.bundled.tasks.ioi_pairs(n) or greater_than_pairs(n)."
        )
    task = examples[0].task
    clean, corrupt = [], []
    weights = torch.zeros(len(examples), model.cfg.d_vocab, device="cpu")
    for i, ex in enumerate(examples):
        end = ex.graded[0]
        clean.append(_ids(model, ex.tokens[:end]))
        corrupt.append(_ids(model, ex.corrupt[:end]))
        if task == "ioi":
            io, s = _ids(model, [ex.meta["io"], ex.meta["s"]])[1:]
            weights[i, io], weights[i, s] = 1.0, -1.0
        elif task == "greater_than":
            years = _ids(model, [f"{n:02d}" for n in range(100)])[1:]
            for n, tid in enumerate(years):
                weights[i, tid] = 1.0 if n > ex.meta["yy"] else -1.0
        else:
            raise OptionError(f"task {task!r} has no circuit metric; use 'ioi' or 'greater_than' examples.")
    return make_pairs(clean, corrupt, weights, "logit" if task == "ioi" else "prob")

"""`attrgraph predict PROMPT`: the model's top next-token predictions (a quick look at a model)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

import torch

from attrgraph.cli import add_prompt_options

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer


@torch.no_grad()
def top_predictions(
    model: HookedTransformer, prompt: str, k: int = 5, *, strict: bool = False, truncate: bool = False
) -> list[tuple[str, float]]:
    """The `k` most likely next tokens after `prompt` (all of them if the vocabulary is smaller), with
    their probabilities. The prompt is checked as `sources.to_tokens` checks it (`strict`,
    `truncate` as there)."""
    from attrgraph.engine.sources import to_tokens

    tokens = to_tokens(model, prompt, strict=strict, truncate=truncate)
    probs = model(tokens[None])[0, -1].softmax(-1)
    top = probs.topk(min(k, probs.numel()))
    return [(model.tokenizer.decode([i]), p) for i, p in zip(top.indices.tolist(), top.values.tolist())]


def _positive_int(text: str) -> int:
    if not text.lstrip("+").isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of 1 or more")
    return int(text)


def add_parser(sub) -> None:
    p = sub.add_parser("predict", help="print a model's top next-token predictions")
    p.add_argument("prompt")
    p.add_argument("--model", default="default", help="'default', a model folder, or a TransformerLens name")
    p.add_argument("-k", type=_positive_int, default=5, help="how many tokens to print (default 5)")
    add_prompt_options(p)


def run(args) -> int:
    from attrgraph.bundled.loading import load_model
    from attrgraph.engine.sources import check_prompt_text

    check_prompt_text(args.prompt)  # before loading anything
    model = load_model(args.model)
    for tok, p in top_predictions(model, args.prompt, args.k, strict=args.strict, truncate=args.truncate):
        print(f"{p:7.3f}  {tok!r}")
    return 0

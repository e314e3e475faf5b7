"""`attrgraph predict PROMPT`: the model's top next-token predictions (a quick look at a model)."""

from __future__ import annotations

import argparse

import torch

from attrgraph.errors import PromptError


@torch.no_grad()
def top_predictions(model, prompt: str, k: int = 5) -> list[tuple[str, float]]:
    """The `k` most likely next tokens after `prompt` (all of them if the vocabulary is smaller), with
    their probabilities."""
    tokens = model.to_tokens(prompt, truncate=False)  # TransformerLens would cut it to n_ctx silently
    if tokens.shape[1] <= 1:
        raise PromptError("prompt has 0 tokens; pass at least one word.")
    if tokens.shape[1] > model.cfg.n_ctx:
        raise PromptError(
            f"prompt has {tokens.shape[1]} tokens but the model's n_ctx is {model.cfg.n_ctx}; shorten it."
        )
    probs = model(tokens)[0, -1].softmax(-1)
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


def run(args) -> int:
    from attrgraph.loading import load_model

    model = load_model(args.model)
    for tok, p in top_predictions(model, args.prompt, args.k):
        print(f"{p:7.3f}  {tok!r}")
    return 0

"""`attrgraph predict PROMPT`: the model's top next-token predictions (a quick look at a model)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from attrgraph.errors import PromptError

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer


@torch.no_grad()
def top_predictions(model: HookedTransformer, prompt: str, k: int = 5) -> list[tuple[str, float]]:
    """The `k` most likely next tokens after `prompt`, with their probabilities."""
    tokens = model.to_tokens(prompt)
    if tokens.shape[1] <= 1:
        raise PromptError("prompt has 0 tokens; pass at least one word.")
    if tokens.shape[1] > model.cfg.n_ctx:
        raise PromptError(
            f"prompt has {tokens.shape[1]} tokens but the model's n_ctx is {model.cfg.n_ctx}; shorten it."
        )
    probs = model(tokens)[0, -1].softmax(-1)
    top = probs.topk(k)
    return [(model.tokenizer.decode([i]), p) for i, p in zip(top.indices.tolist(), top.values.tolist())]


def add_parser(sub) -> None:
    p = sub.add_parser("predict", help="print a model's top next-token predictions")
    p.add_argument("prompt")
    p.add_argument("--model", default="default", help="'default', a model folder, or a TransformerLens name")
    p.add_argument("-k", type=int, default=5)


def run(args) -> int:
    from attrgraph.bundled.loading import load_model

    model = load_model(args.model)
    for tok, p in top_predictions(model, args.prompt, args.k):
        print(f"{p:7.3f}  {tok!r}")
    return 0

"""Attribution targets that are not features: logits, logit differences, any direction anywhere.

Seed: circuit-tracing appendix, "Attribution Graph Computation" and "Graph Pruning".

1. Logit targets: the input vector of the node for token `tok` is the gradient of
   `logit_tok - mean(logits)` at the last position, i.e. `e_tok - 1/d_vocab` on the logits.
2. Which tokens: sort the last position's probabilities in descending order and take the
   smallest top-K whose cumulative probability reaches `desired_logit_prob` (0.95), with K
   clamped to `max_n_logits` (10). Each logit node's pruning weight is its probability.
3. Custom targets: a logit difference `logit_a - logit_b` (vector `e_a - e_b`), or any vector `v`
   read at any TransformerLens hook and position (`v . hook_value[pos]`); weight 1 / n_targets
   unless given. They become "logit" nodes of the graph (the last kind in the node order).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float
from torch import Tensor

from attrgraph.bundled.loading import check_model
from attrgraph.engine.precision import compute_dtype
from attrgraph.errors import TargetError
from transcoders.arguments import is_numbers, shown
from transcoders.block_layout import hook_layer
from transcoders.config import is_real, is_whole

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

MAX_N_LOGITS = 10
"""Step 2's default clamp on the number of logit targets (the appendix's K <= 10)."""
DESIRED_LOGIT_PROB = 0.95
"""Step 2's default probability the logit targets cover (the appendix's 0.95)."""


@dataclass(frozen=True)
class Target:
    """One output node: a direction read at one site and position."""

    name: str
    """Label (the token's string for a logit)."""
    vector: Tensor
    """Input vector: [d_vocab] on the logits when `hook` is None, else [d_model] at `hook`."""
    position: int = -1
    """Position read; negative counts from the end."""
    hook: str | None = None
    """TransformerLens hook name the direction reads; None means the logits."""
    token: int = -1
    """Output token of a logit node, else -1."""
    weight: float = math.nan
    """Pruning weight (the probability of a logit node); NaN means 1 / number of targets."""

    def layer(self, n_layers: int) -> int:
        """The node's layer: `n_layers` for logits, else the block number in the hook name."""
        return n_layers if self.hook is None else hook_layer(self.hook, n_layers)


def select_logit_targets(
    logits: Float[Tensor, " d_vocab"],
    max_n_logits: int = MAX_N_LOGITS,
    desired_logit_prob: float = DESIRED_LOGIT_PROB,
    tokenizer=None,
) -> list[Target]:
    """Demeaned-logit targets for the smallest top-K past `desired_logit_prob`, K <= `max_n_logits`."""
    if not is_whole(max_n_logits) or max_n_logits < 1:
        raise TargetError(f"max_n_logits is {max_n_logits!r}; pass a whole number, at least 1.")
    if not is_real(desired_logit_prob) or not 0.0 < desired_logit_prob <= 1.0:
        raise TargetError(f"desired_logit_prob is {shown(desired_logit_prob)}; pass a probability in (0, 1].")
    probs = torch.softmax(logits.double(), dim=-1)
    top_p, top_i = probs.topk(min(max_n_logits, probs.numel()))
    k = min(
        int(
            torch.searchsorted(
                top_p.cumsum(0), torch.tensor(desired_logit_prob, dtype=top_p.dtype, device=top_p.device)
            )
        )
        + 1,
        len(top_p),
    )
    d_vocab = logits.shape[-1]
    out = []
    for p, i in zip(top_p[:k].tolist(), top_i[:k].tolist()):
        # at least float32: -1/d_vocab is not exact in a half-precision model's dtype
        vec = torch.full((d_vocab,), -1.0 / d_vocab, dtype=compute_dtype(logits.dtype), device=logits.device)
        vec[i] += 1.0
        out.append(Target(name=token_str(tokenizer, i), vector=vec, token=i, weight=p))
    return out


def logit_target(model: HookedTransformer, token: str | int, position: int = -1) -> Target:
    """Target the demeaned logit of one token (e.g. " Mary") at `position`, as the default logit nodes."""
    i = _token_id(model, token)
    d_vocab = model.cfg.d_vocab_out
    vec = torch.full(
        (d_vocab,), -1.0 / d_vocab, dtype=compute_dtype(model.cfg.dtype), device=model.cfg.device
    )
    vec[i] += 1.0
    return Target(
        name=token_str(getattr(model, "tokenizer", None), i), vector=vec, position=position, token=i
    )


def logit_difference(
    model: HookedTransformer, token_a: str | int, token_b: str | int, position: int = -1
) -> Target:
    """Target `logit_a - logit_b` at `position` (e.g. " Mary" minus " John")."""
    a, b = _token_id(model, token_a), _token_id(model, token_b)
    if a == b:
        raise TargetError(
            f"logit_difference of {token_a!r} and {token_b!r} (both token {a}) is 0 whatever the input; "
            "pass two different tokens."
        )
    vec = torch.zeros(model.cfg.d_vocab_out, dtype=model.cfg.dtype, device=model.cfg.device)
    vec[a] += 1.0
    vec[b] -= 1.0
    tok = getattr(model, "tokenizer", None)
    return Target(name=f"{token_str(tok, a)} - {token_str(tok, b)}", vector=vec, position=position, token=a)


def direction(
    hook: str, position: int, vector: Tensor, name: str | None = None, weight: float = math.nan
) -> Target:
    """Target `vector . value_of(hook)[position]` for any TransformerLens hook of the residual width."""
    if not isinstance(vector, Tensor) and not is_numbers(vector):
        raise TargetError(
            f"vector is a {type(vector).__name__} ({shown(vector)}); pass a tensor (or array) of the hook's width."
        )
    return Target(
        name=name or f"{hook}@{position}",
        vector=vector
        if isinstance(vector, Tensor)
        else torch.as_tensor(vector, device="cpu"),  # a tensor keeps its device
        position=position,
        hook=hook,
        weight=weight,
    )


def check_targets(targets: list[Target], model: HookedTransformer, n_pos: int) -> None:
    """Raise `TargetError` for an entry that is not a Target (a bare word or id), an unknown hook, a
    logit token outside the vocabulary, a wrong vector size or a position outside the prompt."""
    if isinstance(targets, Target) or not isinstance(targets, list | tuple):
        raise TargetError(
            f"targets is a {type(targets).__name__} ({shown(targets)}); pass a list of Target "
            "(logit_target(model, ' Mary'), logit_difference(...), direction(...)), or None for the logits."
        )
    if not targets:
        raise TargetError("no targets were given; pass at least one Target or leave targets=None for logits.")
    for t in targets:
        if not isinstance(t, Target):
            raise TargetError(
                f"target {t!r} is a {type(t).__name__}, not a Target; make it with logit_target(model, {t!r})."
            )
        if t.hook is None and not -1 <= t.token < model.cfg.d_vocab_out:
            raise TargetError(
                f"target {t.name!r} names token id {t.token}, outside this model's vocabulary "
                f"[0, {model.cfg.d_vocab_out}); pass an id inside it."
            )
        if not -n_pos <= t.position < n_pos:
            raise TargetError(
                f"target {t.name!r} reads position {t.position} of a {n_pos}-token prompt; pick one inside it."
            )
        if t.hook is None:
            size = model.cfg.d_vocab_out
        else:
            if t.hook not in model.hook_dict:
                raise TargetError(
                    f"target {t.name!r} reads hook {t.hook!r}, which this model lacks; use a name from model.hook_dict."
                )
            size = model.cfg.d_model
        if t.vector.shape != (size,):
            raise TargetError(
                f"target {t.name!r} has a vector of shape {tuple(t.vector.shape)}; it must be ({size},)."
            )
        if not bool(torch.isfinite(t.vector).all()):
            raise TargetError(f"target {t.name!r} has NaN or inf in its vector; pass a finite direction.")
        if not bool(t.vector.any()):
            raise TargetError(
                f"target {t.name!r} has a vector of zeros, so every edge into it would be 0; pass a "
                "nonzero direction."
            )


def _token_id(model, token: str | int) -> int:
    """The vocabulary id of `token`: an int id inside the output vocabulary, or a string that is one
    known token. A bool, an id outside [0, d_vocab_out) and a word the tokenizer maps to its unknown
    token (which would otherwise become a graph of the `<unk>` logit) are `TargetError`s."""
    check_model(model)
    d_vocab = int(model.cfg.d_vocab_out)
    if isinstance(token, bool) or not isinstance(token, str | numbers.Integral):
        raise TargetError(
            f"target token {token!r} is a {type(token).__name__}; pass a token string such as ' Mary' or an int id."
        )
    if isinstance(token, numbers.Integral):
        if not 0 <= int(token) < d_vocab:
            raise TargetError(
                f"target token id {int(token)} is outside this model's vocabulary [0, {d_vocab}); pass an id inside it."
            )
        return int(token)
    try:
        i = int(model.to_single_token(token))
    except Exception as e:  # TL raises AssertionError for multi-token strings
        raise TargetError(
            f"{token!r} is not a single token of this model's tokenizer ({e}); pass a token id."
        ) from None
    tokenizer = getattr(model, "tokenizer", None)
    unk_id = getattr(tokenizer, "unk_token_id", None)
    if unk_id is not None and i == unk_id and token.strip() != str(tokenizer.unk_token):
        raise TargetError(
            f"target word {token!r} is not in this model's vocabulary (it becomes {tokenizer.unk_token!r}); "
            "pick a word the tokenizer knows."
        )
    return i


def token_str(tokenizer, i: int) -> str:
    if tokenizer is None:
        return str(i)
    try:
        return tokenizer.decode([i])
    except Exception:
        return str(i)

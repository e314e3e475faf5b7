"""Circuit faithfulness: ablate every edge outside the circuit (PEAP seed sec. 3.2; HAP seed sec. 4.2).

1. Run the clean prompts with every edge outside the circuit patched to its
   corrupted value (patching.py, keep = circuit). A circuit of every edge is the
   clean model exactly; the empty circuit is the corrupted model exactly.
2. Soft faithfulness F_S = M(C) / M(model) (means over examples, as the seed);
   the normalized form (M(C) - M(corrupt)) / (M(model) - M(corrupt)) beside it.
3. Hard faithfulness F_H = mean over examples of 1{argmax of the circuit's logits
   = argmax of the model's} at the scored position.
4. KL(model || circuit) of the next-token distributions at the scored position,
   and the circuit's mean logit difference (the metric, for a logit metric).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch

from attrgraph.bundled.loading import check_model
from attrgraph.circuits.circuit import Circuit
from attrgraph.circuits.graph import ComponentGraph
from attrgraph.circuits.pairs import Pairs, check_pairs, last_logits, metric
from attrgraph.circuits.patching import record_run, run_edges
from attrgraph.circuits.schema import check_schema
from attrgraph.errors import OptionError
from transcoders.arguments import shown
from transcoders.config import is_whole

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer


class Faithfulness(NamedTuple):
    """How well a circuit reproduces the model on a set of pairs."""

    soft: float
    """F_S = M(circuit) / M(model)."""
    normalized: float
    """(M(circuit) - M(corrupt)) / (M(model) - M(corrupt))."""
    hard: float
    """Fraction of examples where circuit and model agree on the top next token."""
    kl: float
    """Mean KL(model || circuit) at the scored position."""
    metric_circuit: float
    """Mean M with the circuit (the logit difference, for a logit metric)."""
    metric_model: float
    """Mean M of the full model on the clean prompts."""
    metric_corrupt: float
    """Mean M of the model on the corrupted prompts."""
    n_edges: int
    """Edges in the circuit."""


def check_fits(circuit: Circuit, model: HookedTransformer) -> None:
    """Refuse a circuit found on a model of another component graph: its masks would be cut to this
    model's edges without a word, patching edges it never held."""
    ours, theirs = ComponentGraph.from_model(model), circuit.layout.graph
    if ours != theirs:
        say = lambda g: (  # noqa: E731
            f"{g.n_layers} layers, {g.n_heads} heads, {'MLPs' if g.has_mlp else 'no MLPs'}"
            + (", parallel blocks" if g.parallel else "")
        )
        raise OptionError(
            f"the circuit is one of a model with {say(theirs)}, and this model has {say(ours)}; evaluate it "
            "on the model it was found on."
        )


def check_circuit_options(circuit, schema, batch_size) -> None:
    """`OptionError` in one line for a circuit that is no `Circuit`, a schema that is no `Schema`
    or a batch size that is no whole number >= 1."""
    if not isinstance(circuit, Circuit):
        raise OptionError(
            f"circuit is a {type(circuit).__name__} ({shown(circuit)}), not a Circuit; pass what greedy, "
            "prune_edges or hap returns."
        )
    check_schema(schema)
    if not is_whole(batch_size) or batch_size < 1:
        raise OptionError(f"batch_size is {shown(batch_size)}; pass a whole number, at least 1.")


@torch.no_grad()
def circuit_logits(
    model: HookedTransformer, pairs: Pairs, circuit: Circuit, schema=None, corrupt=None, batch_size: int = 64
):
    """Next-token logits at each example's scored position with everything outside `circuit` ablated."""
    check_fits(circuit, model)
    pairs = pairs.to(next(model.parameters()).device)
    out = []
    for i in range(0, len(pairs), batch_size):
        p = pairs[i : i + batch_size]
        corr = corrupt if corrupt is not None else record_run(model, p.corrupt)
        span_index = None if schema is None else schema.span_index[i : i + batch_size, : p.clean.shape[1]]
        keep, attn_keep = circuit.keep_masks(span_index)
        run = run_edges(model, p.clean, corrupt=corr, keep=keep, attn_keep=attn_keep)
        out.append(last_logits(run.logits, p.last))
    return torch.cat(out)


@torch.no_grad()
def evaluate(
    model: HookedTransformer, pairs: Pairs, circuit: Circuit, schema=None, batch_size: int = 64
) -> Faithfulness:
    """Faithfulness of `circuit` on `pairs` (module docstring). Positional circuits over spans need `schema`."""
    check_model(model)
    check_pairs(pairs)
    check_circuit_options(circuit, schema, batch_size)
    pairs = pairs.to(next(model.parameters()).device)
    full, corr_logits = [], []
    for i in range(0, len(pairs), batch_size):
        p = pairs[i : i + batch_size]
        full.append(last_logits(model(p.clean), p.last))
        corr_logits.append(last_logits(model(p.corrupt), p.last))
    full, corr_logits = torch.cat(full), torch.cat(corr_logits)
    circ = circuit_logits(model, pairs, circuit, schema, batch_size=batch_size)
    m_c, m_m, m_x = (metric(x, pairs).mean().item() for x in (circ, full, corr_logits))
    logp, logq = full.log_softmax(-1), circ.log_softmax(-1)
    kl = (logp.exp() * (logp - logq)).sum(-1).mean().item()
    hard = (circ.argmax(-1) == full.argmax(-1)).float().mean().item()
    return Faithfulness(
        soft=m_c / m_m if m_m != 0 else float("nan"),
        normalized=(m_c - m_x) / (m_m - m_x) if m_m != m_x else float("nan"),
        hard=hard,
        kl=kl,
        metric_circuit=m_c,
        metric_model=m_m,
        metric_corrupt=m_x,
        n_edges=circuit.n_edges,
    )

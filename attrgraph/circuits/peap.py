"""Position-aware edge attribution patching, PEAP (Haklay et al., 2025: seeds/peap-method.tex.txt).

1. Residual edges keep their position: score[t, u, d] = (z*_u,t - z_u,t) . grad_{d,t} M
   (eap.py, before the sum over t).
2. Cross-position attention edges (eqs. 3-6): attention_edges.py.
3. Aggregation over examples: by position when the data are fully aligned (one
   template, same length), else by dataset schema spans (schema.py: avg, sum or
   max-abs within a span, then the mean over examples).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from attrgraph.circuits.circuit import EdgeLayout, EdgeScores
from attrgraph.circuits.eap import ExampleScores, example_scores
from attrgraph.circuits.graph import ComponentGraph
from attrgraph.circuits.pairs import Pairs, check_pairs
from attrgraph.circuits.schema import AGGREGATIONS, aggregate, check_schema
from attrgraph.errors import OptionError, SchemaError

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer


def peap(
    model: HookedTransformer,
    pairs: Pairs,
    schema=None,
    aggregation: str = "avg",
    ig_steps: int = 0,
    batch_size: int = 32,
    example: ExampleScores | None = None,
) -> EdgeScores:
    """Positional edge scores: per token position for aligned data, per schema span otherwise.

    schema: a `schema.Schema` whose spans align the examples; required when prompt lengths differ.
    aggregation: how positions within one span combine ("avg", "sum" or "maxabs").
    example: precomputed `example_scores(..., cross_position=True)`, to aggregate several ways.
    """
    if aggregation not in AGGREGATIONS:  # before the scores, not after (without a schema it is unused)
        raise OptionError(f"aggregation {aggregation!r} is unknown; use one of {AGGREGATIONS}.")
    graph = ComponentGraph.from_model(model)
    check_pairs(pairs)
    check_schema(schema)
    if schema is None and not bool((pairs.last == pairs.last[0]).all()):
        raise SchemaError(
            "the prompts differ in length, so positions do not align across examples; "
            "pass a schema (attrgraph.circuits.schema) naming spans in each example."
        )
    ex = example or example_scores(
        model, pairs, ig_steps=ig_steps, cross_position=True, batch_size=batch_size
    )
    if schema is None:
        T = int(pairs.last[0]) + 1
        positions = tuple(f"t{t}" for t in range(T))
        layout = EdgeLayout(graph, positions, torch.ones(T, T, dtype=torch.bool, device="cpu").tril())
        return EdgeScores(layout, ex.resid[:, :T].mean(0), ex.attn[..., :T, :T].mean(0), "peap")
    resid, attn, attn_valid = aggregate(ex, schema, aggregation)
    layout = EdgeLayout(graph, schema.spans, attn_valid)
    return EdgeScores(layout, resid, attn, f"peap-{aggregation}")

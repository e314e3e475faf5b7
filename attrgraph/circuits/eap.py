"""Edge attribution patching, EAP and EAP-IG (Syed et al., 2023; Hanna et al., 2024; PEAP seed eq. 1).

For an edge e = (u, d), patching u's contribution to d's input from clean to
corrupted changes the metric by g(e) = M(x | e = e_x') - M(x). EAP takes the
first-order term:

1. Run the corrupted prompts; record every upstream output z*_u (patching.py).
2. Run the clean prompts; record z_u and take the gradient of M at every
   downstream input, grad_d M (one backward for all edges).
3. Per example and position t:  score[t, u, d] = (z*_u,t - z_u,t) . grad_{d,t} M.
   Summed over t this is exactly d/d(eps) M at eps = 0 when edge (u, d) is moved
   eps of the way toward corrupted (tests check it by finite differences).
4. EAP-IG (`ig_steps = m > 0`): average grad_d M over m runs whose input node is
   z*_in + (k/m)(z_in - z*_in), k = 1..m (Hanna et al., 2024, "EAP-IG-inputs").
5. Non-positional scores: sum over positions, mean over examples. Positional
   scores (peap.py) keep t and add the cross-position attention edges.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch
from jaxtyping import Float
from torch import Tensor

from attrgraph.circuits.attention_edges import attention_edge_scores
from attrgraph.circuits.circuit import EdgeLayout, EdgeScores
from attrgraph.circuits.graph import ComponentGraph
from attrgraph.circuits.pairs import Pairs, check_pairs, last_logits, metric
from attrgraph.circuits.patching import input_grads, record_run, run_edges
from attrgraph.errors import ConstantMetricError, OptionError
from transcoders.config import is_whole
from transcoders.model_state import check_differentiable, grad_mode

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer


class ExampleScores(NamedTuple):
    """Per-example, per-position edge scores, before aggregation."""

    resid: Float[Tensor, "batch pos n_up n_down"]
    """Residual edges (u at t -> d at t)."""
    attn: Float[Tensor, "batch n_layers n_heads 3 pos pos"] | None
    """Cross-position q/k/v edges (query t, key t'); None unless asked for."""
    metric_clean: Float[Tensor, " batch"]
    """M on the clean prompts."""
    metric_corrupt: Float[Tensor, " batch"]
    """M on the corrupted prompts."""


def _to_host(x: Tensor | None) -> Tensor | None:
    """Scores leave the model's device once per batch, at float32 at least (they are summed over
    examples, and numpy has no bfloat16)."""
    return None if x is None else x.detach().to(torch.promote_types(x.dtype, torch.float32)).cpu()


@grad_mode()  # inside a caller's torch.no_grad() or torch.inference_mode() too
def example_scores(
    model: HookedTransformer,
    pairs: Pairs,
    ig_steps: int = 0,
    cross_position: bool = False,
    batch_size: int = 32,
) -> ExampleScores:
    """EAP (or EAP-IG) scores of every edge, per example and position (module docstring)."""
    if not (is_whole(ig_steps) and is_whole(batch_size)) or ig_steps < 0 or batch_size < 1:
        raise OptionError(
            f"ig_steps is {ig_steps} and batch_size {batch_size}; pass ig_steps >= 0 (0: plain EAP) and "
            "batch_size >= 1."
        )
    graph = ComponentGraph.from_model(model)
    check_pairs(pairs)
    check_differentiable({"the model": model}, "EAP")
    device = next(model.parameters()).device
    pairs = pairs.to(device)  # the pairs go to the model's device once; the scores come back once per batch
    valid = graph.valid.to(device)
    parts: list[ExampleScores] = []
    for i in range(0, len(pairs), batch_size):
        p = pairs[i : i + batch_size]
        corr = record_run(model, p.corrupt)
        m_corr = metric(last_logits(corr.logits, p.last), p).detach()
        alphas = [k / ig_steps for k in range(1, ig_steps + 1)] if ig_steps else [None]
        g_in = g_res = clean = m_clean = None
        for alpha in alphas:
            run = run_edges(model, p.clean, corrupt=corr, input_alpha=alpha, record=alpha in (None, 1.0))
            m = metric(last_logits(run.logits, p.last), p)
            gi, gr = input_grads(run, m, with_results=cross_position)
            g_in = gi if g_in is None else g_in + gi
            g_res = gr if g_res is None else (g_res + gr if gr is not None else None)
            if run.acts is not None:
                clean, m_clean = run.acts, m.detach()
        g_in = g_in / len(alphas)
        delta = corr.z - clean.z  # [b t u dm]
        resid = torch.einsum("btum,btvm->btuv", delta, g_in) * valid
        attn = None
        if cross_position:
            W_O = torch.stack([b.attn.W_O for b in model.blocks]).detach()
            scale = torch.tensor([float(b.attn.attn_scale) for b in model.blocks], device=W_O.device)
            attn = attention_edge_scores(clean, corr, g_res / len(alphas), W_O, scale)
        parts.append(ExampleScores(*(_to_host(x) for x in (resid, attn, m_clean, m_corr))))
    out = ExampleScores(
        *(None if parts[0][j] is None else torch.cat([q[j] for q in parts]) for j in range(4))
    )
    if bool((out.metric_clean == out.metric_corrupt).all()):
        raise ConstantMetricError(
            "the metric is identical on every clean prompt and its corrupted pair, so no edge can change it; "
            "check that the corrupted prompts differ where the answer depends on them."
        )
    return out


def eap(model: HookedTransformer, pairs: Pairs, ig_steps: int = 0, batch_size: int = 32) -> EdgeScores:
    """Non-positional EAP (EAP-IG when `ig_steps > 0`) scores, `[n_up, n_down]`, mean over examples."""
    ex = example_scores(model, pairs, ig_steps=ig_steps, batch_size=batch_size)
    graph = ComponentGraph.from_model(model)
    return EdgeScores(EdgeLayout(graph), ex.resid.sum(1).mean(0), None, "eap-ig" if ig_steps else "eap")

"""Position-aware edge attribution patching, PEAP (Haklay et al., 2025: seeds/peap-method.tex.txt).

1. Residual edges keep their position: score[t, u, d] = (z*_u,t - z_u,t) . grad_{d,t} M
   (eap.py, before the sum over t).
2. Cross-position attention edges (eqs. 3-6). For head h at query t and key t' <= t,
   with clean q, k, v, the head's clean output z_t = W_O sum_s A[t, s] v_s and
   g_t = grad of M at z_t (`hook_result`), each edge's score is
       (z*_t - z_t) . g_t,                                        (eq. 3)
   where z*_t recomputes the head's output at t with one thing corrupted:
       v:  v_t' -> v*_t'                      (eq. 4; linear: A[t,t'] (v*_t' - v_t') . W_O g_t)
       k:  score q_t . k_t' -> q_t . k*_t'      (eq. 5; the row's softmax is recomputed)
       q:  score q_t . k_t' -> q*_t . k_t'      (eq. 6; q patched only against key t')
   Corrupted q*, k*, v* come from the corrupted run. With u[t, s] = v_s . W_O g_t the
   k and q scores are softmax(S')[t, :] . u[t, :] - softmax(S)[t, :] . u[t, :], computed
   for every t' at once on a `[t, t', s]` grid.
3. Aggregation over examples: by position when the data are fully aligned (one
   template, same length), else by dataset schema spans (schema.py: avg, sum or
   max-abs within a span, then the mean over examples).
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from attrgraph.circuits.circuit import EdgeLayout, EdgeScores
from attrgraph.circuits.eap import ExampleScores, example_scores
from attrgraph.circuits.errors import SchemaError
from attrgraph.circuits.graph import ComponentGraph
from attrgraph.circuits.pairs import Pairs
from attrgraph.circuits.patching import Activations

GRID_ELEMENTS = 1 << 24  # bound on the [b h t t' s] softmax grid held at once


def _replaced_row_output(
    S: Tensor, X: Tensor, u: Tensor, causal: Tensor
) -> Float[Tensor, "batch n_heads pos pos"]:
    """For every (t, t'): softmax of row t of S with entry t' replaced by X[t, t'], dotted with u[t]."""
    T = S.shape[-1]
    eye = torch.eye(T, dtype=torch.bool, device=S.device)
    grid = torch.where(eye, X[..., :, :, None], S[..., :, None, :])  # [b h t t' s]
    grid = grid.masked_fill(~causal[:, None, :], float("-inf"))
    return (grid.softmax(-1) * u[..., :, None, :]).sum(-1)


def attention_edge_scores(
    clean: Activations,
    corrupt: Activations,
    g_result: Float[Tensor, "batch pos n_layers n_heads d_model"],
    W_O: Float[Tensor, "n_layers n_heads d_head d_model"],
    attn_scale: Float[Tensor, " n_layers"],
) -> Float[Tensor, "batch n_layers n_heads 3 pos pos"]:
    """PEAP scores of the cross-position q/k/v edges (module docstring, step 2)."""
    B, T, L, H, _ = clean.q.shape
    causal = torch.ones(T, T, dtype=torch.bool, device=clean.q.device).tril()
    out = torch.zeros(B, L, H, 3, T, T, dtype=g_result.dtype, device=g_result.device)
    chunk = max(1, GRID_ELEMENTS // (H * T**3))
    dot = lambda a, b: torch.einsum("bthd,bshd->bhts", a, b)  # noqa: E731
    for layer in range(L):
        og = torch.einsum("bthm,hdm->bthd", g_result[:, :, layer], W_O[layer])
        q, k, v = clean.q[:, :, layer], clean.k[:, :, layer], clean.v[:, :, layer]
        qc, kc, vc = corrupt.q[:, :, layer], corrupt.k[:, :, layer], corrupt.v[:, :, layer]
        scale = attn_scale[layer]
        u, uc = dot(og, v), dot(og, vc)  # u[b h t s] = v_s . W_O g_t
        S = (dot(q, k) / scale).masked_fill(~causal, float("-inf"))
        A = S.softmax(-1)
        y = (A * u).sum(-1, keepdim=True)
        out[:, layer, :, 2] = A * (uc - u)
        for slot, X in ((0, dot(qc, k) / scale), (1, dot(q, kc) / scale)):
            for i in range(0, B, chunk):
                sl = slice(i, i + chunk)
                new = _replaced_row_output(S[sl], X[sl], u[sl], causal)
                out[sl, layer, :, slot] = (new - y[sl]).masked_fill(~causal, 0.0)
    return out


def peap(
    model,
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
    from attrgraph.circuits.schema import aggregate

    graph = ComponentGraph.from_model(model)
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
        layout = EdgeLayout(graph, positions, torch.ones(T, T, dtype=torch.bool).tril())
        return EdgeScores(layout, ex.resid[:, :T].mean(0), ex.attn[..., :T, :T].mean(0), "peap")
    resid, attn, attn_valid = aggregate(ex, schema, aggregation)
    layout = EdgeLayout(graph, schema.spans, attn_valid)
    return EdgeScores(layout, resid, attn, f"peap-{aggregation}")

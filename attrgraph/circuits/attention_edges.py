"""Scores of the cross-position attention edges of position-aware EAP (Haklay et al., 2025:
seeds/peap-method.tex.txt, eqs. 3-6), used by PEAP and by EAP with `cross_position=True`.

For head h at query t and key t' <= t,
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
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

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

"""The sparse training step of TopK per-layer sets (PLT, SAE): only the k active features per token.

TopK keeps k of d_sae features per token and layer, yet the dense step (base.py `forward`,
losses.py `topk_aux_loss`) multiplies and differentiates full [batch, n_layers, d_sae] matrices
through the decoder twice (main and AuxK) and through the encoder's backward. This step computes
the same loss and the same gradients (up to float rounding) from the selected features alone:

1. Encode densely, without autograd (one batched product over layers): `h = x @ W_enc + b_enc`.
2. Select, without autograd: the top k of `h` per token and layer (TopK's `a = ReLU` of them),
   and for AuxK the top `k_aux` of `h` among the dead features, searched over the dead columns
   only (a [batch, n_layers, n_dead] gather instead of a second top-k over all d_sae).
3. `gather_preacts`: the selected `h` again, now differentiable. Its backward adds
   `grad * x` into the selected columns of `W_enc` (and `grad` into `b_enc`): `rows_grad`, one
   sparse (CSR) times dense product, never a dense [batch, d_sae] one.
4. `decode_sparse`: `sum_j a_j W_dec[l, i_j] + b_dec[l]` by `embedding_bag` with per-sample
   weights; backward: the acts' gradient by embedding_bag, `W_dec`'s by `rows_grad` (both touch
   the selected decoder rows only).
5. Losses as in losses.py: `mse_loss(out, y)` and AuxK's
   `||aux_out - r||^2 / ||r||^2` with `r = y - out` detached, `aux_out` the decode of step 2's dead
   selection without `b_dec`; entries of a layer with fewer dead features than selected add 0.

`TopKStep` is an `nn.Module` (so DistributedDataParallel can wrap it) around the set it trains.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor, nn

if TYPE_CHECKING:
    from transcoders.base import SparseCoder


def supports(kind: str, activation: str) -> bool:
    """Sets this step trains: per-layer decoders (PLT, SAE) with per-token TopK."""
    return kind in ("plt", "sae") and activation == "topk"


def flat_rows(idx: Int[Tensor, "batch n_layers m"], d_sae: int) -> Int[Tensor, "batch n_layers m"]:
    """Feature `idx` of layer l as row `l * d_sae + idx` of a [n_layers * d_sae, ...] matrix."""
    return idx + torch.arange(idx.shape[1], device=idx.device)[:, None] * d_sae


def rows_grad(
    rows: Int[Tensor, "bags m"],
    weights: Float[Tensor, "bags m"],
    grad_out: Float[Tensor, "bags D"],
    n_rows: int,
) -> Float[Tensor, "n_rows D"]:
    """`G[r] = sum_{b, j: rows[b, j] = r} weights[b, j] * grad_out[b]`: the weight gradient of
    `embedding_bag(rows, W, per_sample_weights=weights, mode="sum")` given `grad_out`, as one
    sparse [n_rows, bags] (CSR, entries sorted by row) times dense [bags, D] product."""
    flat = rows.reshape(-1)
    order = torch.argsort(flat, stable=True)  # entry e = b * m + j sits in bag e // m
    crow = torch.zeros(n_rows + 1, dtype=torch.long, device=rows.device)
    crow[1:] = torch.bincount(flat, minlength=n_rows).cumsum(0)
    bags = torch.div(order, rows.shape[1], rounding_mode="floor")
    values = weights.reshape(-1).index_select(0, order)
    with warnings.catch_warnings():  # "Sparse CSR tensor support is in beta state"
        warnings.simplefilter("ignore", UserWarning)
        G = torch.sparse_csr_tensor(crow, bags, values, (n_rows, rows.shape[0]), check_invariants=False)
    return G @ grad_out


class _GatherPreacts(torch.autograd.Function):
    """Step 3: `h.gather(-1, idx)` of a precomputed `h`, differentiable in x, W_enc, b_enc."""

    @staticmethod
    def forward(ctx, x, W_enc, b_enc, h, idx):
        ctx.save_for_backward(x, W_enc, idx)
        return h.gather(-1, idx)

    @staticmethod
    def backward(ctx, grad):
        x, W_enc, idx = ctx.saved_tensors
        B, L, m = idx.shape
        D, S = W_enc.shape[1:]
        rows = flat_rows(idx, S).reshape(B * L, m)
        weights = grad.reshape(B * L, m).contiguous()
        gx = gW = gb = None
        if ctx.needs_input_grad[0]:  # sum_j grad_j * W_enc[l][:, i_j]
            W_rows = W_enc.transpose(1, 2).reshape(L * S, D)
            gx = F.embedding_bag(rows, W_rows, per_sample_weights=weights, mode="sum").view(B, L, D)
        if ctx.needs_input_grad[1]:
            G = rows_grad(rows, weights, x.reshape(B * L, D).to(grad.dtype), L * S)
            gW = G.view(L, S, D).transpose(1, 2).contiguous()
        if ctx.needs_input_grad[2]:
            gb = torch.zeros(L * S, dtype=grad.dtype, device=grad.device)
            gb = gb.index_add_(0, rows.reshape(-1), weights.reshape(-1)).view(L, S)
        return gx, gW, gb, None, None


def gather_preacts(
    x: Float[Tensor, "batch n_layers d_model"],
    W_enc: Float[Tensor, "n_layers d_model d_sae"],
    b_enc: Float[Tensor, "n_layers d_sae"],
    h: Float[Tensor, "batch n_layers d_sae"],
    idx: Int[Tensor, "batch n_layers m"],
) -> Float[Tensor, "batch n_layers m"]:
    """Step 3: `h[b, l, idx[b, l, j]]` where `h = x @ W_enc + b_enc` (given, not recomputed)."""
    return _GatherPreacts.apply(x, W_enc, b_enc, h.detach(), idx)


class _DecodeSparse(torch.autograd.Function):
    """Step 4 without `b_dec`; backward: the acts' gradient by embedding_bag, W_dec's by `rows_grad`."""

    @staticmethod
    def forward(ctx, rows, acts, W_rows):
        ctx.save_for_backward(rows, acts, W_rows)
        return F.embedding_bag(rows, W_rows, per_sample_weights=acts, mode="sum")

    @staticmethod
    def backward(ctx, grad):
        rows, acts, W_rows = ctx.saved_tensors
        ga = gW = None
        if ctx.needs_input_grad[1]:
            with torch.enable_grad():
                a = acts.detach().requires_grad_(True)
                out = F.embedding_bag(rows, W_rows.detach(), per_sample_weights=a, mode="sum")
                (ga,) = torch.autograd.grad(out, a, grad)
        if ctx.needs_input_grad[2]:
            gW = rows_grad(rows, acts, grad, W_rows.shape[0])
        return None, ga, gW


def decode_sparse(
    idx: Int[Tensor, "batch n_layers m"],
    acts: Float[Tensor, "batch n_layers m"],
    W_dec: Float[Tensor, "n_layers d_sae d_model"],
) -> Float[Tensor, "batch n_layers d_model"]:
    """Step 4 without `b_dec`: `sum_j acts[b, l, j] * W_dec[l, idx[b, l, j]]`."""
    B, L, m = idx.shape
    S, D = W_dec.shape[1:]
    rows = flat_rows(idx, S).reshape(B * L, m)
    out = _DecodeSparse.apply(rows, acts.reshape(B * L, m).contiguous(), W_dec.reshape(L * S, D))
    return out.view(B, L, D)


def dead_topk(
    h: Float[Tensor, "batch n_layers d_sae"], dead: Tensor, k_aux: int
) -> tuple[Int[Tensor, "batch n_layers m"], Tensor] | None:
    """Step 2's AuxK selection: per token and layer the `min(k_aux, max dead count)` largest `h`
    among dead features, as (indices, valid); `valid` is False where a layer has fewer dead
    features than selected. None when no feature is dead."""
    dead = dead.bool()
    counts = dead.sum(-1)
    M = int(counts.max())
    if M == 0:
        return None
    L, S = dead.shape
    cols = torch.sort((~dead).to(torch.uint8), dim=-1, stable=True).indices[:, :M]  # dead ones first
    ok = torch.arange(M, device=h.device) < counts[:, None]  # [L, M]
    sub = h.gather(-1, cols.expand(h.shape[0], L, M))
    sub = sub.masked_fill(~ok, -torch.inf)
    k = min(k_aux, M)
    if k == M:  # every dead column is selected: no search needed
        return cols.expand(h.shape[0], L, M), ok.expand(h.shape[0], L, M)
    values, j = sub.topk(k, dim=-1)
    return cols.expand(h.shape[0], L, M).gather(-1, j), values > -torch.inf


class TopKOutput(NamedTuple):
    """What `TopKStep` returns."""

    out: Float[Tensor, "batch n_layers d_model"]
    """Reconstruction: decoder output, `b_dec` and the skip term."""
    indices: Int[Tensor, "batch n_layers k"]
    """The k features kept per token and layer."""
    acts: Float[Tensor, "batch n_layers k"]
    """Their activations (ReLU of their pre-activations)."""
    aux_loss: Tensor
    """AuxK's normalized MSE (step 5), 0 when no feature is dead."""

    def fired(self, d_sae: int) -> Tensor:
        """[n_layers, d_sae] bool: features active for some token of the batch."""
        L = self.indices.shape[1]
        fired = torch.zeros(L * d_sae, dtype=torch.bool, device=self.indices.device)
        fired[flat_rows(self.indices, d_sae)[self.acts > 0]] = True
        return fired.view(L, d_sae)

    def l0(self) -> float:
        """Active features per token and layer, averaged."""
        return float((self.acts > 0).sum(-1).float().mean())


class TopKStep(nn.Module):
    """Steps 1-5 for the set `tc` (a PLT or SAE with TopK); `forward(x, y, dead)`."""

    def __init__(self, tc: SparseCoder, k_aux: int):
        super().__init__()
        if not supports(tc.cfg.kind, tc.cfg.activation):
            raise ValueError(
                f"the sparse TopK step trains PLT / SAE TopK sets, not {tc.cfg.kind} {tc.cfg.activation}"
            )
        self.tc, self.k_aux = tc, k_aux

    def forward(
        self,
        x: Float[Tensor, "batch n_layers d_model"],
        y: Float[Tensor, "batch n_layers d_model"],
        dead: Tensor | None = None,
    ) -> TopKOutput:
        tc = self.tc
        with torch.no_grad():
            h = tc.encode(x)
            idx = h.topk(tc.cfg.k, dim=-1).indices
            aux = dead_topk(h, dead, self.k_aux) if dead is not None else None
        both = idx if aux is None else torch.cat([idx, aux[0]], dim=-1)
        pre = gather_preacts(x, tc.W_enc, tc.b_enc, h, both).relu()
        k = idx.shape[-1]
        acts = pre[..., :k]
        out = decode_sparse(idx, acts, tc.W_dec) + tc.b_dec
        if tc.W_skip is not None:
            out = out + tc.skip(x)
        if aux is None:
            return TopKOutput(out, idx, acts, out.new_zeros(()))
        aux_acts = torch.where(aux[1], pre[..., k:], 0.0)
        aux_out = decode_sparse(aux[0], aux_acts, tc.W_dec)
        residual = (y - out).detach()
        aux_loss = (aux_out - residual).pow(2).sum() / residual.pow(2).sum().clamp_min(1e-12)
        return TopKOutput(out, idx, acts, aux_loss)

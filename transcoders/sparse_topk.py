"""The sparse training step of TopK per-layer sets (PLT, SAE): only the k active features per token.

TopK keeps k of d_sae features per token and layer, yet the dense step (base.py `forward`,
losses.py `topk_aux_loss`) multiplies and differentiates full [batch, n_layers, d_sae] matrices
through the decoder twice (main and AuxK) and through the encoder's backward. This step computes
the same loss and the same gradients (up to float rounding) from the selected features alone:

1. Encode densely, without autograd (one batched product over layers, bias fused):
   `h = x @ W_enc + b_enc`.
2. Select, without autograd: the top k of `h` per token and layer (TopK's `a = ReLU` of them;
   `topk_indices`: a top-k over group maxima, then one over the best groups' entries),
   and for AuxK the top `k_aux` of `h` among the dead features, searched over the dead columns
   only (a [batch, n_layers, n_dead] gather instead of a second top-k over all d_sae).
3. `sparse_code`: the selected `a = ReLU(h)` again, differentiable, and both decodes at once,
   `sum_j a_j W_dec[l, i_j]` for the main and the AuxK selection (one `embedding_bag` with
   per-sample weights, 2 * batch * n_layers bags). Its backward never forms a [batch, d_sae]
   matrix: the acts' gradient by embedding_bag, then `W_dec`'s and `W_enc`'s gradients as two
   sparse (CSR, rows = features, one shared sort) times dense products, `b_enc`'s by index_add.
   Under `--autocast` step 1's product is bfloat16 and this step runs in the weights' float32.
4. Losses as in losses.py: `mse_loss(out + b_dec, y)` and AuxK's `||aux_out - r||^2 / ||r||^2`
   with `r = y - out` detached; entries of a layer with fewer dead features than selected add 0.

`TopKStep` is an `nn.Module` (so DistributedDataParallel can wrap it) around the set it trains.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, NamedTuple

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor, nn

from transcoders.base import StepOutput
from transcoders.losses import aux_mse, mse_loss

if TYPE_CHECKING:
    from transcoders.base import SparseCoder


def supports(tc: SparseCoder) -> bool:
    """Sets this step trains: one decoder per layer (PLT, SAE; `W_dec` [n_layers, d_sae, d_model]) and
    a nonlinearity whose k active features per token are all a step needs (TopK)."""
    return tc.one_decoder_per_layer and tc.nonlinearity.sparse_step


def flat_rows(idx: Int[Tensor, "batch n_layers m"], d_sae: int) -> Int[Tensor, "batch n_layers m"]:
    """Feature `idx` of layer l as row `l * d_sae + idx` of a [n_layers * d_sae, ...] matrix."""
    return idx + torch.arange(idx.shape[1], device=idx.device)[:, None] * d_sae


def _csr(crow: Tensor, cols: Tensor, values: Tensor, shape: tuple[int, int]) -> Tensor:
    with warnings.catch_warnings():  # "Sparse CSR tensor support is in beta state"
        warnings.simplefilter("ignore", UserWarning)
        return torch.sparse_csr_tensor(crow, cols, values, shape, check_invariants=False)


class _SparseCode(torch.autograd.Function):
    """Step 3; rows/bags/offsets describe the selected entries (main first, then AuxK)."""

    @staticmethod
    def forward(ctx, x, W_enc, b_enc, W_dec, h_sel, rows, bags, offsets, valid):
        a = torch.where(valid, h_sel.relu(), 0.0)
        L, S, D = W_dec.shape
        dec = F.embedding_bag(rows, W_dec.reshape(L * S, D), offsets, mode="sum", per_sample_weights=a)
        ctx.save_for_backward(x, W_enc, W_dec, rows, bags, offsets, a)
        return a, dec

    @staticmethod
    def backward(ctx, g_a, g_dec):
        x, W_enc, W_dec, rows, bags, offsets, a = ctx.saved_tensors
        L, S, D = W_dec.shape
        n_tok = x.shape[0] * L  # (token, layer) pairs; bags past them are AuxK's
        with torch.enable_grad():  # d dec[bag(e)] / d a[e] = W_dec[rows[e]]
            a_ = a.detach().requires_grad_(True)
            dec = F.embedding_bag(
                rows, W_dec.detach().reshape(L * S, D), offsets, mode="sum", per_sample_weights=a_
            )
            (ga,) = torch.autograd.grad(dec, a_, g_dec)
        if g_a is not None:
            ga = ga + g_a
        g_h = ga * (a > 0)  # ReLU (and invalid AuxK entries, whose a is 0)
        order = torch.argsort(rows, stable=True)
        # row r's entries start where the sorted rows reach r (bincount would sync with the host)
        crow = torch.searchsorted(rows.index_select(0, order), torch.arange(L * S + 1, device=rows.device))
        bags_sorted = bags.index_select(0, order)
        gx = gW_enc = gb_enc = gW_dec = None
        if ctx.needs_input_grad[3]:
            G = _csr(crow, bags_sorted, a.index_select(0, order), (L * S, g_dec.shape[0]))
            gW_dec = (G @ g_dec).view(L, S, D)
        tok = torch.remainder(bags_sorted, n_tok)  # an AuxK bag reads the same x as its main bag
        if ctx.needs_input_grad[1]:
            G = _csr(crow, tok, g_h.index_select(0, order), (L * S, n_tok))
            gW_enc = (G @ x.reshape(n_tok, D).to(g_h.dtype)).view(L, S, D).transpose(1, 2).contiguous()
        if ctx.needs_input_grad[2]:
            gb_enc = (
                torch.zeros(L * S, dtype=g_h.dtype, device=g_h.device).index_add_(0, rows, g_h).view(L, S)
            )
        if ctx.needs_input_grad[0]:
            W_rows = W_enc.transpose(1, 2).reshape(L * S, D)
            per_bag = F.embedding_bag(rows, W_rows, offsets, mode="sum", per_sample_weights=g_h)
            gx = per_bag.view(-1, n_tok, D).sum(0).view_as(x)
        return gx, gW_enc, gb_enc, gW_dec, None, None, None, None, None


def sparse_code(
    x: Float[Tensor, "batch n_layers d_model"],
    W_enc: Float[Tensor, "n_layers d_model d_sae"],
    b_enc: Float[Tensor, "n_layers d_sae"],
    W_dec: Float[Tensor, "n_layers d_sae d_model"],
    h: Float[Tensor, "batch n_layers d_sae"],
    idx: Int[Tensor, "batch n_layers k"],
    aux: tuple[Tensor, Tensor] | None = None,
) -> tuple[Float[Tensor, "batch n_layers k"], Float[Tensor, "batch n_layers d_model"], Tensor | None]:
    """Step 3: `a = ReLU(h)` at `idx`, `sum_j a_j W_dec[l, idx_j]` (no `b_dec`), and with
    `aux = (indices, valid)` the same decode of the AuxK selection (invalid entries add 0).
    `h = x @ W_enc + b_enc` is given (not recomputed); gradients reach x, W_enc, b_enc, W_dec."""
    B, L, k = idx.shape
    S = W_dec.shape[1]
    n_tok = B * L
    parts = [idx] if aux is None else [idx, aux[0]]
    rows = torch.cat([flat_rows(i, S).reshape(-1) for i in parts])
    h_sel = torch.cat([h.gather(-1, i).reshape(-1) for i in parts])
    valid = torch.ones(n_tok * k, dtype=torch.bool, device=h.device)
    offsets = torch.arange(0, n_tok * k, k, device=h.device)
    if aux is not None:
        m = aux[0].shape[-1]
        valid = torch.cat([valid, aux[1].expand(B, L, m).reshape(-1)])
        offsets = torch.cat([offsets, n_tok * k + torch.arange(0, n_tok * m, m, device=h.device)])
    bags = torch.arange(n_tok * k, device=h.device) // k  # each entry's bag (no repeat_interleave: a sync)
    if aux is not None:
        bags = torch.cat([bags, n_tok + torch.arange(n_tok * m, device=h.device) // m])
    # under autocast (--autocast) h came from a bfloat16 product; the k-sparse decode is cheap and runs in
    # the weights' float32 (embedding_bag takes one dtype, and autocast has no rule for it)
    with torch.autocast(h.device.type, enabled=False):
        a, dec = _SparseCode.apply(
            x, W_enc, b_enc, W_dec, h_sel.detach().to(W_dec.dtype), rows, bags, offsets, valid
        )
    acts = a[: n_tok * k].view(B, L, k)
    out = dec[:n_tok].view(B, L, -1)
    return acts, out, (dec[n_tok:].view(B, L, -1) if aux is not None else None)


def topk_indices(h: Float[Tensor, "... d_sae"], k: int, group: int = 4) -> Int[Tensor, "... k"]:
    """Step 2's TopK selection, the set `h.topk(k).indices` (unsorted), found in two small top-k's:
    the k groups of `group` adjacent features with the largest maxima hold the k largest entries
    (each of those is at least the k-th largest group maximum), so a top-k over those k * group
    candidates replaces one over all d_sae. Ties may pick other indices of equal value."""
    S = h.shape[-1]
    n_groups = S // group
    if S % group or n_groups <= 2 * k:
        return h.topk(k, dim=-1, sorted=False).indices
    flat = h.reshape(-1, S)
    groups = flat.view(-1, n_groups, group).amax(-1).topk(k, dim=-1, sorted=False).indices
    cols = (groups[..., None] * group + torch.arange(group, device=h.device)).reshape(-1, k * group)
    best = flat.gather(-1, cols).topk(k, dim=-1, sorted=False).indices
    return cols.gather(-1, best).view(*h.shape[:-1], k)


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
    if k_aux >= M:  # every dead column is selected: no search needed
        return cols.expand(h.shape[0], L, M), ok.expand(h.shape[0], L, M)
    sub = h.gather(-1, cols.expand(h.shape[0], L, M)).masked_fill(~ok, -torch.inf)
    values, j = sub.topk(k_aux, dim=-1, sorted=False)
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
        fired = torch.zeros(L * d_sae, dtype=torch.int32, device=self.indices.device)
        # counted by scatter_add (a boolean index would sync with the host)
        fired.scatter_add_(0, flat_rows(self.indices, d_sae).reshape(-1), (self.acts > 0).reshape(-1).int())
        return (fired > 0).view(L, d_sae)

    def l0(self) -> float:
        """Active features per token and layer, averaged."""
        return float((self.acts > 0).sum(-1).float().mean())

    def step_output(
        self, y: Float[Tensor, "batch n_layers d_model"], auxk_coef: float, d_sae: int
    ) -> StepOutput:
        """The step's loss as the dense step gives it for TopK (base.py `train_forward`): `mse +
        auxk_coef * AuxK` (TopK has no sparsity penalty, and this step no pre-activation loss)."""
        mse = mse_loss(self.out, y)
        loss = mse + self.aux_loss * auxk_coef
        return StepOutput(self.out, loss, mse, self.fired(d_sae), (self.acts > 0).sum(-1).float().mean())


class TopKStep(nn.Module):
    """Steps 1-5 for the set `tc` (a PLT or SAE with TopK); `forward(x, y, dead)`."""

    def __init__(self, tc: SparseCoder, k_aux: int):
        super().__init__()
        if not supports(tc):
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
        with torch.no_grad():  # steps 1-2; h as [batch, n_layers, d_sae] (a view of [n_layers, batch, d_sae])
            h = torch.baddbmm(tc.b_enc[:, None, :], x.transpose(0, 1), tc.W_enc)
            idx = topk_indices(h, tc.cfg.k).transpose(0, 1)
            h = h.transpose(0, 1)
            aux = dead_topk(h, dead, self.k_aux) if dead is not None else None
        acts, dec, aux_out = sparse_code(x, tc.W_enc, tc.b_enc, tc.W_dec, h, idx, aux)
        out = dec + tc.b_dec
        if tc.W_skip is not None:
            out = out + tc.skip(x)
        if aux_out is None:
            return TopKOutput(out, idx, acts, out.new_zeros(()))
        return TopKOutput(out, idx, acts, aux_mse(aux_out, y - out))

"""The frozen backward as explicit batched matrix products (fast path of `autograd_rows.backward_rows`).

Seed: circuit-tracing appendix, "Attribution Graph Computation". With attention patterns, norm
scales and MLP outputs frozen (replacement.py), the map from the sources to any target is linear,
so the backward pass of one target is a fixed linear map `J^T v_in`. Instead of replaying a
general autograd graph, apply it layer by layer with matrix products:

1. Start. A logit target injects `v` on the logits at position p: the gradient at the final
   residual is `ln_final^T (v @ W_U^T)`. A feature target of layer l injects its encoder vector
   at the MLP input x[l]: the gradient at `resid_mid[l]` is `ln2^T v` (the identity for a
   `hook_resid_mid` read site). The walk then starts at layer L (logits) or at the attention of l.
2. Frozen norms (scale s frozen, weight w): LayerNorm `y = (x - mean x) / s * w + b` has
   `J^T g = C(g * w / s)` with C the centering `u - mean(u)`; RMSNorm `J^T g = g * w / s`;
   the `Pre` variants have no w. Post-norms (Gemma-2 `ln1_post`, `ln2_post`) are the same.
   Where a product follows, w and C are folded into its matrix and 1/s is applied after it;
   ln1's 1/s is folded into the key rows of the stored attention pattern, so that attention ends
   with its last product.
3. Layer j, from the gradient g at `resid_post[j]`:
   the write site gets `gw[j] = g` (or `ln2_post^T g` when the transcoder writes before ln2_post);
   the skip adds `ln2^T (gw[j] @ W_skip[j]^T)` (the MLP itself is cut);
   attention with the frozen pattern `A[h]` adds `ln1^T (sum_h A[h]^T (g' @ W_O[h]^T) @ W_V[h]^T)`,
   g' = `ln1_post^T g` (the residual g is added by the W_V product, `addmm`); the result is the
   gradient at `resid_post[j-1]`; after layer 0 it is the gradient at the embedding (token and
   positional embeddings enter the residual stream additively).
   A parallel block (GPT-J, GPT-NeoX: `resid_post = resid_pre + attn(ln1 x) + mlp(ln2 x)`, no
   resid_mid) takes the skip term and attention's term from the same g at `resid_post[j]`, and a
   feature target of layer l injects at `resid_pre[l]` (`ln2^T v`), below its layer's attention.
4. Only what a target can reach is computed: everything is causal, so a target at position p
   needs positions `<= p` only, and a feature of layer l only layers < l (plus the attention of
   l). Batches hold the targets of one start (logits, the MLP features of one layer, or the
   attention features of one layer) cut to the positions they reach, planned from the device
   (batch_plan.py): on the CPU one position per batch, split where its working tensor would pass a
   cache-sized budget, short runs merged with the next positions (their rows carry zeros beyond
   their position); on a GPU bands of positions as large as free memory allows, about 10% more
   flops than their rows need. Gradients are position-major, `[P, B, d_model]`: each position's rows
   are one contiguous `[B, d_model]` matrix for step 5. A feature target's first attention sees
   one query position: `u_h = W_V[h] W_O[h] g` once, spread over the keys by the pattern row
   `A[h, p, :]` (d_head times fewer products than the general step). From `2 TRIANGLE_ROWS`
   positions the pattern product skips the blocks above the causal diagonal.
5. Source contraction as in attribute.py step 5: embedding and error columns are `v_out . grad`
   (one pass per layer, `dot_positions`), feature columns are products `[B, n_out d_model] @
   [n_out d_model, k]` with the active features' scaled decoder rows, one per (layer, position),
   written straight into the batch's block of rows (columns padded to `PAD_COLUMNS`,
   `_LayerDecoders`). Each layer is contracted as soon as the walk has passed it, and write-site
   gradients that no lower layer reads are dropped then: a per-layer transcoder's batch keeps a
   few [P, B, d_model] tensors alive, not one per layer (a cross-layer transcoder's features read
   every layer above them). The block has the batch's reachable columns only (`_block_columns`),
   so it is usually free of zeros and is copied to the CSR buffers whole (csr_rows.py).
   `stats["flops"]` counts the products each row needs at its own position
   (`LinearBackward.flops`), not the padding nor the zeros of merged rows.
6. Threads (threads.py): the products of a batch are small (~0.3 GFLOP at d_model 256), and with
   OpenMP's default spin-waiting, two threads beside another busy process made a 6-layer graph
   5-30x slower than one thread. A batch therefore runs on one thread unless its largest product
   passes `threads.PARALLEL_FLOPS` (then on the caller's thread count; on a GPU the threads are
   `threads.threads_for`'s); when it runs on one thread, the caller's threads run that many
   batches at once (`_BatchRows` shares only read-only state; no thread waits on another inside
   an operation, so this holds with `OMP_WAIT_POLICY=PASSIVE` too, as the CLI sets it), and their
   blocks are appended in order. The caller's setting is restored after.
7. Attention features (replacement.py step 6): with an attention set the attention output is cut
   like the MLP output. The walk then passes resid_mid[j] to resid_pre[j] unchanged and yields the
   gradient at resid_mid[j] as the attention write-site gradient of layer j (contracted with the
   attention errors and features of layer j); an attention feature target of layer l injects its
   encoder vector at the attention output, whose frozen attention (`attention_back_at`, ln1_post
   included, no residual) gives the gradient at resid_pre[l], and walks on from layer l - 1.

8. On a GPU (batch_plan.py's `resident` budget) the rows stay on the device: every batch writes its
   block into one buffer sized before the first batch, each layer's decoders are one stacked tensor
   contracted by one batched product per batch (`_LayerDecoders.stack`), the positions of all rows
   are copied to the device once, and nothing in the row loop reads a value back: the host never
   waits for the device until the graph is assembled (device_rows.py: influence on the device, one
   copy; pruned_build.py prunes them there too, device_prune.py). Rows that would not fit are
   copied to the host batch by batch, with a warning (`only_resident`: not computed at all); what
   they take is counted from the plan's blocks (`_device_plan`).
9. `precision` (precision.py): "fp32" (default, TF32 off), "tf32" or "bf16" products.

Only models and targets whose frozen backward is covered by steps 1-3 take this path
(`unsupported_reason` says why not); `attribute(..., backend="auto")` falls back to autograd.
"""

from __future__ import annotations

import bisect
import time
import warnings
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from typing import TYPE_CHECKING

import numpy as np
import scipy.sparse as sp
import torch
from jaxtyping import Float
from torch import Tensor
from tqdm import tqdm

from attrgraph.engine.autograd_rows import backward_rows
from attrgraph.engine.batch_plan import BatchBudget, budget_for, plan_batches
from attrgraph.engine.csr_rows import CsrRowWriter
from attrgraph.engine.device_rows import DeviceRows
from attrgraph.engine.precision import compute_dtype, matmul_precision, numpy_dtype, walk_dtype
from attrgraph.engine.threads import PARALLEL_FLOPS, threads_for, torch_threads
from attrgraph.errors import OptionError
from transcoders import sites
from transcoders.block_layout import RESID_MID as RESID_MID  # defined there; re-exported
from transcoders.block_layout import BlockLayout

if TYPE_CHECKING:
    from attrgraph.engine.replacement import ReplacementModel

PAD_COLUMNS = 16
"""Decoder matrices are padded to a multiple of this many columns (`_LayerDecoders`)."""
TRIANGLE_ROWS = 32
"""From 2 x this many positions, attention's pattern product is done in blocks of this many key rows,
each with the queries at or after its first key only (the pattern is causal): 15-30% faster at
64-128 positions (float32, one thread), slower below."""
_READS = (sites.MLP_INPUT, RESID_MID)
ROW_ALIGN_BYTES = 16
"""The stored patterns' rows start every this many bytes (`aligned_rows`)."""


def aligned_rows(t: Float[Tensor, "H k q"]) -> Float[Tensor, "H k q"]:
    """`t` as a view of a zero-padded copy whose rows start every `ROW_ALIGN_BYTES` bytes. cuBLAS
    takes its vectorized kernels only where a matrix's leading dimension is a multiple of 16 bytes,
    and a prompt of 33 tokens (BOS and 32) stores pattern rows of 33 float32. On an H100 a Llama-1B-
    shaped graph of such a prompt spent 9% of its device time in a SIMT `sgemm ... align1` kernel,
    0.85 ms a call (benchmarks/results/gpu/2026-11-27_h100), most likely these memory-bound
    `[P, P] @ [P, B d_head]` products: their only leading dimension that is not a multiple of 16
    bytes is the pattern's (not yet timed on a GPU)."""
    n = t.shape[-1]
    per_row = max(1, ROW_ALIGN_BYTES // t.element_size())
    padded = t.new_zeros(*t.shape[:-1], -(-n // per_row) * per_row)
    padded[..., :n] = t
    return padded[..., :n]


class _Norm:
    """A norm with its scale frozen at the recorded values: `back(g)` is `J^T g` (step 2). Gradients are
    position-major, `[P, B, d_model]` (step 4); `back_at` takes one position per row."""

    def __init__(self, module, scale: Tensor | None, dtype):
        name = type(module).__name__ if module is not None else "Identity"
        self.identity = (
            module is None
            or scale is None
            or name not in ("LayerNorm", "LayerNormPre", "RMSNorm", "RMSNormPre")
        )
        self.center = name.startswith("LayerNorm")
        if not self.identity:
            w = getattr(module, "w", None)
            inv = 1.0 / scale.reshape(-1, 1).to(dtype)  # [n_pos, 1]
            self.inv, self.w = inv, None if w is None else w.detach().to(dtype)
            self.factor = inv * self.w if w is not None else inv  # [n_pos, d_model] or [n_pos, 1]

    def _center(self, g: Tensor) -> Tensor:
        return g - g.mean(-1, keepdim=True) if self.center else g

    def back(self, g: Float[Tensor, "P B d_model"]) -> Float[Tensor, "P B d_model"]:
        if self.identity:
            return g
        return self._center(g * self.factor[: g.shape[0]].unsqueeze(1))

    def back_at(self, g: Float[Tensor, "B d_model"], positions: Tensor) -> Float[Tensor, "B d_model"]:
        """`back` of a gradient that row b has only at `positions[b]`, given at those positions."""
        return g if self.identity else self._center(g * self.factor[positions])

    def fold(self, W: Tensor) -> Tensor:
        """`W` [n, d_model] with the norm's weight and centering folded into its columns, so that
        `back(x @ W) == scale(x @ fold(W))` (the per-position 1/s is all that is left)."""
        if self.identity:
            return W
        W = W * self.w if self.w is not None else W
        return (W - W.mean(-1, keepdim=True)).contiguous() if self.center else W.contiguous()

    def scale_(self, g: Tensor) -> Tensor:
        """The per-position factor 1/s of a folded product, applied in place (g is a fresh product)."""
        return g if self.identity else g.mul_(self.inv[: g.shape[0]].unsqueeze(1))


def unsupported_reason(rm: ReplacementModel, injections) -> str | None:
    """Why the fast path cannot compute these rows (None when it can)."""
    cfg = rm.cfg
    if rm.tc.cfg.input_hook not in _READS:
        return f"the transcoders read {rm.tc.cfg.input_hook!r}"
    if any(j.hook is not None for j in injections):
        return "a custom target reads an arbitrary hook"
    block = BlockLayout.of(cfg).unsupported("linear")
    if block is not None:
        return block
    norms = [
        m
        for b in rm.model.blocks
        for m in (b.ln1, b.ln2, getattr(b, "ln1_post", None), getattr(b, "ln2_post", None))
    ]
    for m in norms + [getattr(rm.model, "ln_final", None)]:
        if m is not None and type(m).__name__ not in (
            "LayerNorm",
            "LayerNormPre",
            "RMSNorm",
            "RMSNormPre",
            "Identity",
        ):
            return f"norm {type(m).__name__}"
    return None


class LinearBackward:
    """The frozen model's transposed Jacobian, precomputed per layer (steps 1-3), applied to
    position-major gradients `[P, B, d_model]` (step 4)."""

    def __init__(self, rm, state, precision: str = "fp32"):
        model, fr, L = rm.model, state.frozen, rm.cfg.n_layers
        # float32 for a half-precision model; bfloat16 products when asked (precision.py)
        dt = walk_dtype(state.errors.dtype, precision)
        self.L, self.dtype, self.device = L, dt, state.errors.device
        self.out_dtype = compute_dtype(state.errors.dtype)
        """The rows' dtype (float32 at least, also for bfloat16 products)."""

        layout = BlockLayout.of(model.cfg)

        def norm(module, name, layer=None):
            hook = layout.norm_scale(name, layer)
            return _Norm(module, fr[hook][0] if hook in fr else None, dt)

        self.ln1, self.ln2, self.ln1_post, self.ln2_post = [], [], [], []
        self.W_O, self.W_V, self.pattern, self.W_skip = [], [], [], []
        for l, block in enumerate(model.blocks):
            self.ln1.append(norm(block.ln1, "ln1", l))
            self.ln2.append(norm(block.ln2, "ln2", l))
            self.ln1_post.append(norm(getattr(block, "ln1_post", None), "ln1_post", l))
            raw = sites.raw_output_needed(model, rm.tc.cfg, l)
            self.ln2_post.append(norm(sites.post_norm(model, l) if raw else None, "ln2_post", l))
            W_O = block.attn.W_O.detach().to(dt)  # [H, d_head, d_model]
            W_V = block.attn.W_V.detach().to(dt)  # [H, d_model, d_head]
            H, dh, d = W_O.shape
            self.W_O.append(W_O.reshape(H * dh, d).contiguous())
            # [H*dh, d] with ln1's weight and centering folded in (step 2: only 1/s is left to apply)
            self.W_V.append(self.ln1[l].fold(W_V.permute(1, 0, 2).reshape(d, H * dh).T))
            # A^T as [H, k, q], each key row k scaled by ln1's 1/s at k (step 2: the last factor of
            # the folded W_V), so that the attention step ends with a product, not a scaling pass
            pattern = fr[layout.hook("pattern", l)][0].to(dt).transpose(-1, -2)
            if not self.ln1[l].identity:
                pattern = pattern * self.ln1[l].inv.view(1, -1, 1)
            self.pattern.append(aligned_rows(pattern))
            ws = rm.tc.W_skip
            fold = self.ln2[l].fold if rm.tc.cfg.input_hook == sites.MLP_INPUT else (lambda W: W.contiguous())
            self.W_skip.append(None if ws is None else fold(ws[l].detach().to(dt).T))
        self.ln_final = norm(getattr(model, "ln_final", None), "ln_final")
        self.W_U_T = model.W_U.detach().to(dt).T.contiguous()  # [d_vocab, d_model]
        self.read_mid = rm.tc.cfg.input_hook == sites.MLP_INPUT
        self.attn_cut = rm.attn is not None  # step 7
        self.parallel = layout.parallel  # step 3: attention and MLP read resid_pre

    def attention_back(self, l: int, g: Float[Tensor, "P B d_model"]) -> Float[Tensor, "P B d_model"]:
        """Gradient at resid_pre[l] from g at resid_mid[l]: g (the residual) plus what the frozen
        attention of layer l adds (the residual is added by the last product, not by another pass)."""
        P, B, d = g.shape
        H = self.pattern[l].shape[0]
        residual, g = g, self.ln1_post[l].back(g)
        gz = g.reshape(P * B, d) @ self.W_O[l].T  # [P B, H dh]
        dh = gz.shape[-1] // H
        # one [P, P] @ [P, B dh] product per head (A^T is stored as [H, k, q]); each name is
        # dropped as soon as it is used, so that at most two [P, B, d] temporaries are alive
        gz = gz.view(P, B, H, dh).permute(2, 0, 1, 3).reshape(H, P, B * dh)
        A = self.pattern[l]
        if P < 2 * TRIANGLE_ROWS:
            gv = torch.bmm(A[:, :P, :P], gz)
        else:  # A^T is upper triangular: key rows k0.. read only queries k0.. (5/8 of the product at P 128)
            gv = torch.empty_like(gz)
            for k0 in range(0, P, TRIANGLE_ROWS):
                k1 = min(k0 + TRIANGLE_ROWS, P)
                torch.bmm(A[:, k0:k1, k0:P], gz[:, k0:], out=gv[:, k0:k1])
        del gz
        gv = gv.view(H, P, B, dh).permute(1, 2, 0, 3).reshape(P * B, H * dh)
        # ln1's 1/s is already in the pattern's rows
        return torch.addmm(residual.reshape(P * B, d), gv, self.W_V[l]).view(P, B, d)

    def attention_back_at(
        self,
        l: int,
        g: Float[Tensor, "B d_model"],
        positions: Tensor,
        P: int,
        residual: bool = True,
        one_position: int | None = None,
    ) -> Float[Tensor, "P B d_model"]:
        """Gradient at resid_pre[l] from a gradient at resid_mid[l] that row b has only at
        `positions[b]`, given at those positions (a feature target's first attention, step 4):
        attention's part plus, when `residual`, g itself (an attention feature's start, step 7,
        injects at the attention output: no residual). `one_position`: the position of every row,
        when they share one (known on the host: asking the device would wait for it)."""
        B, d = g.shape
        H = self.pattern[l].shape[0]
        gz = self.ln1_post[l].back_at(g, positions) @ self.W_O[l].T  # [B, H dh]
        dh = gz.shape[-1] // H
        # per head, the value-side vector u_h = W_V[h] gz_h, then spread over keys by A[h, p_b, k]
        u = torch.bmm(gz.view(B, H, dh).transpose(0, 1), self.W_V[l].view(H, dh, d))  # [H, B, d]
        if one_position is not None:  # one query position: one [P, H] @ [H, B d] product
            a = self.pattern[l][:, :P, one_position]  # [H, P]; ln1's 1/s is in its rows
            gx = (a.T @ u.view(H, B * d)).view(P, B, d)
        else:
            a = self.pattern[l][:, :P, positions].permute(2, 1, 0)  # [B, P, H]
            gx = torch.bmm(a, u.transpose(0, 1)).transpose(0, 1).contiguous()
        if residual:
            gx[positions, torch.arange(B, device=gx.device)] += g
        return gx

    def walk(self, g: Tensor, start: int, at_mid: bool, positions: Tensor, P: int, one_position=None):
        """Step 3: from g at resid_post[start] (`[P, B, d]`), or, when `at_mid`, from g at resid_mid[start]
        that row b has only at `positions[b]` (`[B, d]`, a feature target), down to the embedding.
        Yields `("mlp", l, write-site gradient of layer l)` from the top layer down (with an attention
        set also `("attn", l, attention write-site gradient)` after it, step 7), then `("embed", -1,
        embedding gradient)`; a caller that drops what it no longer needs keeps a few [P, B, d_model]
        tensors alive instead of one per layer."""
        for l in range(start, -1, -1):
            # each step's result is a fresh tensor: add g into it rather than allocate a third one
            # (g itself may be held by the caller as a write-site gradient)
            if l == start and at_mid:
                if self.attn_cut:  # step 7: the gradient at resid_mid[l] is the attention write site's
                    dense = torch.zeros(P, *g.shape, dtype=g.dtype, device=g.device)
                    dense[positions, torch.arange(g.shape[0], device=g.device)] = g
                    g = dense
                    yield "attn", l, g
                    continue
                g = self.attention_back_at(l, g, positions, P, one_position=one_position)
                continue
            w = self.ln2_post[l].back(g)
            yield "mlp", l, w
            skip = None
            if self.W_skip[l] is not None:
                skip = w @ self.W_skip[l]
                skip = self.ln2[l].scale_(skip) if self.read_mid else skip
            del w
            if self.parallel:  # attention and the skip both read resid_pre: both from g at resid_post
                if self.attn_cut:
                    yield "attn", l, g
                    g = g if skip is None else skip.add_(g)
                else:
                    g = self.attention_back(l, g) if skip is None else self.attention_back(l, g).add_(skip)
                continue
            if skip is not None:
                g = skip.add_(g)
            del skip
            if self.attn_cut:
                yield "attn", l, g
                continue
            g = self.attention_back(l, g)
        yield "embed", -1, g

    def start_layer(self, j0) -> tuple[int, bool]:
        """Where step 1 leaves the walk of a batch whose first target is `j0` (one start for all its
        rows): (the layer the walk starts at, whether at that layer's resid_mid, its attention still to
        come). Logits start at the top; an attention read and a parallel block's MLP read go on below
        their layer; an MLP read starts at its own layer's resid_mid."""
        if j0.logits:
            return self.L - 1, False
        if j0.site == "attn" or self.parallel:
            return j0.layer - 1, False
        return j0.layer, True

    def start(self, injections, positions: Tensor, P: int, one_position=None) -> tuple[Tensor, int, bool]:
        """Step 1 for a batch with one start (all logits, or all reads of one layer and site) whose
        rows sit at `positions` (on the device): (gradient, layer the walk starts at, whether that
        gradient is at resid_mid of that layer, given per row at its position only)."""
        B, d, dev = len(injections), self.W_U_T.shape[1], self.device
        v = torch.stack([j.vector.to(device=dev) for j in injections]).to(self.dtype)
        j0 = injections[0]
        if j0.logits:
            g = torch.zeros(P, B, d, dtype=self.dtype, device=dev)
            g[positions, torch.arange(B, device=dev)] = self.ln_final.back_at(v @ self.W_U_T, positions)
            return g, *self.start_layer(j0)
        if j0.site == "attn":  # step 7: through the frozen attention of its layer, on from below it
            g = self.attention_back_at(j0.layer, v, positions, P, residual=False, one_position=one_position)
            return g, *self.start_layer(j0)
        g = self.ln2[j0.layer].back_at(v, positions) if self.read_mid else v
        if self.parallel:  # the MLP reads resid_pre: the walk goes on below the layer, attention of l unread
            dense = torch.zeros(P, B, d, dtype=g.dtype, device=dev)
            dense[positions, torch.arange(B, device=dev)] = g
            return dense, *self.start_layer(j0)
        return g, *self.start_layer(j0)

    def flops(self, start: int, at_mid: bool, positions: np.ndarray, kind: str) -> float:
        """Multiply-adds x 2 of the products that a batch with rows at `positions` needs (step 4):
        per row only its positions `<= p` (what the engine computes beyond, for a batch that mixes
        positions, is not counted; the pattern product is counted as a dense `[p+1, p+1]` one, though
        the blocked product of long prompts skips some of its zeros). `kind`: "logits", "mlp" or
        "attn" (the batch's start)."""
        d, n = self.W_U_T.shape[1], positions.astype(np.float64) + 1
        R, R2, B = n.sum(), (n**2).sum(), len(n)

        def first_attention(l):
            return 4.0 * B * d * self.W_O[l].shape[0] + 2.0 * self.pattern[l].shape[0] * d * R

        out = 2.0 * B * self.W_U_T.shape[0] * d if kind == "logits" else 0.0
        if kind == "attn":
            out += first_attention(start + 1)
        for l in range(start, -1, -1):
            if l == start and at_mid:
                out += 0.0 if self.attn_cut else first_attention(l)
                continue
            if self.W_skip[l] is not None:
                out += 2.0 * R * d * d
            if not self.attn_cut:
                Hdh = self.W_O[l].shape[0]
                out += 4.0 * R * d * Hdh + 2.0 * R2 * Hdh
        return out


class _LayerDecoders:
    """The scaled decoder rows of one source layer (MLP or, with `attn`, attention features), one
    `[n_out d_model, k]` matrix per position (step 5).

    Each matrix is stored with its k columns padded by zeros to a multiple of `PAD_COLUMNS`: a product
    with an odd k runs at two thirds of the rate of a padded one (float32, d_model 256, k 63 or 79 vs
    64 or 80). The padded columns of position p spill into the block columns of the next positions,
    which are written after it and overwrite them; only the last position is written unpadded."""

    def __init__(self, sources, layer: int, dtype, n_pos: int, device=None, attn: bool = False):
        groups, decoders = (
            (sources.attn_groups, sources.attn_decoders) if attn else (sources.groups, sources.decoders)
        )
        mine = [(p, c0, c1, dec) for (l, p, c0, c1), dec in zip(groups, decoders) if l == layer]
        self.layer = layer
        self.reads = range(0)
        """Layers whose write-site gradients this layer's contraction reads."""
        self.cum = np.zeros(n_pos + 1, np.int64)
        """`cum[P]`: this layer's features at positions < P (their columns are contiguous)."""
        self.positions, self.dec, self.k, self.first_col, self.d = [], [], [], 0, 0
        self.stacked: Tensor | None = None
        """`[n_g, n_out d, k_max]` once `stack` has run (a GPU's plan)."""
        if not mine:
            return
        n_out, d = mine[0][3].shape[1:]
        self.reads, self.d = range(layer, layer + n_out), d
        self.first_col = mine[0][1]
        for p, c0, c1, dec in mine:
            k = c1 - c0
            padded = torch.zeros(n_out * d, -(-k // PAD_COLUMNS) * PAD_COLUMNS, dtype=dtype, device=device)
            padded[:, :k] = dec.reshape(k, -1).T.to(dtype)
            self.positions.append(p)
            self.dec.append(padded)  # [n_out d, k padded]
            self.k.append(k)
            self.cum[p + 1] = k
        self.cum = np.cumsum(self.cum)

    def contract(self, gw: list, P: int, out: Tensor) -> None:
        """This layer's feature columns for a batch cut to P positions, written into `out` [B, cum[P]]
        (one `[B, n_out d] @ [n_out d, k]` product per position, in ascending order)."""
        n_g = bisect.bisect_left(self.positions, P)
        if not n_g:
            return
        reach = [x for x in gw[self.layer : self.layer + len(self.reads)] if x is not None]
        G = (reach[0] if len(reach) == 1 else torch.cat(reach, -1)).unbind(0)  # P x [B, m d]
        m, end = G[0].shape[-1], int(self.cum[P])
        for p, D, k in zip(self.positions[:n_g], self.dec, self.k):
            c = int(self.cum[p])
            w = D.shape[1] if c + D.shape[1] <= end else k
            if out.dtype == D.dtype:
                torch.mm(G[p], D[:m, :w], out=out[:, c : c + w])
            else:  # bfloat16 products into float32 rows (precision.py)
                out[:, c : c + w] = G[p] @ D[:m, :w]

    def stack(self) -> None:
        """Step 5 on a GPU: the matrices of every position padded to the widest, one `[n_g, n_out d,
        k_max]` tensor (the per-position matrices become views of it), so that a batch's contraction is
        one batched product and one gather (`contract_stacked`): there, launches, not flops, bound
        a per-position loop."""
        if not self.dec or self.stacked is not None:
            return
        k_max, dev = max(D.shape[1] for D in self.dec), self.dec[0].device
        S = torch.zeros(len(self.dec), self.dec[0].shape[0], k_max, dtype=self.dec[0].dtype, device=dev)
        for i, D in enumerate(self.dec):
            S[i, :, : D.shape[1]] = D
        self.dec = [S[i, :, : D.shape[1]] for i, D in enumerate(self.dec)]
        self.stacked = S
        self.gather = torch.cat([i * k_max + torch.arange(k, device=dev) for i, k in enumerate(self.k)])
        p0 = self.positions[0]
        self.run_of_positions = self.positions == list(range(p0, p0 + len(self.positions)))
        self.position_index = torch.tensor(self.positions, device=dev)

    def contract_stacked(self, gw: list, P: int, out: Tensor) -> None:
        """`contract` as one batched product over positions (`stack`)."""
        n_g = bisect.bisect_left(self.positions, P)
        if not n_g:
            return
        reach = [x for x in gw[self.layer : self.layer + len(self.reads)] if x is not None]
        G = reach[0] if len(reach) == 1 else torch.cat(reach, -1)  # [P, B, m d]
        p0 = self.positions[0]
        G = G[p0 : p0 + n_g] if self.run_of_positions else G.index_select(0, self.position_index[:n_g])
        R = torch.bmm(G, self.stacked[:n_g, : G.shape[-1]])  # [n_g, B, k_max]
        end = int(self.cum[P])
        out[:, :end] = R.transpose(0, 1).reshape(R.shape[1], -1).index_select(1, self.gather[:end])


def dot_positions(x: Float[Tensor, "P B d_model"], v: Float[Tensor, "P d_model"]) -> Float[Tensor, "B P"]:
    """`x[p, b] . v[p]`: the columns of one-vector sources (embeddings, errors; step 5). A product
    per position would be a matrix-vector product each, several times slower than this one pass."""
    return (x * v.unsqueeze(1)).sum(-1).T


class _BatchRows:
    """One batch's block of rows (steps 1-5, 7): what every batch shares is read-only, so that batches
    can run in several threads at once (step 6)."""

    def __init__(self, lb: LinearBackward, sources, n_pos: int):
        L, dt, dev = lb.L, lb.dtype, lb.device
        self.lb, self.sources, self.n_pos, self.n_exc = lb, sources, n_pos, sources.n_excluded
        self.embed, self.errors = sources.embed.to(dt), sources.errors.to(dt)
        self.layers = [_LayerDecoders(sources, l, dt, n_pos, dev) for l in range(L)]
        # the lowest layer whose contraction reads the write-site gradient of layer j (j itself: errors)
        self.last_read = [min([j] + [x.layer for x in self.layers if j in x.reads]) for j in range(L)]
        self.cum = np.stack([x.cum for x in self.layers])  # [L, n_pos + 1]
        self.attn = lb.attn_cut  # step 7
        if self.attn:
            self.attn_errors = sources.attn_errors.to(dt)
            self.attn_layers = [_LayerDecoders(sources, l, dt, n_pos, dev, attn=True) for l in range(L)]
            self.attn_cum = np.stack([x.cum for x in self.attn_layers])
        self.columns: dict = {}

    def block_columns(self, top: int, top_attn: int, P: int) -> tuple[np.ndarray, dict]:
        """Global columns of a batch's block (ascending): embeddings at positions < P, errors and
        features of the MLP layers <= top and the attention layers <= top_attn that it reaches
        (step 5), with the block offset of each part (keys "embed", ("err", l), ("feat", l),
        ("attn_err", l), ("attn_feat", l)). Cached per (top, top_attn, P)."""
        got = self.columns.get((top, top_attn, P))
        if got is not None:
            return got
        parts = sorted((p for p in self._parts(top, top_attn, P) if p[2] > 0), key=lambda p: p[1])
        columns = np.concatenate([np.arange(c, c + n) for _, c, n in parts])
        offsets, at = {}, 0
        for name, _, n in parts:
            offsets[name] = (at, at + int(n))
            at += int(n)
        self.columns[(top, top_attn, P)] = got = (columns, offsets)
        return got

    def _parts(self, top: int, top_attn: int, P: int) -> list[tuple]:
        """`block_columns`'s parts: (name, first global column, how many), in no order."""
        src, Pe = self.sources, max(0, P - self.n_exc)
        parts = [("embed", 0, P)]
        for l in range(top + 1):
            parts += [
                (("err", l), src.error_column(l), Pe),
                (("feat", l), self.layers[l].first_col, self.cum[l, P]),
            ]
        for l in range(top_attn + 1):
            parts += [
                (("attn_err", l), src.error_column(l, "attn"), Pe),
                (("attn_feat", l), self.attn_layers[l].first_col, self.attn_cum[l, P]),
            ]
        return parts

    def width(self, inj: list) -> int:
        """How many columns the block of the rows `inj` has (`block_columns`, counted, not built)."""
        return sum(int(n) for _, _, n in self._parts(*self.reach(inj)))

    def reach(self, inj: list) -> tuple[int, int, int]:
        """(the highest MLP layer, the highest attention layer whose sources the rows `inj` reach,
        their positions P): what sizes the batch's block (`block_columns`)."""
        start, at_mid = self.lb.start_layer(inj[0])
        # a walk from resid_mid of its layer reads that layer's attention, and MLPs from the one below
        top = start - 1 if at_mid else start
        return top, start if self.attn else -1, max(j.position for j in inj) + 1

    def __call__(
        self, inj: list, positions: Tensor | None = None, out: Tensor | None = None
    ) -> tuple[Tensor, np.ndarray, float]:
        """(values [B, n], their global columns (ascending), useful flops) for the targets `inj`, at
        `positions` (on the device; default: made from `inj`); the values are written into `out`
        when given (a slice of the resident rows, step 8)."""
        lb, layers, n_exc, L = self.lb, self.layers, self.n_exc, self.lb.L
        pos = np.array([j.position for j in inj])
        P, B = int(pos.max()) + 1, len(inj)
        kind = "logits" if inj[0].logits else inj[0].site
        one = int(pos[0]) if (pos == pos[0]).all() else None
        positions = torch.from_numpy(pos).to(lb.device) if positions is None else positions
        g, start, at_mid = lb.start(inj, positions, P, one)
        top, top_attn, _ = self.reach(inj)
        columns, offsets = self.block_columns(top, top_attn, P)
        block = out if out is not None else torch.empty(B, len(columns), dtype=lb.out_dtype, device=lb.device)
        walk = lb.walk(g, start, at_mid, positions, P, one)
        del g
        # contract each layer as soon as the walk has passed it, dropping write-site gradients
        # that no lower layer reads (all but one for per-layer transcoders)
        gw: list[Tensor | None] = [None] * L
        reads = np.zeros(L)  # per layer, the d_model-wide gradients its contraction read
        for site, l, x in walk:
            if l < 0:
                block[:, :P] = dot_positions(x, self.embed[:P])
                break
            if site == "attn":  # step 7: the attention errors and features of layer l
                if ("attn_err", l) in offsets:
                    e0, e1 = offsets[("attn_err", l)]
                    block[:, e0:e1] = dot_positions(x[n_exc:], self.attn_errors[l, n_exc:P])
                if ("attn_feat", l) in offsets:
                    f0, f1 = offsets[("attn_feat", l)]
                    self.contract(self.attn_layers[l], [None] * l + [x], P, block[:, f0:f1])
                del x
                continue
            gw[l] = x
            if ("err", l) in offsets:
                e0, e1 = offsets[("err", l)]
                block[:, e0:e1] = dot_positions(x[n_exc:], self.errors[l, n_exc:P])
            if ("feat", l) in offsets:
                f0, f1 = offsets[("feat", l)]
                self.contract(layers[l], gw, P, block[:, f0:f1])
                reads[l] = sum(gw[r] is not None for r in layers[l].reads)
            for j in range(l, L):
                if self.last_read[j] >= l:
                    gw[j] = None
            del x
        del walk, gw
        # useful flops: row b reaches the sources at positions <= p_b
        d, n = self.embed.shape[1], pos + 1
        n_err = np.maximum(n - n_exc, 0).sum()
        flops = lb.flops(start, at_mid, pos, kind) + 2.0 * d * (n.sum() + (top + 1) * n_err)
        flops += 2.0 * d * float(reads[: top + 1] @ self.cum[: top + 1, n].sum(1))
        if self.attn:
            flops += 2.0 * d * ((top_attn + 1) * n_err + float(self.attn_cum[: top_attn + 1, n].sum()))
        return block, columns, flops

    def contract(self, layer: _LayerDecoders, gw: list, P: int, out: Tensor) -> None:
        """Step 5 for one source layer: per position (CPU), or one batched product (`stacked`)."""
        (layer.contract_stacked if layer.stacked is not None else layer.contract)(gw, P, out)

    def stack(self) -> None:
        """Every layer's decoders as one tensor (`_LayerDecoders.stack`: a GPU's plan)."""
        for x in self.layers + (self.attn_layers if self.attn else []):
            x.stack()


def linear_rows(
    rm: ReplacementModel,
    state,
    sources,
    injections: list,
    batch_size: int | None = None,
    progress: bool = False,
    stats: dict | None = None,
    budget: BatchBudget | None = None,
    precision: str = "fp32",
    keep_on_device: bool = False,
    only_resident: bool = False,
) -> sp.csr_array | DeviceRows | None:
    """Rows of the attribution graph for `injections` (same contract as `autograd_rows.backward_rows`).

    `batch_size` caps the rows of a batch (default: the budget's). `budget` (batch_plan.py; default:
    the device's, `budget_for`) sizes the batches and says whether the rows stay on the device
    (step 8); with `keep_on_device` such rows come back as `DeviceRows` (device_rows.py), else
    always as a host CSR matrix; with `only_resident` as well, rows that would not stay on the
    device are not computed (None). `precision`: "fp32", "tf32" or "bf16" (precision.py).
    `stats`, when given, receives `flops` (multiply-adds x 2 of the products each row needs: the
    backward and the contraction; `LinearBackward.flops`), `threads` (torch threads per batch),
    `workers` (batches at once), `batches` and `resident` (whether the rows stayed on the device)."""
    reason = unsupported_reason(rm, injections)
    if reason is not None:
        raise NotImplementedError(
            f"the linear backward does not cover this case ({reason}); use backend='autograd'."
        )
    n_pos, L = state.tokens.shape[0], state.acts.shape[0]
    lb = LinearBackward(rm, state, precision)
    rows = _BatchRows(lb, sources, n_pos)
    # step 4: group by start (logits = L, attention features of l = l - 0.5) and sort by position,
    # keeping the original row index
    key = [
        (L if j.logits else j.layer - 0.5 if j.site == "attn" else j.layer, j.position) for j in injections
    ]
    order = sorted(range(len(injections)), key=lambda i: key[i])
    row_bytes = rows.embed.shape[1] * rows.embed.element_size()  # one target, one position, [d_model]
    if budget is None:
        budget, batches, need = _device_plan(lb, rows, injections, key, order, row_bytes, batch_size)
        if lb.device.type != "cpu" and not budget.resident and not only_resident:
            warnings.warn(
                f"the rows of this graph ({need / 2**30:.1f} GiB) do not fit in half of the free "
                f"memory of {lb.device}: each batch is copied to the host as it is done (slower); free "
                "device memory or use attribute(method='adaptive', max_feature_nodes=...) to bound the graph.",
                stacklevel=2,
            )
    else:
        batches = plan_batches(key, order, row_bytes, budget, batch_size)
    if budget.resident:
        keep = keep_on_device or only_resident
        return _resident_rows(lb, rows, injections, batches, progress, stats, precision, keep)
    if only_resident:
        return None
    # step 6: one thread per batch unless its largest product pays for parallel waits; then the
    # caller's threads run that many batches at once (on the CPU)
    caller, on_cpu = torch.get_num_threads(), lb.device.type == "cpu"
    largest = largest_product(lb, rows.layers, [(len(b), key[b[-1]][1] + 1) for b in batches])
    # batches side by side need no thread to wait on another, whatever the wait policy: they are
    # preferred to parallel products wherever the products are small
    threads = 1 if on_cpu and largest < PARALLEL_FLOPS else threads_for(largest)
    workers = caller if on_cpu and threads == 1 and caller > 1 and len(batches) > 1 else 1
    written = CsrRowWriter(len(injections), sources.n_columns, numpy_dtype(lb.out_dtype))
    bar = tqdm(total=len(injections), desc="attribution (linear)", unit="target", disable=not progress)
    t_sparse = flops = 0.0
    t0 = time.perf_counter()

    def run(idx):
        with torch.no_grad():
            block, columns, f = rows([injections[i] for i in idx])
            return block.cpu().numpy(), columns, f

    with torch.no_grad(), torch_threads(threads), matmul_precision(precision):
        threads = torch.get_num_threads()  # what the batches run on (reported in stats)
        with ThreadPoolExecutor(workers) if workers > 1 else nullcontext() as pool:
            # results are appended in batch order (rows in order need no permuting copy at the end),
            # with at most two batches per worker computed ahead
            pending: deque = deque()
            for i, idx in enumerate(batches):
                pending.append((idx, pool.submit(run, idx) if pool else None))
                while pending and (len(pending) > 2 * workers or i == len(batches) - 1):
                    idx, job = pending.popleft()
                    values, columns, f = job.result() if job else run(idx)
                    t1 = time.perf_counter()
                    written.append(np.asarray(idx), values, columns)
                    t_sparse += time.perf_counter() - t1
                    flops += f
                    del values
                    bar.update(len(idx))
    bar.close()
    _add_stats(
        stats, flops, time.perf_counter() - t0 - t_sparse, t_sparse, len(batches), threads, workers, False
    )
    return written.to_csr()


def _add_stats(stats, flops, t_backward, t_sparse, n_batches, threads, workers, resident) -> None:
    if stats is None:
        return
    stats["flops"] = stats.get("flops", 0) + flops
    stats["seconds_backward"] = stats.get("seconds_backward", 0.0) + t_backward
    stats["seconds_sparse"] = stats.get("seconds_sparse", 0.0) + t_sparse
    stats["batches"] = stats.get("batches", 0) + n_batches
    stats["threads"], stats["workers"], stats["resident"] = threads, workers, resident


def _live_tensors(rows: _BatchRows) -> int:
    """`[P, B, d_model]` tensors a batch keeps alive at once (step 5): the walk's gradient and two
    temporaries of attention, the write-site gradients a contraction reads (all layers above a
    cross-layer transcoder's), and the contraction's concatenation of them."""
    reads = max([len(x.reads) for x in rows.layers], default=1)
    return 4 + 2 * reads


def _device_plan(
    lb: LinearBackward,
    rows: _BatchRows,
    injections: list,
    key: list,
    order: list,
    row_bytes: int,
    batch_size: int | None,
) -> tuple[BatchBudget, list[list[int]], int]:
    """Step 8's budget and batches on `lb.device` (batch_plan.budget_for), and the bytes the rows
    take there: they stay on the device when the plan's blocks fit. Asked first with each row alone
    at its own position (the least any plan holds), then again with the plan's own blocks, which
    merged positions make larger (rows carry the columns of their band's last position); where those
    do not fit or leave less for the working tensors, the plan is made again from that answer.
    Counting all columns for every row instead (3.4 times as much on the Llama-1B shape, at 32 and
    at 128 tokens) sent graphs that fit to the host batch by batch."""
    live, entry = _live_tensors(rows), torch.finfo(lb.out_dtype).bits // 8  # bytes of one stored edge
    runs: dict = {}
    for i in order:  # the rows of one (start, position) share their block width
        runs.setdefault(key[i], [i, 0])[1] += 1
    least = sum(n * rows.width([injections[i]]) for i, n in runs.values()) * entry
    budget = budget_for(lb.device, least, live)
    batches = plan_batches(key, order, row_bytes, budget, batch_size)
    if not budget.resident:
        return budget, batches, least
    need = sum(len(b) * rows.width([injections[i] for i in b]) for b in batches) * entry
    again = budget_for(lb.device, need, live)
    if again.resident and again.work_bytes >= budget.work_bytes:
        return budget, batches, need
    return again, plan_batches(key, order, row_bytes, again, batch_size), need


def _resident_rows(
    lb: LinearBackward,
    rows: _BatchRows,
    injections: list,
    batches: list[list[int]],
    progress: bool,
    stats: dict | None,
    precision: str,
    keep_on_device: bool,
) -> sp.csr_array | DeviceRows:
    """Step 8: every batch writes its block into its slice of one device buffer, sized before the
    first batch; the positions of all rows go to the device in one copy; nothing in the loop makes
    the host wait for the device."""
    t0 = time.perf_counter()
    reach = [rows.reach([injections[i] for i in idx]) for idx in batches]
    columns = [rows.block_columns(*r)[0] for r in reach]
    sizes = np.array([len(idx) * len(c) for idx, c in zip(batches, columns)], np.int64)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    out = DeviceRows(
        len(injections),
        rows.sources.n_columns,
        torch.empty(int(starts[-1]), dtype=lb.out_dtype, device=lb.device),
        [(np.asarray(idx), c, int(at)) for idx, c, at in zip(batches, columns, starts[:-1])],
    )
    flat = np.concatenate(batches) if batches else np.zeros(0, np.int64)
    positions = torch.from_numpy(np.array([injections[i].position for i in flat], np.int64)).to(lb.device)
    rows.stack()
    bar = tqdm(total=len(injections), desc="attribution (linear)", unit="target", disable=not progress)
    flops, at = 0.0, 0
    with torch.no_grad(), matmul_precision(precision):
        for i, idx in enumerate(batches):
            _, _, f = rows([injections[j] for j in idx], positions[at : at + len(idx)], out.block(i))
            flops += f
            at += len(idx)
            bar.update(len(idx))
    bar.close()
    t1 = time.perf_counter()
    result = out if keep_on_device else out.to_csr()
    _add_stats(stats, flops, t1 - t0, time.perf_counter() - t1, len(batches), 1, 1, True)
    return result


def largest_product(lb: LinearBackward, layers: list[_LayerDecoders], shapes: list[tuple[int, int]]) -> float:
    """Flops (multiply-adds x 2) of the largest matrix product of batches of `shapes` (targets,
    positions): attention's `[P B, d] @ [d, H dh]`, the skip's `[P B, d] @ [d, d]` or one position's
    contraction, at most `[B, n_out d] @ [n_out d, k]`."""
    d = lb.W_U_T.shape[1]
    per_row = max([d * W.shape[0] for W in lb.W_O] + [d * d for W in lb.W_skip if W is not None])
    per_target = max([D.shape[0] * k for x in layers for D, k in zip(x.dec, x.k)], default=0)
    return 2.0 * max((max(B * P * per_row, B * per_target) for B, P in shapes), default=0)


BACKENDS = ("auto", "linear", "autograd")


def rows_engine(backend: str, rm: ReplacementModel, injections: list):
    """The rows function for `backend`: "linear" (this module), "autograd" (autograd_rows.backward_rows),
    or "auto" (linear when `unsupported_reason` is None, else autograd)."""
    if backend not in BACKENDS:
        raise OptionError(f"backend is {backend!r}; pass one of {BACKENDS}.")
    if backend == "autograd" or (backend == "auto" and unsupported_reason(rm, injections) is not None):
        return backward_rows
    return linear_rows

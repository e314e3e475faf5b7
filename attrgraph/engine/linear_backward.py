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
   g' = `ln1_post^T g`; the result is the gradient at `resid_post[j-1]`; after layer 0 it is the
   gradient at the embedding (token and positional embeddings enter the residual stream additively).
4. Only what a target can reach is computed: everything is causal, so a batch of targets sorted
   by position is cut to positions `<= max position` of the batch; batches never mix start layers,
   so a feature of layer l only walks layers < l (plus the attention of l). That first attention
   sees one query position per target: `u_h = W_V[h] W_O[h] g` once, spread over the keys by the
   pattern row `A[h, p, :]` (d_head times fewer products than the general step). A batch is
   also closed when its [B, P, d_model] working tensor would pass `WORK_BYTES` (keeping at least
   `MIN_ROWS` targets): small batches are cut to tighter positions, so this saves both memory
   and flops (at 6/256/4096: -15% flops, -20% time, -0.2 GB peak against batches of 512).
5. Source contraction as in attribute.py step 5: embedding and error columns are `v_out . grad`,
   feature columns are products `[B, n_out d_model] @ [n_out d_model, k]` with the active
   features' scaled decoder rows, one matrix product per (layer, position) group. Each layer is
   contracted as soon as the walk has passed it, and write-site gradients that no lower layer reads
   are dropped then: a per-layer transcoder's batch keeps a few [B, P, d_model] tensors alive, not
   one per layer (a cross-layer transcoder's features read every layer above them).

6. Threads (threads.py): the products of a batch are small (~0.1 GFLOP at 1 MiB working tensors),
   and with OpenMP's default spin-waiting, two threads beside another busy process made a
   6-layer graph 5-30x slower than one thread (threads.py). The batches therefore run on one thread unless
   their largest product passes `threads.PARALLEL_FLOPS` or `OMP_WAIT_POLICY=PASSIVE` is set
   (then the caller's thread count); the caller's setting is restored after.

7. Attention features (replacement.py step 6): with an attention set the attention output is cut
   like the MLP output. The walk then passes resid_mid[j] to resid_pre[j] unchanged and yields the
   gradient at resid_mid[j] as the attention write-site gradient of layer j (contracted with the
   attention errors and features of layer j); an attention feature target of layer l injects its
   encoder vector at the attention output, whose frozen attention (`attention_back_at`, ln1_post
   included) gives the gradient at resid_pre[l], and walks on from layer l - 1.

Only models and targets whose frozen backward is covered by steps 1-3 take this path
(`unsupported_reason` says why not); `attribute(..., backend="auto")` falls back to autograd.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np
import scipy.sparse as sp
import torch
from torch import Tensor
from tqdm.auto import tqdm

from attrgraph.engine.autograd_rows import backward_rows
from attrgraph.engine.csr_rows import CsrRowWriter
from attrgraph.engine.precision import compute_dtype, numpy_dtype
from attrgraph.engine.threads import threads_for, torch_threads
from transcoders import sites

if TYPE_CHECKING:
    from attrgraph.engine.replacement import ReplacementModel

RESID_MID = "blocks.{layer}.hook_resid_mid"
WORK_BYTES = 1 << 20
"""Largest [B, P, d_model] working tensor of one batch (step 4): bigger batches are split, down to
`MIN_ROWS` targets. Small batches cost no speed here: they are cut to tighter positions."""
MIN_ROWS = 16
_READS = (sites.MLP_INPUT, RESID_MID)


class _Norm:
    """A norm with its scale frozen at the recorded values: `back(g)` is `J^T g` (step 2)."""

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

    def back(self, g: Tensor) -> Tensor:
        if self.identity:
            return g
        g = g * self.factor[: g.shape[-2]]
        return g - g.mean(-1, keepdim=True) if self.center else g

    def fold(self, W: Tensor) -> Tensor:
        """`W` [n, d_model] with the norm's weight and centering folded into its columns, so that
        `back(x @ W) == scale(x @ fold(W))` (the per-position 1/s is all that is left)."""
        if self.identity:
            return W
        W = W * self.w if self.w is not None else W
        return (W - W.mean(-1, keepdim=True)).contiguous() if self.center else W.contiguous()

    def scale_(self, g: Tensor) -> Tensor:
        """The per-position factor 1/s of a folded product, applied in place (g is a fresh product)."""
        return g if self.identity else g.mul_(self.inv[: g.shape[-2]])


def unsupported_reason(rm: ReplacementModel, injections) -> str | None:
    """Why the fast path cannot compute these rows (None when it can)."""
    cfg = rm.cfg
    if rm.tc.cfg.input_hook not in _READS:
        return f"the transcoders read {rm.tc.cfg.input_hook!r}"
    if any(j.hook is not None for j in injections):
        return "a custom target reads an arbitrary hook"
    for flag in ("parallel_attn_mlp", "attn_only", "use_split_qkv_input", "use_attn_in", "post_embedding_ln"):
        if getattr(cfg, flag, False):
            return f"the model sets {flag}"
    if cfg.positional_embedding_type not in ("standard", "rotary"):
        return f"positional embedding {cfg.positional_embedding_type!r}"
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
    """The frozen model's transposed Jacobian, precomputed per layer (steps 1-3)."""

    def __init__(self, rm, state):
        model, fr, L = rm.model, state.frozen, rm.cfg.n_layers
        dt = compute_dtype(state.errors.dtype)  # float32 for a half-precision model (precision.py)
        self.L, self.dtype, self.device = L, dt, state.errors.device

        def norm(module, hook):
            return _Norm(module, fr[hook][0] if hook in fr else None, dt)

        self.ln1, self.ln2, self.ln1_post, self.ln2_post = [], [], [], []
        self.W_O, self.W_V, self.pattern, self.W_skip = [], [], [], []
        for l, block in enumerate(model.blocks):
            self.ln1.append(norm(block.ln1, f"blocks.{l}.ln1.hook_scale"))
            self.ln2.append(norm(block.ln2, f"blocks.{l}.ln2.hook_scale"))
            self.ln1_post.append(norm(getattr(block, "ln1_post", None), f"blocks.{l}.ln1_post.hook_scale"))
            raw = sites.raw_output_needed(model, rm.tc.cfg, l)
            self.ln2_post.append(
                norm(sites.post_norm(model, l) if raw else None, f"blocks.{l}.ln2_post.hook_scale")
            )
            W_O = block.attn.W_O.detach().to(dt)  # [H, d_head, d_model]
            W_V = block.attn.W_V.detach().to(dt)  # [H, d_model, d_head]
            H, dh, d = W_O.shape
            self.W_O.append(W_O.reshape(H * dh, d).contiguous())
            # [H*dh, d] with ln1's weight and centering folded in (step 2: only 1/s is left to apply)
            self.W_V.append(self.ln1[l].fold(W_V.permute(1, 0, 2).reshape(d, H * dh).T))
            # A^T as [H, k, q], each key row k scaled by ln1's 1/s at k (step 2: the last factor of
            # the folded W_V), so that the attention step ends with a product, not a scaling pass
            pattern = fr[f"blocks.{l}.attn.hook_pattern"][0].to(dt).transpose(-1, -2)
            if not self.ln1[l].identity:
                pattern = pattern * self.ln1[l].inv.view(1, -1, 1)
            self.pattern.append(pattern.contiguous())
            ws = rm.tc.W_skip
            fold = self.ln2[l].fold if rm.tc.cfg.input_hook == sites.MLP_INPUT else (lambda W: W.contiguous())
            self.W_skip.append(None if ws is None else fold(ws[l].detach().to(dt).T))
        self.ln_final = norm(getattr(model, "ln_final", None), "ln_final.hook_scale")
        self.W_U_T = model.W_U.detach().to(dt).T.contiguous()  # [d_vocab, d_model]
        self.read_mid = rm.tc.cfg.input_hook == sites.MLP_INPUT
        self.attn_cut = rm.attn is not None  # step 7
        self.flops = 0

    def read_back(self, l: int, g: Tensor) -> Tensor:
        """Gradient at resid_mid[l] from a gradient at the transcoder's read site x[l]."""
        return self.ln2[l].back(g) if self.read_mid else g

    def attention_back(self, l: int, g: Tensor) -> Tensor:
        """Gradient at resid_pre[l] added by the frozen attention of layer l (g at resid_mid[l])."""
        B, P, d = g.shape
        H = self.pattern[l].shape[0]
        g = self.ln1_post[l].back(g)
        gz = g @ self.W_O[l].T  # [B, P, H*dh]
        dh = gz.shape[-1] // H
        # one [P, P] @ [P, B*dh] product per head (A^T is stored as [H, k, q]); each name is
        # dropped as soon as it is used, so that at most two [B, P, d] temporaries are alive
        gz = gz.view(B, P, H, dh).permute(2, 1, 0, 3).reshape(H, P, B * dh)
        gv = torch.bmm(self.pattern[l][:, :P, :P], gz)
        del gz
        gv = gv.view(H, P, B, dh).permute(2, 1, 0, 3).reshape(B, P, H * dh)
        gx = gv @ self.W_V[l]  # ln1's 1/s is already in the pattern's rows
        del gv
        self.flops += 4 * B * P * d * H * dh + 2 * B * H * P * P * dh
        return gx

    def attention_back_at(self, l: int, g: Tensor, positions: Tensor) -> Tensor:
        """`attention_back` when row b of g is nonzero only at `positions[b]` (a feature target's
        first attention, step 4)."""
        B, P, d = g.shape
        H = self.pattern[l].shape[0]
        rows = torch.arange(B, device=g.device)
        g1 = self.ln1_post[l].back(g)[rows, positions]
        gz = (g1 @ self.W_O[l].T).view(B, H, -1)  # [B, H, dh]
        dh = gz.shape[-1]
        # per head, the value-side vector u_h = W_V[h] gz_h, then spread over keys by A[h, p_b, k]
        u = torch.bmm(gz.transpose(0, 1), self.W_V[l].view(H, dh, d)).transpose(0, 1)  # [B, H, d]
        # A[h, p_b, k] as [B, k, H], contiguous: a strided batch of tiny products is very slow multi-threaded
        a = self.pattern[l][:, :P, positions].permute(2, 1, 0).contiguous()
        gx = torch.bmm(a, u)  # ln1's 1/s is already in the pattern's rows
        self.flops += 2 * B * d * H * dh * 2 + 2 * B * P * H * d
        return gx

    def walk(self, g: Tensor, start: int, at_mid: bool, positions: Tensor | None = None):
        """Step 3: from g at resid_post[start] (or resid_mid[start] when `at_mid`) down to the embedding.
        `positions[b]`: the only nonzero position of row b when `at_mid` (a feature target).
        Yields `("mlp", l, write-site gradient of layer l)` from the top layer down (with an attention
        set also `("attn", l, attention write-site gradient)` after it, step 7), then `("embed", -1,
        embedding gradient)`; a caller that drops what it no longer needs keeps a few [B, P, d_model]
        tensors alive instead of one per layer."""
        for l in range(start, -1, -1):
            # each step's result is a fresh tensor: add g into it rather than allocate a third one
            # (g itself may be held by the caller as a write-site gradient)
            if l == start and at_mid:
                if self.attn_cut:
                    yield "attn", l, g
                    continue
                g = self.attention_back_at(l, g, positions).add_(g)
                continue
            w = self.ln2_post[l].back(g)
            yield "mlp", l, w
            if self.W_skip[l] is not None:
                skip = w @ self.W_skip[l]
                g = (self.ln2[l].scale_(skip) if self.read_mid else skip).add_(g)
                self.flops += 2 * w.numel() * w.shape[-1]
            del w
            if self.attn_cut:
                yield "attn", l, g
                continue
            g = self.attention_back(l, g).add_(g)
        yield "embed", -1, g

    def start(self, injections, P: int) -> tuple[Tensor, int, bool]:
        """Step 1 for a batch with one start (all logits, or all reads of one layer)."""
        B, d = len(injections), self.W_U_T.shape[1]
        dev = self.device
        g = torch.zeros(B, P, d, dtype=self.dtype, device=dev)
        j0 = injections[0]
        rows = torch.arange(B, device=dev)
        positions = torch.tensor([j.position for j in injections], device=dev)
        v = torch.stack([j.vector.to(device=dev) for j in injections]).to(self.dtype)
        if j0.logits:
            u = v @ self.W_U_T
            self.flops += 2 * u.numel() * v.shape[-1]
            g[rows, positions] = u
            return self.ln_final.back(g), self.L - 1, False
        g[rows, positions] = v
        if j0.site == "attn":  # step 7: through the frozen attention of its layer, on from below it
            return self.attention_back_at(j0.layer, g, positions), j0.layer - 1, False
        return self.read_back(j0.layer, g), j0.layer, True


class _LayerDecoders:
    """The scaled decoder rows of one source layer, padded per position for one batched product (step 5)."""

    def __init__(self, sources, layer: int, dtype, device=None, attn: bool = False):
        groups, decoders = (
            (sources.attn_groups, sources.attn_decoders) if attn else (sources.groups, sources.decoders)
        )
        mine = [(p, c0, c1, dec) for (l, p, c0, c1), dec in zip(groups, decoders) if l == layer]
        self.layer, self.n = layer, len(mine)
        self.reads = range(0)
        """Layers whose write-site gradients this layer's contraction reads."""
        if not mine:
            return
        k_max = max(c1 - c0 for _, c0, c1, _ in mine)
        n_out, d = mine[0][3].shape[1:]
        self.reads = range(layer, layer + n_out)
        # index arrays: on the host for searchsorted and the CSR columns, on the device for gathers
        self.positions_np = np.array([p for p, *_ in mine])
        self.positions = torch.from_numpy(self.positions_np).to(device)
        self.dec = torch.zeros(self.n, n_out * d, k_max, dtype=dtype, device=device)
        cols, slots = [], []
        for g, (_, c0, c1, dec) in enumerate(mine):
            self.dec[g, :, : c1 - c0] = dec.reshape(c1 - c0, -1).T.to(dtype)
            cols.append(np.arange(c0, c1))
            slots.append(g * k_max + np.arange(c1 - c0))
        self.slots_np = np.concatenate(slots)
        self.cols_np, self.slots, self.k_max, self.d = (
            np.concatenate(cols),
            torch.from_numpy(self.slots_np).to(device),
            k_max,
            d,
        )

    def contract(self, gw: list, P: int) -> tuple[Tensor, np.ndarray, int] | None:
        """This layer's feature columns for a batch cut to P positions: (values [B, n], their global
        column indices (ascending), flops); None when the batch cannot reach them."""
        if not self.n or gw[self.layer] is None:
            return None
        n_g = int(np.searchsorted(self.positions_np, P))
        if n_g == 0:
            return None
        pos = self.positions[:n_g]
        reach = [
            x[:, pos] for x in gw[self.layer : self.layer + self.dec.shape[1] // self.d] if x is not None
        ]
        G = (reach[0] if len(reach) == 1 else torch.cat(reach, -1)).transpose(0, 1)  # [n_g, B, m d]
        out = torch.bmm(G, self.dec[:n_g, : G.shape[-1]])  # [n_g, B, k_max]
        n_v = int(np.searchsorted(self.slots_np, n_g * self.k_max))
        values = out.transpose(0, 1).reshape(out.shape[1], -1)[:, self.slots[:n_v]]
        return values, self.cols_np[:n_v], 2 * out.numel() * G.shape[-1]


def linear_rows(
    rm: ReplacementModel,
    state,
    sources,
    injections: list,
    batch_size: int = 256,
    progress: bool = False,
    stats: dict | None = None,
) -> sp.csr_array:
    """Rows of the attribution graph for `injections` (same contract as `autograd_rows.backward_rows`).

    `stats`, when given, receives `flops` (multiply-adds x 2 of the backward and the contraction)."""
    reason = unsupported_reason(rm, injections)
    if reason is not None:
        raise NotImplementedError(
            f"the linear backward does not cover this case ({reason}); use backend='autograd'."
        )
    n_pos, L = state.tokens.shape[0], state.acts.shape[0]
    lb = LinearBackward(rm, state)
    dt = lb.dtype
    n_exc = sources.n_excluded
    err_cols = [n_pos + l * (n_pos - n_exc) for l in range(L)]
    embed, errors = sources.embed.to(dt), sources.errors.to(dt)
    layers = [_LayerDecoders(sources, l, dt, lb.device) for l in range(L)]
    attn_layers = [_LayerDecoders(sources, l, dt, lb.device, attn=True) for l in range(L)]  # step 7
    attn_errors = None if sources.attn_errors is None else sources.attn_errors.to(dt)
    # the lowest layer whose contraction reads the write-site gradient of layer j (j itself: errors)
    last_read = [min([j] + [d.layer for d in layers if j in d.reads]) for j in range(L)]
    # step 4: group by start (logits = L) and sort by position, keeping the original row index
    key = [
        (L if j.logits else j.layer - 0.5 if j.site == "attn" else j.layer, j.position) for j in injections
    ]
    order = sorted(range(len(injections)), key=lambda i: key[i])
    B = max(1, batch_size)
    row_bytes = embed.shape[1] * embed.element_size()  # one target, one position, [d_model]
    batches, cur = [], []
    for i in order:
        full = len(cur) == B or (
            len(cur) >= MIN_ROWS and (len(cur) + 1) * (key[i][1] + 1) * row_bytes > WORK_BYTES
        )
        if cur and (full or key[cur[0]][0] != key[i][0]):
            batches.append(cur)
            cur = []
        cur.append(i)
    if cur:
        batches.append(cur)
    # step 6: one thread unless the largest product of a batch pays for parallel waits
    threads = threads_for(largest_product(lb, layers, [(len(b), key[b[-1]][1] + 1) for b in batches]))
    n_cols = sources.n_columns
    written = CsrRowWriter(len(injections), n_cols, numpy_dtype(dt))
    bar = tqdm(total=len(injections), desc="attribution (linear)", unit="target", disable=not progress)
    t_backward = t_sparse = 0.0  # walk with contractions; CSR blocks
    with torch.no_grad(), torch_threads(threads):
        threads = torch.get_num_threads()  # what the batches run on (reported in stats)
        for idx in batches:
            t0 = time.perf_counter()
            inj = [injections[i] for i in idx]
            P = max(j.position for j in inj) + 1
            g, start, at_mid = lb.start(inj, P)
            walk = lb.walk(g, start, at_mid, torch.tensor([j.position for j in inj], device=lb.device))
            del g
            # contract each layer as soon as the walk has passed it, dropping write-site gradients
            # that no lower layer reads (all but one for per-layer transcoders)
            gw: list[Tensor | None] = [None] * L
            pieces = []  # (first column, values [B, n], global columns, ascending)
            for site, l, x in walk:
                if l < 0:
                    pieces.append((0, torch.einsum("bpd,pd->bp", x, embed[:P]), np.arange(P)))
                    break
                if site == "attn":  # step 7
                    pieces += attention_pieces(lb, sources, attn_layers[l], attn_errors, l, x, P)
                    continue
                gw[l] = x
                if P > n_exc:
                    pieces.append(
                        (
                            err_cols[l],
                            torch.einsum("bpd,pd->bp", x[:, n_exc:], errors[l, n_exc:P]),
                            np.arange(err_cols[l], err_cols[l] + P - n_exc),
                        )
                    )
                got = layers[l].contract(gw, P)
                if got is not None:
                    pieces.append((int(got[1][0]), got[0], got[1]))
                    lb.flops += got[2]
                for j in range(l, L):
                    if last_read[j] >= l:
                        gw[j] = None
                del x
            del walk, gw
            t1 = time.perf_counter()
            pieces.sort(key=lambda piece: piece[0])
            values = torch.cat([v for _, v, _ in pieces], 1).cpu().numpy()  # the batch's one copy to the host
            cols = np.concatenate([c for _, _, c in pieces])
            del pieces
            lb.flops += 2 * len(inj) * P * embed.shape[1] * (1 + L)
            written.append(np.asarray(idx), values, cols)
            del values
            bar.update(len(inj))
            t_backward, t_sparse = t_backward + t1 - t0, t_sparse + time.perf_counter() - t1
    bar.close()
    if stats is not None:
        stats["flops"] = stats.get("flops", 0) + lb.flops
        stats["seconds_backward"] = stats.get("seconds_backward", 0.0) + t_backward
        stats["seconds_sparse"] = stats.get("seconds_sparse", 0.0) + t_sparse
        stats["batches"] = stats.get("batches", 0) + len(batches)
        stats["threads"] = threads
    return written.to_csr()


def attention_pieces(
    lb: LinearBackward, sources, decoders: _LayerDecoders, errors: Tensor, l: int, x: Tensor, P: int
) -> list:
    """Step 7: the attention error and feature columns of layer l from the gradient `x` at its
    attention write site, as `(first column, values [B, n], global columns)` pieces (flops counted
    in `lb`)."""
    n_exc, pieces = sources.n_excluded, []
    if P > n_exc:
        c = sources.error_column(l, "attn")
        values = torch.einsum("bpd,pd->bp", x[:, n_exc:], errors[l, n_exc:P])
        pieces.append((c, values, np.arange(c, c + P - n_exc)))
    ga = [None] * (l + 1)
    ga[l] = x
    got = decoders.contract(ga, P)
    if got is not None:
        pieces.append((int(got[1][0]), got[0], got[1]))
        lb.flops += got[2]
    return pieces


def largest_product(lb: LinearBackward, layers: list[_LayerDecoders], shapes: list[tuple[int, int]]) -> float:
    """Flops (multiply-adds x 2) of the largest matrix product of batches of `shapes` (targets,
    positions): attention's `[B P, d] @ [d, H dh]`, the skip's `[B P, d] @ [d, d]` or one layer's
    contraction, at most `[B P, n_out d] @ [n_out d, k_max]`."""
    d = lb.W_U_T.shape[1]
    per_row = max(
        [d * W.shape[0] for W in lb.W_O]
        + [d * d for W in lb.W_skip if W is not None]
        + [x.dec.shape[1] * x.k_max for x in layers if x.n]
    )
    return 2.0 * max((B * P for B, P in shapes), default=0) * per_row


BACKENDS = ("auto", "linear", "autograd")


def rows_engine(backend: str, rm: ReplacementModel, injections: list):
    """The rows function for `backend`: "linear" (this module), "autograd" (autograd_rows.backward_rows),
    or "auto" (linear when `unsupported_reason` is None, else autograd)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend is {backend!r}; pass one of {BACKENDS}.")
    if backend == "autograd" or (backend == "auto" and unsupported_reason(rm, injections) is not None):
        return backward_rows
    return linear_rows

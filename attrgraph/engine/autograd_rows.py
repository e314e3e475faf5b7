"""The reference rows engine: one autograd backward per batch of targets through the frozen model.

Seed: circuit-tracing appendix, "Attribution Graph Computation".

1. Build the frozen model once with a batch of `batch_size` copies of the prompt: patterns and
   scales replaced by the recorded values, MLP outputs replaced by constants plus the live skip
   term, and zero "probe" leaves added at the embedding and at every MLP write site
   (`ReplacementModel.frozen(probes=True)`).
2. For each batch of targets, inject each target's input vector at its read point and run one
   backward pass (`torch.autograd.grad`, graph retained). The gradient at the embedding probe and
   the write-site probes is `J^T v_in` for every source position and layer at once.
3. Edges (target t, source s): embedding and error sources `A[t, s] = v_out_s . grad`; a feature
   source `A[t, s] = a_s * sum_{l >= l_s} W_dec_s^l . grad_l[pos_s]`, which covers a cross-layer
   transcoder's decoders to every later layer (gradients at layers >= l_t are zero).
4. With an attention set (replacement.py step 6) the attention outputs get probes too: attention
   error and feature columns are `v_out . grad` at the attention write site of their layer, and an
   attention feature target reads the live attention output of its layer (`run.attn_reads`).

linear_backward.py computes the same rows as explicit matrix products; tests hold the two equal.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
import torch
from tqdm import tqdm

from attrgraph.engine.batch_plan import CPU_ROWS
from attrgraph.engine.csr_rows import CsrRowWriter
from attrgraph.engine.precision import compute_dtype, numpy_dtype
from attrgraph.engine.replacement import ReplacementModel, ReplacementState
from attrgraph.engine.sources import Injection, Sources
from transcoders.model_state import grad_mode


@grad_mode()  # inside a caller's torch.no_grad() or torch.inference_mode() too
def backward_rows(
    rm: ReplacementModel,
    state: ReplacementState,
    sources: Sources,
    injections: list[Injection],
    batch_size: int | None = None,
    progress: bool = False,
) -> sp.csr_array:
    """Steps 3-5: one row per injection, over the `sources.n_columns` source columns (CSR);
    `batch_size` targets a backward (default `CPU_ROWS`, as the linear engine's CPU plan)."""
    rm.check_differentiable("the autograd rows engine")
    n_pos, n_layers = state.tokens.shape[0], state.acts.shape[0]
    B = max(1, min(CPU_ROWS if batch_size is None else batch_size, len(injections)))
    # gradients have the model's dtype; rows and the decoder contraction are float32 at least
    dtype, device = compute_dtype(state.errors.dtype), state.errors.device
    constant = rm.constant(state)
    hooks = tuple(sorted({j.hook for j in injections if j.hook is not None}))
    n_emb, n_exc = n_pos, sources.n_excluded
    err_cols = [n_emb + l * (n_pos - n_exc) for l in range(n_layers)]
    written = CsrRowWriter(len(injections), sources.n_columns, numpy_dtype(dtype))
    bar = tqdm(total=len(injections), desc="attribution", unit="target", disable=not progress)
    with torch.enable_grad(), rm.frozen(state, constant, batch=B, probes=True, capture=hooks) as run:
        logits = rm.model(state.tokens[None].expand(B, n_pos))
        for start in range(0, len(injections), B):
            batch = injections[start : start + B]
            outputs, grads = [], []
            by_site: dict = {}
            for i, j in enumerate(batch):
                key = (
                    ("logits",)
                    if j.logits
                    else (
                        ("hook", j.hook)
                        if j.hook
                        else ("attn", j.layer)
                        if j.site == "attn"
                        else ("read", j.layer)
                    )
                )
                by_site.setdefault(key, []).append((i, j))
            for key, items in by_site.items():
                out = (
                    logits
                    if key[0] == "logits"
                    else run.captured[key[1]]
                    if key[0] == "hook"
                    else run.attn_reads[key[1]]
                    if key[0] == "attn"
                    else run.reads[key[1]]
                )
                g = torch.zeros_like(out)
                for i, j in items:
                    g[i, j.position] += j.vector.to(g)
                outputs.append(out)
                grads.append(g)
            attn_probes = [p for p in run.attn_probes if p is not None]
            inputs = [run.embed_probe, *run.write_probes, *attn_probes]
            got = torch.autograd.grad(outputs, inputs, grads, retain_graph=True, allow_unused=True)
            g_embed, g_write = got[0], got[1 : 1 + n_layers]
            g_attn = got[1 + n_layers :]
            rows = torch.zeros(B, sources.n_columns, dtype=dtype, device=device)
            if g_embed is not None:
                rows[:, :n_emb] = torch.einsum("bpd,pd->bp", g_embed, sources.embed)
            for l, g in enumerate(g_write):
                if g is not None:
                    cols = slice(err_cols[l], err_cols[l] + n_pos - n_exc)
                    rows[:, cols] = torch.einsum("bpd,pd->bp", g[:, n_exc:], sources.errors[l, n_exc:])
            reached = [l for l, g in enumerate(g_write) if g is not None]
            if reached and sources.groups:
                # [B, P, L, d]: a (layer range, position) slice is a view, and flattens without a copy
                G = torch.zeros(B, n_pos, n_layers, g_write[reached[0]].shape[-1], dtype=dtype, device=device)
                for l in reached:
                    G[:, :, l] = g_write[l]
                for (l, p, c0, c1), dec in zip(sources.groups, sources.decoders):
                    if l > reached[-1]:
                        continue
                    n_out = dec.shape[1]
                    rows[:, c0:c1] = G[:, p, l : l + n_out].reshape(B, -1) @ dec.reshape(len(dec), -1).T
            for l, g in enumerate(g_attn):  # step 4
                if g is None:
                    continue
                c = sources.error_column(l, "attn")
                rows[:, c : c + n_pos - n_exc] = torch.einsum(
                    "bpd,pd->bp", g[:, n_exc:], sources.attn_errors[l, n_exc:]
                )
            for (l, p, c0, c1), dec in zip(sources.attn_groups, sources.attn_decoders):
                if l < len(g_attn) and g_attn[l] is not None:
                    rows[:, c0:c1] = g_attn[l][:, p] @ dec[:, 0].T
            written.append(np.arange(start, start + len(batch)), rows[: len(batch)].cpu().numpy())
            bar.update(len(batch))
    bar.close()
    return written.to_csr()

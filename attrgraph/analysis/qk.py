"""QK attribution: which pairs of (query-side, key-side) sources make a head attend where it does.

Seed: linear-computation-graphs, section 2.3 (eq. 4): the attention score of head h from query
position i to key position j is the bilinear form `score = q_i . k_j / attn_scale`, and with
everything upstream frozen both `q_i` and `k_j` are affine in the graph's sources.

1. Run the local replacement model (replacement.py): patterns, norm scales and errors frozen, so
   the residual stream at every layer is an affine function of the sources {embeddings, feature
   activations, errors}; the MLP outputs at excluded positions, attention and MLP biases, `b_dec`
   and the norms' biases make up its constant part.
2. `q_i`, the query the scores are made of (`BlockLayout.q`: after QK-norm, whose scale is frozen
   like every norm's, and after a rotary embedding, which is linear at a fixed position; never
   `attn.hook_q`, which fires before QK-norm) is then `sum_s Q[s] + q_bias`: one backward per coordinate of `q_i` through the
   frozen model (attribute.backward_rows, `d_head` targets in one batch) gives `Q[s]`, the
   contribution of source s (for a feature: `a_s * dec_s . J`); `q_bias = q_i - sum_s Q[s]`.
   The same at the key position gives `K[s]` and `k_bias` (for grouped-query attention, the
   head's key-value head).
3. The score splits over pairs: `C[s_q, s_k] = Q[s_q] . K[s_k] / attn_scale`, with "bias" as one
   more source on each side, and `sum C = score` exactly. Marginals: `C.sum(1)` is the query-side
   credit of each source, `C.sum(0)` the key-side one. A soft-capped score (Gemma-2) is
   decomposed before its cap.
4. With an attention set (`[mlp_set, attn_set]`) the attention outputs below the head's layer are
   sources too: attention features and attention errors get their own rows (`sites` says which
   rows are attention ones), so the query and key sides are split over features of both sites.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from jaxtyping import Float

from attrgraph.engine.autograd_rows import backward_rows
from attrgraph.engine.replacement import ReplacementModel
from attrgraph.engine.sources import Injection, build_sources, resolve_exclude_bos, to_tokens
from attrgraph.errors import QKError
from transcoders.arguments import shown
from transcoders.block_layout import BlockLayout
from transcoders.config import is_whole

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from transcoders.base import SparseCoder


@dataclass(frozen=True)
class QKAttribution:
    """The score of one head and (query, key) pair split over pairs of sources (step 3)."""

    layer: int
    head: int
    query_position: int
    key_position: int
    score: float
    """`q_i . k_j / attn_scale` (before any soft cap)."""
    labels: list[str]
    """Source labels, graph order (embeddings, errors, features), then "bias"."""
    keys: np.ndarray
    """[n_sources + 1, 3] (layer, position, feature) per source; feature -1 for embeddings/errors,
    layer -1 for embeddings and for the bias row."""
    Q: Float[np.ndarray, "n_sources_plus_1 d_head"]
    """Each source's part of `q_i`; the last row is `q_bias`."""
    K: Float[np.ndarray, "n_sources_plus_1 d_head"]
    """Each source's part of `k_j`; the last row is `k_bias`."""
    attn_scale: float
    sites: np.ndarray | None = None
    """[n_sources + 1] site of each row: "mlp" or "attn" for features and errors, "" for embeddings
    and the bias row (step 4)."""

    def pair(self, s_q: int, s_k: int) -> float:
        """`C[s_q, s_k]`."""
        return float(self.Q[s_q] @ self.K[s_k] / self.attn_scale)

    def pairs(self) -> Float[np.ndarray, "n_sources_plus_1 n_sources_plus_1"]:
        """The whole matrix `C` (rows = query-side sources); fine for small prompts."""
        return self.Q @ self.K.T / self.attn_scale

    def query_marginals(self) -> np.ndarray:
        """Each source's query-side credit `Q[s] . k_j / attn_scale`."""
        return self.Q @ self.K.sum(0) / self.attn_scale

    def key_marginals(self) -> np.ndarray:
        """Each source's key-side credit `q_i . K[s] / attn_scale`."""
        return self.K @ self.Q.sum(0) / self.attn_scale

    def top_pairs(self, k: int = 10, chunk: int = 1024) -> list[tuple[str, str, float]]:
        """The `k` pairs of largest |C|, as (query-side label, key-side label, contribution)."""
        q_rows = np.flatnonzero(np.abs(self.Q).sum(1) > 0)
        k_rows = np.flatnonzero(np.abs(self.K).sum(1) > 0)
        Kt = self.K[k_rows].T / self.attn_scale
        best: list[tuple[float, int, int]] = []
        for c0 in range(0, len(q_rows), chunk):
            rows = q_rows[c0 : c0 + chunk]
            block = self.Q[rows] @ Kt
            flat = np.argsort(-np.abs(block), axis=None)[:k]
            r, c = np.unravel_index(flat, block.shape)
            best += [(float(block[a, b]), int(rows[a]), int(k_rows[b])) for a, b in zip(r, c)]
        best.sort(key=lambda x: -abs(x[0]))
        return [(self.labels[a], self.labels[b], v) for v, a, b in best[:k]]


def qk_attribution(
    model: HookedTransformer,
    transcoders: SparseCoder | ReplacementModel,
    prompt,
    layer: int,
    head: int,
    query_position: int,
    key_position: int,
    exclude_bos: bool | None = None,
    embedding: str = "token+position",
) -> QKAttribution:
    """Split the attention score of `head` at `layer` from `query_position` to `key_position` over
    pairs of sources (module docstring). Options as in `attribute`."""
    for what, value in (
        ("layer", layer),
        ("head", head),
        ("query_position", query_position),
        ("key_position", key_position),
    ):
        if not is_whole(value):
            raise QKError(f"{what} is {shown(value)}; pass a whole number.")
    rm = ReplacementModel.of(model, transcoders)
    tokens = to_tokens(model, prompt)
    cfg, P = model.cfg, len(tokens)
    if not 0 <= layer < cfg.n_layers or not 0 <= head < cfg.n_heads:
        raise QKError(
            f"head L{layer}H{head} does not exist; the model has {cfg.n_layers} layers of {cfg.n_heads} heads."
        )
    inside = -P <= query_position < P and -P <= key_position < P
    i, j = query_position % P, key_position % P
    if not inside or j > i:
        raise QKError(
            f"positions ({query_position}, {key_position}) are not a causal pair in a {P}-token prompt; pass key <= query."
        )
    exclude_bos = resolve_exclude_bos(model, tokens, exclude_bos)  # attribute's rule and check
    why = rm.layout.unsupported("qk")
    if why is not None:
        raise QKError(f"QK attribution cannot run on this model: {why}.")
    state = rm.run(tokens, exclude_bos=bool(exclude_bos), embedding=embedding)
    sources = build_sources(rm, state)
    attn = model.blocks[layer].attn
    kv_head = head // int(getattr(attn, "repeat_kv_heads", 1) or 1)
    q_name, k_name = rm.layout.q(layer), rm.layout.k(layer)
    with torch.no_grad(), rm.frozen(state, rm.constant(state), capture=(q_name, k_name)) as run:
        model(tokens[None])
        q_full, k_full = run.captured[q_name][0], run.captured[k_name][0]  # [P, heads, d_head]
    d_head = q_full.shape[-1]
    injections = []
    for name, pos, h, full in ((q_name, i, head, q_full), (k_name, j, kv_head, k_full)):
        for d in range(d_head):
            v = torch.zeros(full.shape[1:], dtype=full.dtype, device=full.device)
            v[h, d] = 1.0
            injections.append(Injection(v, pos, hook=name))
    rows = backward_rows(rm, state, sources, injections, batch_size=2 * d_head).toarray()  # [2 d_head, n_src]
    q, k = q_full[i, head].double().cpu().numpy(), k_full[j, kv_head].double().cpu().numpy()
    Q = np.vstack([rows[:d_head].T, q - rows[:d_head].sum(1)])
    K = np.vstack([rows[d_head:].T, k - rows[d_head:].sum(1)])
    scale = float(attn.attn_scale)
    labels, keys, sites = _source_labels(state, sources, getattr(model, "tokenizer", None))
    return QKAttribution(layer, head, i, j, float(q @ k / scale), labels, keys, Q, K, scale, sites)


def _source_labels(state, sources, tokenizer) -> tuple[list[str], np.ndarray, np.ndarray]:
    P, L = state.tokens.shape[0], state.acts.shape[0]
    toks = state.tokens.tolist()

    def tok(t: int) -> str:
        try:
            return repr(tokenizer.decode([t])) if tokenizer is not None else str(t)
        except Exception:
            return str(t)

    labels = [f"emb@{p} {tok(toks[p])}" for p in range(P)]
    keys = [(-1, p, -1) for p in range(P)]
    sites = [""] * P
    for site in ("mlp", "attn") if sources.attn_errors is not None else ("mlp",):
        for l in range(L):
            for p in range(sources.n_excluded, P):
                labels.append(f"{'attn ' if site == 'attn' else ''}err L{l}@{p}")
                keys.append((l, p, -1))
                sites.append(site)
    for (l, p, f), site in zip(sources.features.tolist(), sources.feature_sites()):
        labels.append(f"{'A' if site == 'attn' else 'L'}{l}/F{f}@{p} {tok(toks[p])}")
        keys.append((l, p, f))
        sites.append(str(site))
    labels.append("bias")
    keys.append((-1, -1, -1))
    sites.append("")
    return labels, np.array(keys, np.int64), np.array(sites)


def attention_score(
    model: HookedTransformer, prompt, layer: int, head: int, query_position: int, key_position: int
) -> float:
    """The model's own attention score (`hook_attn_scores`, after any soft cap), for checking `qk_attribution`."""
    tokens = to_tokens(model, prompt)
    name = BlockLayout.of(model.cfg).hook("attn_scores", layer)
    with torch.no_grad():
        _, cache = model.run_with_cache(tokens[None], names_filter=lambda n: n == name)
    return float(cache[name][0, head, query_position, key_position])

"""Coactivation statistics of chosen feature pairs over a corpus, in one streamed pass.

Seed: circuit-tracing appendix, "Interference Weights over More Features": a virtual weight between
two features whose pair never coactivates on the data is "unused" (interference); the main text's
target-weighted expected residual attribution weights a virtual weight by the expected source
activation when the target fires.

Features of several sets (e.g. an MLP set and an attention set) share one flat index:
`offset[c] + layer * d_sae[c] + feature`, the sets in the order given (`flat_index`). For the kept
pairs (source s, target t), over every counted token position (all but position 0, the BOS sink):

1. `n_both[s, t]`: positions where both are active (> 0), on the same token;
2. `n_source[s]`, `n_target[t]`: positions where each is active;
3. `sum_source[s, t]`: the sum of `a_s` over positions where t is active, so that
   `mean_source_given_target = sum_source / n_target` is `E[a_s | t active]` (NaN if t never fires).

Per chunk of activations `a` [n_positions, n_features], restricted to the features the pairs use,
two sparse products give every pair at once: `(a_S > 0)^T (a_T > 0)` and `a_S^T (a_T > 0)`
(cost: the products of active counts per position, not positions x pairs); the kept pairs are
gathered from them. The state is four numbers per pair and one per feature: memory is bounded by
the pairs kept, not by the corpus.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch
from torch import Tensor

from transcoders.arguments import shown
from transcoders.config import is_whole
from transcoders.errors import ConfigError
from transcoders.sites import check_hooked_model

DENSE_LIMIT = 1 << 24
"""Above this many (source, target) cells a chunk's products stay sparse while the pairs are gathered."""


def _check_coders(coders) -> list:
    from transcoders.base import SparseCoder

    if hasattr(coders, "cfg") or isinstance(coders, str) or not isinstance(coders, Sequence):
        raise ConfigError(
            f"coders is a {type(coders).__name__}; pass a list of sets, e.g. [mlp_set] or [mlp_set, attn_set]."
        )
    odd = [c for c in coders if not isinstance(c, SparseCoder)]
    if odd or not coders:
        what = f"holds {shown(odd[0])}" if odd else "is empty"
        raise ConfigError(f"coders {what}; pass a list of sets, e.g. [mlp_set] or [mlp_set, attn_set].")
    return list(coders)


def _check_index(name: str, value, n: int) -> None:
    if not is_whole(value) or not 0 <= value < n:
        raise ConfigError(f"{name} is {value!r}; pass an integer in [0, {n}).")


def flat_index(coders: Sequence, which: int, layer: int, feature: int) -> int:
    """The flat index of (set number `which`, layer, feature) among `coders` (module docstring)."""
    coders = _check_coders(coders)
    _check_index("which", which, len(coders))
    _check_index("layer", layer, coders[which].cfg.n_layers)
    _check_index("feature", feature, coders[which].cfg.d_sae)
    offset = sum(c.cfg.n_layers * c.cfg.d_sae for c in coders[:which])
    return offset + layer * coders[which].cfg.d_sae + feature


@dataclass
class Coactivation:
    """The statistics of each kept pair (module docstring), arrays aligned with `pairs`."""

    pairs: np.ndarray
    """[n_pairs, 2] (source, target) flat feature indices."""
    n_both: np.ndarray
    """Positions where source and target are both active."""
    n_source: np.ndarray
    """Positions where the source is active."""
    n_target: np.ndarray
    """Positions where the target is active."""
    sum_source: np.ndarray
    """Sum of the source's activation over the positions where the target is active."""
    n_positions: int
    """Positions counted."""

    @property
    def mean_source_given_target(self) -> np.ndarray:
        """`E[a_s | t active]` (NaN where the target never fired)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.n_target > 0, self.sum_source / np.maximum(self.n_target, 1), np.nan)

    @property
    def ever(self) -> np.ndarray:
        """Whether each pair ever coactivated (the appendix's "used" weights)."""
        return self.n_both > 0


class CoactivationAccumulator:
    """The streamed state for a fixed list of pairs; `update(acts)` per chunk, `result()` at the end."""

    def __init__(self, pairs, n_features: int):
        given = np.asarray(pairs)
        if given.shape == (2,):  # one (source, target) pair
            given = given[None]
        if given.ndim != 2 or given.shape[1] != 2 or (given.size and given.dtype.kind not in "iu"):
            raise ConfigError(
                f"pairs is a {given.dtype} array of shape {given.shape}; pass [n_pairs, 2] integer "
                "(source, target) flat feature indices (flat_index)."
            )
        pairs = given.astype(np.int64)
        if len(pairs) and (pairs.min() < 0 or pairs.max() >= n_features):
            raise ConfigError(f"pairs name features outside [0, {n_features}); pass flat feature indices.")
        self.pairs, self.n_features = pairs, n_features
        self.sources, src = np.unique(pairs[:, 0], return_inverse=True)
        self.targets, tgt = np.unique(pairs[:, 1], return_inverse=True)
        self.src, self.tgt = src.reshape(-1), tgt.reshape(-1)
        n = len(pairs)
        self.n_both = np.zeros(n, np.int64)
        self.sum_source = np.zeros(n, np.float64)
        self.n_source_f = np.zeros(len(self.sources), np.int64)
        self.n_target_f = np.zeros(len(self.targets), np.int64)
        self.n_positions = 0

    def state_bytes(self) -> int:
        arrays = [
            self.pairs,
            self.src,
            self.tgt,
            self.n_both,
            self.sum_source,
            self.n_source_f,
            self.n_target_f,
        ]
        return sum(a.nbytes for a in arrays)

    @torch.no_grad()
    def update(self, acts: Tensor | np.ndarray) -> None:
        """`acts` [n_positions, n_features]: activations of the counted positions of one chunk."""
        acts = torch.as_tensor(acts)
        if acts.dim() != 2 or acts.shape[1] != self.n_features:
            raise ConfigError(f"acts has shape {tuple(acts.shape)}; pass [n_positions, {self.n_features}].")
        a_s = acts[:, torch.as_tensor(self.sources)].double().cpu().numpy()
        on_t = (acts[:, torch.as_tensor(self.targets)] > 0).cpu().numpy()
        T = sp.csr_array(on_t.astype(np.float64))
        both = (sp.csr_array((a_s > 0).astype(np.float64)).T @ T).tocsr()
        summed = (sp.csr_array(a_s).T @ T).tocsr()
        if len(self.sources) * len(self.targets) <= DENSE_LIMIT:  # gathering from dense is faster
            both, summed = both.toarray(), summed.toarray()
        self.n_both += np.rint(np.asarray(both[self.src, self.tgt])).astype(np.int64).reshape(-1)
        self.sum_source += np.asarray(summed[self.src, self.tgt]).reshape(-1)
        self.n_source_f += (a_s > 0).sum(0)
        self.n_target_f += on_t.sum(0)
        self.n_positions += acts.shape[0]

    def result(self) -> Coactivation:
        return Coactivation(
            pairs=self.pairs,
            n_both=self.n_both.copy(),
            n_source=self.n_source_f[self.src],
            n_target=self.n_target_f[self.tgt],
            sum_source=self.sum_source.copy(),
            n_positions=self.n_positions,
        )


@torch.no_grad()
def flat_activations(model, coders: Sequence, tokens: Tensor) -> Tensor:
    """Activations of every feature of `coders` on `tokens` [B, n_ctx]: [B, n_ctx, n_features] in
    the flat order (module docstring), each set reading its own site (`sites.collect`)."""
    from transcoders.sites import collect

    out = []
    for c in coders:
        x, _ = collect(model, tokens.to(c.W_enc.device), c.cfg)
        a = c.activation(c.encode(x.to(c.dtype)))  # [B, P, L, S]
        out.append(a.reshape(*a.shape[:2], -1).float().cpu())
    return torch.cat(out, -1)


def _token_batch(tokens, d_vocab: int) -> Tensor:
    """A chunk of sequences as [B, n_ctx] int64 ids, or `ConfigError` (floats, ids outside the vocabulary)."""
    tokens = torch.as_tensor(tokens)
    if tokens.is_floating_point() or tokens.is_complex() or tokens.dtype == torch.bool:
        raise ConfigError(f"sequences hold {tokens.dtype} values; pass integer token ids.")
    if tokens.numel() and not (0 <= int(tokens.min()) and int(tokens.max()) < d_vocab):
        raise ConfigError(
            f"sequences hold token ids in [{int(tokens.min())}, {int(tokens.max())}]; the model's vocabulary is [0, {d_vocab})."
        )
    tokens = tokens.long()
    return tokens[None] if tokens.dim() == 1 else tokens


def compute_coactivation(
    model,
    coders: Sequence,
    sequences: Iterable[Tensor] | Tensor,
    pairs,
    *,
    chunk_seqs: int = 32,
    skip_first: int = 1,
) -> Coactivation | list[Coactivation]:
    """Coactivation statistics of `pairs` (flat indices, `flat_index`) over `sequences` ([n_seq,
    n_ctx] ids, or an iterable of such batches) in one pass; positions before `skip_first` are not
    counted (default: the BOS). `coders` are eval-mode sets of `model` (e.g. [mlp_set, attn_set]).
    `pairs` may be a list of pair arrays (e.g. one sampled feature set's outputs and its inputs):
    each gets its own accumulator, so that a chunk's products cover only that block; a list of
    results comes back."""
    check_hooked_model(model, ConfigError)
    coders = _check_coders(coders)
    if isinstance(sequences, str) or not isinstance(sequences, Tensor | np.ndarray | Iterable):
        raise ConfigError(
            f"sequences is {shown(sequences)}; pass token ids [n_seq, n_ctx] or an iterable of such batches."
        )
    for name, value, least in (("chunk_seqs", chunk_seqs, 1), ("skip_first", skip_first, 0)):
        if not is_whole(value) or value < least:
            raise ConfigError(f"{name} is {value!r}; pass an integer of at least {least}.")
    for c in coders:
        c.eval()
    n_features = sum(c.cfg.n_layers * c.cfg.d_sae for c in coders)
    many = isinstance(pairs, list) and len(pairs) > 0 and np.asarray(pairs[0]).ndim == 2
    accs = [CoactivationAccumulator(p, n_features) for p in (pairs if many else [pairs])]
    batches = (
        torch.as_tensor(sequences).split(chunk_seqs)  # each chunk checked as a batch of ids
        if isinstance(sequences, Tensor | np.ndarray)
        else sequences
    )
    for tokens in batches:
        tokens = _token_batch(tokens, model.cfg.d_vocab)
        a = flat_activations(model, coders, tokens)[:, skip_first:].reshape(-1, n_features)
        for acc in accs:
            acc.update(a)
    if accs[0].n_positions == 0:
        raise ConfigError(
            f"no position was counted (skip_first {skip_first}, or no sequences); pass sequences longer than skip_first."
        )
    out = [acc.result() for acc in accs]
    return out if many else out[0]

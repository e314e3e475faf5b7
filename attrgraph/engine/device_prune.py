"""Edge pruning of rows held on the device (device_rows.py), so that only the pruned graph is
copied to the host.

Seed: circuit-tracing appendix, "Graph Pruning"; steps 4-5 of graph/prune.py (`_prune_edges`),
the same numbers up to float64 rounding, on the blocks of `DeviceRows` with the nodes that step 3
dropped masked out (no copy of the node-pruned graph is made):

1. Influence on the node-pruned graph: `DeviceRows.influence` with the mask, `z = influence + w`.
2. Every nonzero entry `t <- s` of the node-pruned graph scores `|A[t, s]| / rowsum_t * z_t`.
   The cutoff is prune.find_threshold's over all of them (`edge_cutoff`), found without holding
   them all: a radix select on their float64 bits (non-negative doubles order as their bits do),
   16 bits a pass. Each pass counts and sums the scores per bin of the bits below the ones fixed
   so far, and fixes the bin where the cumulative share (from the largest score) reaches the
   threshold; once that bin holds at most `SORT_LIMIT` scores they are sorted on the host,
   as find_threshold sorts them all. A pass recomputes the scores from the blocks: memory is one
   block's scores. On a graph of the Llama-1B case's size (2.6 10^8 edges, 2 GB of float64
   scores; measured with d_model 64 on the CPU) one counting pass sufficed: with the gather and
   the pass that marks the kept edges, the scores were computed three times.
3. The rule's last step ("circuit-tracer": a feature or error node needs a kept outgoing edge, a
   feature a kept incoming one; "appendix": a feature that had an outgoing edge needs one still),
   one pass over the blocks per round of removals, until none is left.
4. The kept entries, selected on the device, copied once into the pruned graph's CSR arrays
   (`DeviceRows.select`), rows and columns numbered among the kept nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import NamedTuple

import numpy as np
import scipy.sparse as sp
import torch
from jaxtyping import Bool, Float

from attrgraph.engine.device_rows import DeviceRows
from attrgraph.graph.prune import DEFAULT_RULE, check_rule

SORT_LIMIT = 1 << 22
"""Most scores of the bin sorted on the host at the end of the select (32 MiB of float64)."""
_BITS = 16  # bits fixed per pass of the select: 2^16 bins


class DevicePruned(NamedTuple):
    """What `prune_device_edges` returns (graph/prune.py's `_prune_edges`)."""

    keep: Bool[np.ndarray, " n_nodes"]
    """The nodes kept, among those step 3 kept."""
    adjacency: sp.csr_array
    """`[n_kept, n_kept]`: the kept edges among the kept nodes, on the host."""
    influence: Float[np.ndarray, " n_kept"]
    """Each kept node's influence in the node-pruned graph (step 1)."""


def edge_cutoff(scores: Callable[[], Iterable[torch.Tensor]], threshold: float) -> float:
    """prune.find_threshold over the scores that each call of `scores()` yields (float64 tensors on
    one device; a negative value is no score: an entry that is not an edge): the smallest score to
    keep so that the kept ones make up `threshold` of the total (module docstring, step 2). Memory:
    2^16 bins and one tensor at a time; the host reads from the device once a pass, and once for the
    last bin's scores."""
    if threshold >= 1.0:
        return -np.inf
    bins, total, fixed, shift, prefix = 1 << _BITS, 0.0, 0.0, 64 - _BITS, 0
    while True:
        counts = sums = None
        for s in scores():
            s, bits, valid = _bits(s)
            key = (bits >> shift) & (bins - 1)
            if shift < 64 - _BITS:  # only the bin fixed so far
                valid &= (bits >> (shift + _BITS)) == prefix
            key = torch.where(valid, key, bins)  # the others to an extra bin
            c, w = _histogram(key, s, bins + 1)
            counts, sums = (c, w) if counts is None else (counts + c, sums + w)
        if counts is None:
            return -np.inf
        counts, sums = torch.stack([counts[:bins].double(), sums[:bins]]).cpu().numpy()
        if shift == 64 - _BITS:
            total = float(sums.sum())
            if counts.sum() == 0 or total <= 0:
                return -np.inf
        full = np.flatnonzero(counts)[::-1]  # bins from the largest scores
        cumulative = (fixed + np.cumsum(sums[full])) / total
        at = min(int(np.searchsorted(cumulative, threshold)), len(full) - 1)
        fixed += float(sums[full[:at]].sum())  # the scores of the bins above it are all kept
        prefix = (prefix << _BITS) | int(full[at])
        if counts[full[at]] <= SORT_LIMIT or shift == 0:
            break
        shift -= _BITS
    ordered = np.sort(_gather(scores, shift, prefix, int(counts[full[at]])).cpu().numpy())[::-1]
    cumulative = (fixed + np.cumsum(ordered)) / total
    return float(ordered[min(int(np.searchsorted(cumulative, threshold)), len(ordered) - 1)])


def _histogram(key: torch.Tensor, s: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The count and the sum of `s` per value of `key` (0..n-1): `torch.bincount`'s, which on a GPU
    reads its input's min and max first, two waits for the device per call."""
    ones = torch.ones(1, dtype=torch.int64, device=key.device).expand(len(key))
    counts = torch.zeros(n, dtype=torch.int64, device=key.device).index_add_(0, key, ones)
    return counts, torch.zeros(n, dtype=s.dtype, device=s.device).index_add_(0, key, s)


def _gather(scores: Callable[[], Iterable[torch.Tensor]], shift: int, prefix: int, n: int) -> torch.Tensor:
    """The `n` scores whose bits from `shift` up are `prefix` (the select's last bin, counted by its
    last pass), in one tensor, written without reading from the device: each one's place is the
    count of matches before it, kept on the device (`masked_select` would wait for its size)."""
    found, before = None, 0
    for s in scores():
        s, bits, valid = _bits(s)
        hit = valid & ((bits >> shift) == prefix)
        if found is None:
            found = torch.empty(n + 1, dtype=s.dtype, device=s.device)  # [n]: where the others go
        place = torch.cumsum(hit, 0) - 1 + before
        found.scatter_(0, torch.where(hit & (place < n), place, n), s)
        before = before + hit.sum()
    return found[:n]


def _bits(s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Scores flat (non-scores as 0, -0 as 0), their bits, and which are scores: non-negative
    doubles order as their bits do."""
    s = s.reshape(-1)
    valid = s >= 0
    s = torch.where(valid, s, 0.0).abs()
    return s, s.view(torch.int64), valid


def prune_device_edges(
    rows: DeviceRows,
    kind: np.ndarray,
    logit_weights: Float[np.ndarray, " n_nodes"],
    keep: Bool[np.ndarray, " n_nodes"],
    blocks: list[tuple[int, int]],
    first_node: int,
    edge_threshold: float,
    rule: str = DEFAULT_RULE,
) -> DevicePruned:
    """Steps 1-4 of the module docstring on the graph of `rows` (row r is node `first_node + r`,
    a column is a node; `kind` and `logit_weights` per node, `blocks` graph.NODE_ORDER's
    `layer_blocks`) restricted to the nodes `keep` (prune.select_nodes by `rule`)."""
    check_rule(rule)
    dev, n = rows.buffer.device, len(kind)
    w = np.asarray(logit_weights, np.float64)
    mask = torch.as_tensor(np.asarray(keep, np.float64), device=dev)
    influence = rows.influence(w, blocks, np.zeros(n, bool), first_node, keep=keep).influence
    z = torch.as_tensor(influence + w, device=dev)  # prune.py: the edge score's factor, as summed there
    batches = range(len(rows.batches))

    def scores(i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch i's scores `[B, n]` and where the node-pruned graph has an entry."""
        a = rows.abs(i, mask, first_node)
        nodes, _ = rows.nodes_and_columns(i, first_node)
        rowsum = a.sum(1, keepdim=True)
        return a / torch.where(rowsum > 0, rowsum, 1.0) * z[nodes][:, None], a != 0

    def entries():
        for i in batches:
            s, entry = scores(i)
            yield torch.where(entry, s, -1.0)

    cutoff = edge_cutoff(entries, edge_threshold)
    edges = []  # per batch: its kept edges (a bool block), kept until the graph is copied
    had_out = torch.zeros(n, dtype=torch.bool, device=dev)
    for i in batches:
        s, entry = scores(i)
        edges.append(entry & (s >= cutoff))
        had_out[rows.nodes_and_columns(i, first_node)[1]] |= entry.any(0)

    is_feature = torch.as_tensor(kind == "feature", device=dev)
    if rule == "circuit-tracer":  # every feature and error needs an output, every feature an input
        needs_out, needs_in = is_feature | torch.as_tensor(kind == "error", device=dev), is_feature
    else:  # a feature that had outputs needs one still
        needs_out, needs_in = is_feature & had_out, torch.zeros_like(is_feature)
    kept = torch.as_tensor(np.asarray(keep, bool), device=dev)

    def kept_edges(i: int, block: torch.Tensor | None = None) -> torch.Tensor:
        """Batch i's kept edges between nodes still kept (`block`: DeviceRows.select's argument)."""
        nodes, cols = rows.nodes_and_columns(i, first_node)
        return edges[i] & kept[nodes][:, None] & kept[cols][None, :]

    while True:
        out_edges = torch.zeros(n, dtype=torch.int64, device=dev)
        has_in = torch.zeros(n, dtype=torch.bool, device=dev)
        for i in batches:
            nodes, cols = rows.nodes_and_columns(i, first_node)
            e = kept_edges(i)
            out_edges.index_add_(0, cols, e.sum(0))
            has_in[nodes] = e.any(1)
        drop = kept & (needs_out & (out_edges == 0) | needs_in & ~has_in)
        if not bool(drop.any()):
            break
        kept &= ~drop

    keep = kept.cpu().numpy()
    rank = np.where(keep, np.cumsum(keep) - 1, -1)  # a node's index among the kept ones
    n_kept = int(keep.sum())
    adjacency = rows.select(kept_edges, rank[first_node:], rank[: rows.n_cols], (n_kept, n_kept))
    return DevicePruned(keep, adjacency, influence[keep])

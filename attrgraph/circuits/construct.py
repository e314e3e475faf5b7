"""Circuits from edge scores: top-n, and the greedy construction of Hanna et al. (2024) as the PEAP seed adapts it.

1. Node graph: non-positional nodes are the upstream nodes plus the logits; an
   edge (u, d) joins u to the node d feeds (a head for its q/k/v inputs). Positional
   nodes are (node, position) plus one node per (head, q/k/v, position) for the
   head's input vectors; residual edges join (u, t) to the input at t, attention
   edges join the q input at t, or the k/v input at t', to the head's output at t.
2. top_n: the n edges of largest |score|, connected or not.
3. greedy: start from the logits; repeatedly add the edge of largest |score| whose
   child is already in the circuit (so every edge reaches the logits); stop once n
   edges lie on paths from the input (reachability from the input nodes is kept
   incrementally); return only those edges, so the circuit is connected input -> logits.
"""

from __future__ import annotations

import heapq

import numpy as np
import torch

from attrgraph.circuits.circuit import Circuit, EdgeLayout, EdgeScores
from attrgraph.errors import OptionError
from transcoders.arguments import shown
from transcoders.config import is_whole


def edge_table(layout: EdgeLayout):
    """(parent, child, n_nodes, sources, sink) of every edge in flat order (module docstring, step 1)."""
    g = layout.graph
    U, L, H = g.n_up, g.n_layers, g.n_heads
    valid = g.valid.nonzero().cpu().numpy()  # [(u, d)]
    down_node = np.array(g.down_node)
    slot_of = np.full(g.n_down, -1)  # flattened (layer, head, slot) for head inputs
    for layer in range(L):
        for s in range(3):
            for h in range(H):
                slot_of[g.down_head(layer, s, h)] = (layer * H + h) * 3 + s
    if not layout.positional:
        return valid[:, 0], down_node[valid[:, 1]], U + 1, [0], U
    S = layout.n_pos
    base = S * U
    sink = base + S * L * H * 3
    pos = np.repeat(np.arange(S), len(valid))
    u, d = np.tile(valid[:, 0], S), np.tile(valid[:, 1], S)
    parent = pos * U + u
    child = np.where(slot_of[d] >= 0, base + pos * L * H * 3 + slot_of[d], pos * U + down_node[d])
    child = np.where(d == g.down_logits, sink, child)
    att = layout.attn_valid_full().nonzero().cpu().numpy()  # [(layer, head, slot, t, t')]
    layer, h, s, t, tp = att.T
    src_pos = np.where(s == 0, t, tp)
    a_parent = base + src_pos * L * H * 3 + (layer * H + h) * 3 + s
    a_child = t * U + (1 + layer * (H + g.n_mlp) + h)
    sources = [p * U for p in range(S)]
    return np.concatenate([parent, a_parent]), np.concatenate([child, a_child]), sink + 1, sources, sink


def _check_request(scores: EdgeScores, n: int) -> None:
    if not isinstance(scores, EdgeScores):
        raise OptionError(
            f"scores is a {type(scores).__name__}, not EdgeScores; pass what eap or peap returns."
        )
    if not is_whole(n) or n < 0:
        raise OptionError(f"a circuit of {shown(n)} edges was asked for; pass 0 or more.")


def top_n(scores: EdgeScores, n: int) -> Circuit:
    """The n edges of largest |score|."""
    _check_request(scores, n)
    flat = scores.flat().abs()
    keep = torch.zeros(flat.shape, dtype=torch.bool, device=flat.device)
    keep[flat.topk(min(n, flat.numel())).indices] = True
    return Circuit.from_flat(scores.layout, keep, "top-n:" + scores.method, {"n": n})


def greedy(scores: EdgeScores, n: int) -> Circuit:
    """A circuit of (up to) n edges, every one on a path input -> logits (module docstring, step 3)."""
    _check_request(scores, n)
    parent, child, n_nodes, sources, sink = edge_table(scores.layout)
    mag = scores.flat().abs().cpu().numpy()
    order = np.argsort(child, kind="stable")
    starts = np.searchsorted(child[order], np.arange(n_nodes + 1))
    into = lambda node: order[starts[node] : starts[node + 1]]  # noqa: E731
    in_circuit = np.zeros(n_nodes, dtype=bool)
    reach = np.zeros(n_nodes, dtype=bool)
    reach[sources] = True
    chosen = np.zeros(len(parent), dtype=bool)
    out_edges: dict[int, list[int]] = {}
    heap = [(-mag[e], e) for e in into(sink)]
    heapq.heapify(heap)
    in_circuit[sink] = True
    connected = 0
    while heap and connected < n:
        _, e = heapq.heappop(heap)
        p, c = parent[e], child[e]
        chosen[e] = True
        out_edges.setdefault(p, []).append(e)
        if reach[p]:
            connected += 1
            stack = [c] if not reach[c] else []
            while stack:  # newly reachable nodes make their chosen out-edges connected
                node = stack.pop()
                if reach[node]:
                    continue
                reach[node] = True
                for e2 in out_edges.get(node, []):
                    connected += 1
                    if not reach[child[e2]]:
                        stack.append(child[e2])
        if not in_circuit[p]:
            in_circuit[p] = True
            for e2 in into(p):
                heapq.heappush(heap, (-mag[e2], e2))
    keep = torch.from_numpy(chosen & reach[parent])
    return Circuit.from_flat(scores.layout, keep, "greedy:" + scores.method, {"n": n})


def is_connected(circuit: Circuit) -> bool:
    """Whether every edge lies on a path from an input node to the logits."""
    parent, child, n_nodes, sources, sink = edge_table(circuit.layout)
    kept = circuit.flat().cpu().numpy()
    p, c = parent[kept], child[kept]
    fwd = np.zeros(n_nodes, dtype=bool)
    fwd[sources] = True
    bwd = np.zeros(n_nodes, dtype=bool)
    bwd[sink] = True
    for _ in range(n_nodes):
        changed = False
        new_f = fwd.copy()
        new_f[c[fwd[p]]] = True
        new_b = bwd.copy()
        new_b[p[bwd[c]]] = True
        changed = (new_f != fwd).any() or (new_b != bwd).any()
        fwd, bwd = new_f, new_b
        if not changed:
            break
    return bool((fwd[p] & bwd[c]).all())

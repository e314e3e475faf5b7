"""Head loadings: every edge through attention split into one term per attention head of each
layer on the way, plus the term that bypasses that layer's attention.

Asked of circuit-tracer in its issue 53; exact here because the replacement model is linear with
attention patterns and norm denominators frozen (seed: circuit-tracing appendix, "Attribution Graph
Computation"; linear-computation-graphs, section 2).

For an edge (target t, source s) of a graph, in the frozen replacement model of its prompt:

1. Forward sweep (forward-mode autodiff): the tangent of every activation with respect to the
   source's output vector (its decoders times its activation, an error or an embedding vector).
   Keep `dz[l, h]`, the tangent of head h's result `z` (`blocks.{l}.attn.hook_z`) at every position,
   and the tangent at the target's read point: `A = v_in_t . d(read_t)`, the edge itself.
2. Backward sweep (reverse-mode): the gradient `g[l, h] = d(v_in_t . read_t) / d z[l, h]`.
3. Every path from s to t crosses layer l's attention block once, either through one head or
   around it, so `A = sum_h H[l, h] + bypass[l]` for every l, with
       `H[l, h] = sum over positions and d_head of dz[l, h] * g[l, h]`
   (head h's OV circuit under its frozen pattern, whatever the norms after it) and `bypass[l]` the
   rest: paths around layer l's attention (and, for a CLT, the source's writes after it). A head
   of a layer the edge cannot pass gets exactly 0.
4. Batched: one forward per batch of distinct sources and one backward per batch of distinct
   targets give every layer's split of every edge asked for.

`frozen_forward` swaps `block.mlp` on the model for the duration of a sweep, so two threads must
not run sweeps on one model at once: `head_loadings` holds the model's lock (`model_lock`).
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.autograd.forward_ad as fwAD
from torch import Tensor

from attrgraph.bundled.loading import check_model
from attrgraph.engine.precision import compute_dtype
from attrgraph.engine.replacement import ReplacementModel
from attrgraph.errors import GraphError, OptionError
from attrgraph.graph.graph import check_graph
from attrgraph.graph.provenance import provenance_mismatch
from transcoders.arguments import shown
from transcoders.config import is_whole
from transcoders.model_state import grad_mode

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from attrgraph.graph.graph import Graph

_LOCKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()


def model_lock(model) -> threading.Lock:
    """The lock every frozen sweep of this module holds on `model` (one per model object)."""
    with _LOCKS_GUARD:
        lock = _LOCKS.get(model)
        if lock is None:
            lock = _LOCKS[model] = threading.Lock()
        return lock


@dataclass
class HeadLoadings:
    """The split of each edge asked for (module docstring, step 3)."""

    edges: np.ndarray
    """[n_edges, 2] (target node, source node) of each edge."""
    edge: np.ndarray
    """[n_edges] the edge from the forward sweep (equals the graph's adjacency entry)."""
    heads: np.ndarray
    """[n_edges, n_layers, n_heads] `H[l, h]`: the part carried by head h of layer l."""

    @property
    def bypass(self) -> np.ndarray:
        """[n_edges, n_layers] the part of each edge that bypasses layer l's attention."""
        return self.edge[:, None] - self.heads.sum(-1)

    def top_heads(self, i: int, k: int = 5) -> list[tuple[int, int, float]]:
        """The `k` heads with the largest |loading| on edge i: (layer, head, loading)."""
        h = self.heads[i]
        order = np.argsort(-np.abs(h), axis=None, kind="stable")[:k]
        return [(int(o // h.shape[1]), int(o % h.shape[1]), float(h.flat[o])) for o in order]

    def to_json(self, i: int, k: int | None = None) -> dict:
        """Edge i as plain JSON: the edge, every head's loading per layer, the bypass per layer and
        the `k` strongest heads (all with k=None)."""
        n_heads = self.heads.shape[-1]
        return dict(
            target=int(self.edges[i, 0]),
            source=int(self.edges[i, 1]),
            edge=float(self.edge[i]),
            layers=[
                dict(layer=l, heads=[float(x) for x in self.heads[i, l]], bypass=float(self.bypass[i, l]))
                for l in range(self.heads.shape[1])
            ],
            top_heads=[
                dict(layer=l, head=h, loading=v)
                for l, h, v in self.top_heads(i, self.heads[i].size if k is None else k)
            ][: (self.heads.shape[1] * n_heads if k is None else k)],
        )


# ---------------------------------------------------------------------- sources and targets
def _check_graph(rm: ReplacementModel, graph: Graph) -> None:
    why = provenance_mismatch(graph, rm.model, rm.tc, rm.attn)
    if why is not None:
        raise GraphError(
            f"{why}; pass the model and the sets ([mlp_set, attn_set] with attention features) it was built with."
        )
    if graph.meta.get("custom_targets"):
        raise GraphError("the graph has custom targets, whose vectors it does not store; use a logit graph.")


def _source_tangents(rm, state, graph, node: int, dtype) -> tuple[Tensor, Tensor | None, Tensor]:
    """The source node's output vector as tangents of (MLP constants [L,P,d], attention constants
    [L,P,d] or None, embeddings [P,d])."""
    n = graph.nodes
    L, P, d = state.errors.shape
    mlp = torch.zeros(L, P, d, dtype=dtype, device=state.errors.device)
    attn = torch.zeros_like(mlp) if rm.attn is not None else None
    emb = torch.zeros(P, d, dtype=dtype, device=state.errors.device)
    kind, l, p = str(n.kind[node]), int(n.layer[node]), int(n.position[node])
    site = str(n.site[node]) if kind in ("error", "feature") else ""
    if kind == "embedding":
        emb[p] = state.embed[p]
    elif kind == "error":
        if site == "attn":
            attn[l, p] = state.attn_errors[l, p]
        else:
            mlp[l, p] = state.errors[l, p]
    elif kind == "feature":
        f = torch.tensor([int(n.feature[node])], device=rm.tc.device)
        with torch.no_grad():
            if site == "attn":
                attn[l, p] = rm.attn.decoder_vectors(l, f)[0, 0].to(dtype) * state.attn_acts[l, p, f[0]]
            else:
                dec = rm.tc.decoder_vectors(l, f)[0].to(dtype) * state.acts[l, p, f[0]]
                mlp[l : l + dec.shape[0], p] += dec
    else:
        raise OptionError(f"node {node} is a {kind} node, which is no source; pass a source node.")
    return mlp, attn, emb


def _target_read(rm, graph, node: int, run, logits) -> tuple[Tensor, int, Tensor]:
    """(read value [B,P,*], position, input vector) of a target node in a frozen run."""
    n = graph.nodes
    kind, l, p = str(n.kind[node]), int(n.layer[node]), int(n.position[node])
    if kind == "logit":
        V = logits.shape[-1]
        v = torch.full((V,), -1.0 / V, dtype=compute_dtype(logits.dtype), device=logits.device)
        v[int(n.token[node])] += 1.0
        return logits, p, v
    if kind != "feature":
        raise OptionError(
            f"node {node} is a {kind} node, which has no inputs; pass a feature or logit target."
        )
    f = torch.tensor([int(n.feature[node])], device=rm.tc.device)
    with torch.no_grad():
        if str(n.site[node]) == "attn":
            return run.attn_reads[l], p, rm.attn.encoder_vectors(l, f)[0].detach()
        return run.reads[l], p, rm.tc.encoder_vectors(l, f)[0].detach()


# ---------------------------------------------------------------------- the sweeps
def _z_hooks(rm) -> list[str]:
    return rm.layout.hooks("z")


def _forward_sweep(rm, state, graph, sources: list[int], targets_of: dict[int, list[int]]):
    """Step 1 for a batch of sources: tangents of every head's z, and each edge's value."""
    B, P = len(sources), state.tokens.shape[0]
    dtype = state.errors.dtype
    tangents = [_source_tangents(rm, state, graph, s, dtype) for s in sources]
    constant = rm.constant(state).expand(B, *state.errors.shape)
    attn_const = rm.attn_constant(state)
    with torch.no_grad(), fwAD.dual_level():
        c = fwAD.make_dual(constant.contiguous(), torch.stack([t[0] for t in tangents]))
        ac = None
        if attn_const is not None:
            ac = fwAD.make_dual(
                attn_const.expand(B, *attn_const.shape).contiguous(), torch.stack([t[1] for t in tangents])
            )
        emb = fwAD.make_dual(
            state.embed.expand(B, *state.embed.shape).contiguous(), torch.stack([t[2] for t in tangents])
        )
        with rm.frozen(state, c, batch=B, embed=emb, attn_constant=ac, capture=tuple(_z_hooks(rm))) as run:
            logits = rm.model(state.tokens[None].expand(B, P))
            dz = []
            for h in _z_hooks(rm):
                t = fwAD.unpack_dual(run.captured[h]).tangent
                dz.append(torch.zeros_like(run.captured[h]) if t is None else t.clone())
            values = {}
            for i, s in enumerate(sources):
                for t in targets_of[s]:
                    read, p, v = _target_read(rm, graph, t, run, logits)
                    dt = fwAD.unpack_dual(read).tangent
                    values[(t, s)] = 0.0 if dt is None else float(dt[i, p].to(v.dtype) @ v)
    return torch.stack(dz, 1), values  # [B, L, P, H, dh]


def _backward_sweep(rm, state, graph, targets: list[int]) -> Tensor:
    """Step 2 for a batch of targets: the gradient of each target at every head's z."""
    B, P = len(targets), state.tokens.shape[0]
    hooks = _z_hooks(rm)
    with (
        torch.enable_grad(),
        rm.frozen(state, rm.constant(state), batch=B, probes=True, capture=tuple(hooks)) as run,
    ):
        logits = rm.model(state.tokens[None].expand(B, P))
        outputs, grads = [], []
        for i, t in enumerate(targets):
            read, p, v = _target_read(rm, graph, t, run, logits)
            g = torch.zeros_like(read)
            g[i, p] = v.to(g)
            outputs.append(read)
            grads.append(g)
        zs = [run.captured[h] for h in hooks]
        got = torch.autograd.grad(outputs, zs, grads, allow_unused=True)
    return torch.stack([torch.zeros_like(z) if g is None else g for z, g in zip(zs, got)], 1)


@grad_mode()  # inside a caller's torch.no_grad() or torch.inference_mode() too
def head_loadings(
    model: HookedTransformer,
    transcoders,
    graph: Graph,
    edges: list[tuple[int, int]] | np.ndarray | None = None,
    *,
    top: int = 100,
    batch_size: int = 32,
) -> HeadLoadings:
    """Split edges of `graph` by attention head (module docstring).

    `transcoders` are the sets the graph was built with (or a `ReplacementModel`); `edges` are
    (target node, source node) pairs, default the `top` strongest edges by |value| among feature
    and logit targets. Runs one forward per batch of `batch_size` distinct sources and one backward
    per batch of distinct targets; holds `model_lock(model)` while it does."""
    check_graph(graph, "head_loadings")
    check_model(model)
    # another thread's sweep swaps `block.mlp` under this lock: read the model (and its fingerprint)
    # only while holding it
    with model_lock(model):
        rm = ReplacementModel.of(model, transcoders)
        _check_graph(rm, graph)
        rm.check_differentiable("head_loadings")
    if not is_whole(batch_size) or batch_size < 1:
        raise OptionError(f"batch_size is {batch_size!r}; pass a whole number, at least 1.")
    if edges is None and (not is_whole(top) or top < 0):
        raise OptionError(f"top is {shown(top)}; pass 0 or more edges to explain.")
    if edges is not None:
        given = np.asarray(edges)
        if given.shape == (2,) or given.size == 0:  # one (target, source) pair; none
            given = given.reshape(-1, 2)
        if given.ndim != 2 or given.shape[1] != 2 or (given.size and given.dtype.kind not in "iu"):
            raise OptionError(
                f"edges is a {given.dtype} array of shape {given.shape}; pass (target, source) node index pairs, "
                "shape [n_edges, 2]."
            )
        edges = given.astype(np.int64)
    else:
        edges = _pick_edges(graph, top)
    n_nodes = len(graph.nodes.kind)
    if len(edges) and (edges.min() < 0 or edges.max() >= n_nodes):
        raise OptionError(f"edges name nodes outside [0, {n_nodes}); pass node indices of this graph.")
    tokens = torch.as_tensor(graph.prompt_ids, device=rm.cfg.device)
    with model_lock(rm.model):
        state = rm.run(
            tokens,
            exclude_bos=bool(graph.meta.get("exclude_bos", False)),
            embedding=str(graph.meta.get("embedding", "token+position")),
        )
        sources = sorted({int(s) for s in edges[:, 1]})
        targets = sorted({int(t) for t in edges[:, 0]})
        targets_of: dict[int, list[int]] = {}
        for t, s in edges.tolist():
            targets_of.setdefault(s, []).append(t)
        dz, values = {}, {}
        for i in range(0, len(sources), batch_size):
            batch = sources[i : i + batch_size]
            z, v = _forward_sweep(rm, state, graph, batch, targets_of)
            values.update(v)
            dz.update({s: z[j] for j, s in enumerate(batch)})
        g = {}
        for i in range(0, len(targets), batch_size):
            batch = targets[i : i + batch_size]
            gz = _backward_sweep(rm, state, graph, batch)
            g.update({t: gz[j] for j, t in enumerate(batch)})
    heads = (
        np.stack(
            [
                torch.einsum("lphk,lphk->lh", dz[s].double(), g[t].double()).cpu().numpy()
                for t, s in edges.tolist()
            ]
        )
        if len(edges)
        else np.zeros((0, rm.cfg.n_layers, rm.cfg.n_heads))
    )
    edge = np.array([values[(t, s)] for t, s in edges.tolist()], dtype=np.float64)
    return HeadLoadings(edges=edges, edge=edge, heads=heads)


def _pick_edges(graph: Graph, top: int) -> np.ndarray:
    """The `top` strongest edges by |value| into feature and logit nodes."""
    A = graph.adjacency
    A = A.tocoo() if hasattr(A, "tocoo") else __import__("scipy.sparse").sparse.coo_array(A)
    keep = np.isin(graph.nodes.kind[A.row], ("feature", "logit")) & (A.data != 0)
    rows, cols, vals = A.row[keep], A.col[keep], A.data[keep]
    order = np.argsort(-np.abs(vals), kind="stable")[:top]
    return np.stack([rows[order], cols[order]], 1).astype(np.int64)

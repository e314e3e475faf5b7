"""Adaptive (partial) attribution graphs for long prompts: explore the most influential features first.

Seed: circuit-tracing appendix, end of "Attribution Graph Computation" and of "Graph Pruning"
("we maintain a set of explored nodes ... and an estimate of the most influential nodes, where
unexplored nodes count as errors. At each step, we compute the top k most influential nodes ...
and attribute back from these. We terminate when a target number of nodes have been explored").

1. Run the model once; every active feature is a potential source. Compute the rows (incoming
   edges) of the logit targets.
2. Current estimate: the graph whose rows are those of the explored nodes; an unexplored feature
   has no inputs, so it is a leaf, like an error. Logit influence `I = B^T w` (prune.py; computed
   by streamed_influence.py without copies of the adjacency) ranks the unexplored features.
3. Explore the top `k` unexplored features by `I` (one batched backward), add their rows, and
   repeat until `max_feature_nodes` features are explored or no unexplored feature has influence.
4. The returned graph holds the embeddings, the error nodes, the explored features and the
   logits. The edges of every unexplored feature are added to the error node of its (layer,
   position, site): that node stands for "error + unexplored features" (`meta["unexplored_as_error"]`;
   an unexplored attention feature goes to the attention error node).
   Each explored target's incoming edges still sum to its pre-activation minus its bias (the
   exactness contract holds for every explored target), and the graph has
   `n_pos (1 + n_layers) + max_feature_nodes + n_logits` nodes.
Memory: the rows kept while exploring are `max_feature_nodes x n_active` (only the explored
targets have rows), never `n_active^2`; each backward batch adds `k x n_active`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np
import scipy.sparse as sp
import torch

from attrgraph.engine.linear_backward import rows_engine
from attrgraph.engine.replacement import ReplacementModel
from attrgraph.engine.sources import (
    Injection,
    build_sources,
    feature_injections,
    graph_provenance,
    node_table,
    prompt_strings,
    resolve_exclude_bos,
    target_values,
    to_tokens,
)
from attrgraph.engine.targets import DESIRED_LOGIT_PROB, MAX_N_LOGITS, select_logit_targets
from attrgraph.graph.graph import Graph
from attrgraph.graph.streamed_influence import layer_blocks, streamed_influence, streamed_influence_rows

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from transcoders.base import SparseCoder


def attribute_adaptive(
    model: HookedTransformer,
    transcoders: SparseCoder | ReplacementModel,
    prompt,
    *,
    max_feature_nodes: int = 1024,
    k: int | None = None,
    max_n_logits: int = MAX_N_LOGITS,
    desired_logit_prob: float = DESIRED_LOGIT_PROB,
    exclude_bos: bool | None = None,
    embedding: str = "token+position",
    batch_size: int = 256,
    backend: str = "auto",
    trace: list | None = None,
) -> Graph:
    """A partial attribution graph that explores at most `max_feature_nodes` features (steps 1-4).

    `k` features are explored per step (default `batch_size`). `trace`, when given, receives one
    dict per step (`n_explored`, `seconds`). Influence on the logits is filled in on the result."""

    if max_feature_nodes < 0:
        raise ValueError(f"max_feature_nodes is {max_feature_nodes}; pass 0 or more.")
    t0 = time.perf_counter()
    k = batch_size if k is None else k
    rm = transcoders if isinstance(transcoders, ReplacementModel) else ReplacementModel(model, transcoders)
    tokens = to_tokens(model, prompt)
    tokenizer = getattr(model, "tokenizer", None)
    exclude_bos = resolve_exclude_bos(model, tokens, exclude_bos)
    state = rm.run(tokens, exclude_bos=bool(exclude_bos), embedding=embedding)
    n_pos, L = len(tokens), model.cfg.n_layers
    targets = select_logit_targets(state.logits[-1], max_n_logits, desired_logit_prob, tokenizer)
    sources = build_sources(rm, state)
    feats = sources.features.cpu().numpy().reshape(-1, 3)
    sites = sources.feature_sites()
    rank = 2 * feats[:, 0] + (sites != "attn")  # blocks of one layer and site, attention first
    n_feat, n_cols, n_t = len(feats), sources.n_columns, len(targets)
    n_src = n_pos + sources.n_errors
    N = n_cols + n_t
    pos = n_pos - 1
    logit_inj = [Injection(t.vector, pos, logits=True) for t in targets]
    engine = rows_engine(backend, rm, logit_inj)
    w = np.zeros(N)
    w[n_cols:] = [t.weight for t in targets]

    def rows_for(inj) -> sp.csr_array:
        """Rows of `inj` over all N nodes (the arrays of the engine's [n, n_cols] result, not a copy)."""
        r = engine(rm, state, sources, inj, batch_size=batch_size)
        return sp.csr_array((r.data.astype(np.float32, copy=False), r.indices, r.indptr), shape=(len(inj), N))

    # step 1-3: rows of explored targets only, kept per exploration step as (nodes ascending, rows)
    row_sets = [(n_cols + np.arange(n_t), rows_for(logit_inj))]
    explored = np.zeros(0, np.int64)
    budget = min(max_feature_nodes, n_feat)
    bounds = np.searchsorted(rank, np.arange(2 * L + 1)) + n_src if n_feat else np.full(2 * L + 1, n_src)
    layer_ranges = (
        [(0, n_src)] + [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:]) if b > a] + [(n_cols, N)]
    )
    while len(explored) < budget:
        influence = streamed_influence_rows(row_sets, w, layer_ranges).influence[n_src:n_cols]
        influence[explored] = -np.inf
        order = np.argsort(-influence, kind="stable")[: min(k, budget - len(explored))]
        order = np.sort(order[influence[order] > 0])
        if not len(order):
            break
        inj = feature_injections(rm, torch.from_numpy(feats[order]), torch.from_numpy(sites[order] == "attn"))
        row_sets.append((n_src + order, rows_for(inj)))
        explored = np.concatenate([explored, order])
        if trace is not None:
            trace.append(dict(n_explored=int(len(explored)), seconds=round(time.perf_counter() - t0, 3)))

    # step 4: fold unexplored features into the error node of their (layer, position), one row set
    # at a time (the folded rows are much smaller than the raw ones, which are dropped as they go)
    explored_sorted = np.sort(explored)
    unexplored = np.setdiff1d(np.arange(n_feat), explored_sorted)
    fold = np.arange(n_cols)
    n_exc = sources.n_excluded
    fold[n_src + unexplored] = n_pos + feats[unexplored, 0] * (n_pos - n_exc) + feats[unexplored, 1] - n_exc
    if rm.attn is not None:  # attention features fold into the attention error nodes
        attn = unexplored[sites[unexplored] == "attn"]
        fold[n_src + attn] += sources.error_column(0, "attn") - sources.error_column(0, "mlp")
    keep_cols = np.concatenate([np.arange(n_src), n_src + explored_sorted])
    new_index = np.full(n_cols, -1)
    new_index[keep_cols] = np.arange(len(keep_cols))
    M = sp.csr_array(
        (np.ones(n_cols, np.float32), (np.arange(n_cols), new_index[fold])), shape=(n_cols, len(keep_cols))
    )
    folded = []  # (row nodes, rows over the kept columns)
    while row_sets:
        row_nodes, raw = row_sets.pop()
        raw = sp.csr_array((raw.data, raw.indices, raw.indptr), shape=(len(row_nodes), n_cols))
        folded.append((row_nodes, sp.csr_array(raw @ M)))
        del raw
    row_nodes = np.concatenate([n for n, _ in folded])
    body = sp.csr_array(sp.vstack([r for _, r in folded], format="csr")[np.argsort(row_nodes, kind="stable")])
    n_keep = len(keep_cols) + n_t
    adjacency = sp.vstack([sp.csr_array((n_src, len(keep_cols)), dtype=np.float32), body], format="csr")
    adjacency = sp.csr_array(
        sp.hstack([adjacency, sp.csr_array((n_keep, n_t), dtype=np.float32)], format="csr")
    )

    values = target_values(rm, state, targets, [pos] * n_t)
    full = node_table(state, sources, targets, [pos] * n_t, values, L)
    nodes = full.select(np.concatenate([keep_cols, np.arange(n_cols, N)]))
    graph = Graph(
        nodes=nodes,
        adjacency=adjacency,
        prompt_ids=tokens.cpu().numpy(),
        prompt_tokens=prompt_strings(model, tokens),
        logit_tokens=np.array([t.token for t in targets]),
        logit_probs=np.array([t.weight for t in targets]),
        logit_strings=[t.name for t in targets],
        meta=dict(
            method="adaptive",
            max_feature_nodes=int(max_feature_nodes),
            n_explored=int(len(explored)),
            n_active_features=int(n_feat),
            unexplored_as_error=True,
            **graph_provenance(model, rm, state, exclude_bos, embedding),
            max_n_logits=int(max_n_logits),
            desired_logit_prob=float(desired_logit_prob),
            attribution_seconds=round(time.perf_counter() - t0, 4),
        ),
    )
    graph.nodes.influence = streamed_influence(
        graph.adjacency, graph.logit_weights(), layer_blocks(graph.nodes)
    ).influence
    return graph

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
   The default `k` is circuit-tracer's schedule (`EXPLORE_STEP`), so that with its
   `max_feature_nodes` the two explore the same features (tests/attrgraph/engine/test_adaptive.py
   checks it against circuit-tracer; it differs only past the features with influence, where
   circuit-tracer fills its budget with features that have none).
4. The returned graph holds the embeddings, the error nodes, the explored features and the
   logits. The edges of every unexplored feature are added to the error node of its (layer,
   position, site): that node stands for "error + unexplored features" (`meta["unexplored_as_error"]`;
   an unexplored attention feature goes to the attention error node).
   Each explored target's incoming edges still sum to its pre-activation minus its bias (the
   exactness contract holds for every explored target), and the graph has
   `n_pos (1 + n_layers) + max_feature_nodes + n_logits` nodes.
Memory: the rows kept while exploring are `max_feature_nodes x n_active` (only the explored
targets have rows), never `n_active^2`; each backward batch adds `k x n_active`.

On a GPU, where the linear engine keeps each step's rows on the device (linear_backward.py step 8:
where they fit), step 2 ranks there (device_rows.influence_of_sets), step 4 folds there into the
graph's rows (device_rows.fold_rows) and the folded graph's influence is solved there, so that only
the folded graph, `max_feature_nodes` rows over the kept columns, comes to the host: a
Llama-1B-shaped prompt of 128 tokens has some 131k active features, and the rows of 8,192 of them
are some 10^8 edges, which the host took seconds to rank at every step and to fold (about 2 s for
6.9 10^7 on one core, docs/gpu.md). Once a step's rows do not stay on the device, every row set
goes to the host and the steps run there, as on the CPU.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np
import scipy.sparse as sp
import torch

from attrgraph.engine.batch_plan import check_batch_size
from attrgraph.engine.csr_rows import assemble_csr, index_dtype
from attrgraph.engine.device_rows import DeviceRows, fold_rows, influence_of_sets
from attrgraph.engine.linear_backward import linear_rows, rows_engine
from attrgraph.engine.prompt_run import PromptRun, run_prompt
from attrgraph.engine.sources import Injection, feature_injections, node_table, target_values
from attrgraph.engine.targets import DESIRED_LOGIT_PROB, MAX_N_LOGITS, Target, select_logit_targets
from attrgraph.errors import OptionError
from attrgraph.graph.graph import Graph
from attrgraph.graph.streamed_influence import layer_blocks, streamed_influence, streamed_influence_rows
from transcoders.config import is_whole

EXPLORE_STEP = 2048
"""Step 3's default `k`: circuit-tracer's `attribute(max_feature_nodes=...)` ranks the unexplored
features again after every `update_interval * batch_size` features (4 x 512, its defaults)."""

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from attrgraph.engine.replacement import ReplacementModel
    from transcoders.base import SparseCoder


def attribute_adaptive(
    model: HookedTransformer,
    transcoders: SparseCoder | ReplacementModel,
    prompt,
    *,
    max_feature_nodes: int = 1024,
    k: int = EXPLORE_STEP,
    max_n_logits: int = MAX_N_LOGITS,
    desired_logit_prob: float = DESIRED_LOGIT_PROB,
    exclude_bos: bool | None = None,
    embedding: str = "token+position",
    batch_size: int | None = None,
    backend: str = "auto",
    trace: list | None = None,
) -> Graph:
    """A partial attribution graph that explores at most `max_feature_nodes` features (steps 1-4).

    `k` features are explored per step (default `EXPLORE_STEP`, circuit-tracer's). `batch_size` caps
    the targets of a backward (default: the rows engine's plan, batch_plan.py). `trace`, when given,
    receives one dict per step (`n_explored`, `seconds`). Influence on the logits is filled in on the
    result; `meta["backward_gflop"]` counts the linear engine's products, as `attribute`'s does."""
    for name, value in (("max_feature_nodes", max_feature_nodes), ("k", k)):
        if not is_whole(value):
            raise OptionError(f"{name} is {value!r}; pass a whole number.")
    if max_feature_nodes < 0:
        raise OptionError(f"max_feature_nodes is {max_feature_nodes}; pass 0 or more.")
    if k < 1:
        raise OptionError(f"k is {k}; pass the features to explore per step, 1 or more.")
    check_batch_size(batch_size)
    if trace is not None and not isinstance(trace, list):
        raise OptionError(
            f"trace is a {type(trace).__name__}; pass a list to receive one dict per step, or None."
        )
    run = run_prompt(model, transcoders, prompt, exclude_bos=exclude_bos, embedding=embedding)  # step 1
    targets = select_logit_targets(run.state.logits[-1], max_n_logits, desired_logit_prob, run.tokenizer)
    explorer = _Explorer(run, targets, backend, batch_size)
    explored = explorer.explore(max_feature_nodes, k, trace)  # steps 2-3
    on_device = explorer.on_device
    folded, keep_cols = _fold_unexplored(run, explorer.row_sets, explored, len(targets), on_device)  # step 4
    pos = [run.n_pos - 1] * len(targets)
    full = node_table(
        run.state, run.sources, targets, pos, target_values(run.rm, run.state, targets, pos), run.n_layers
    )
    n_cols = run.sources.n_columns
    meta = dict(
        method="adaptive",
        max_feature_nodes=int(max_feature_nodes),
        n_explored=int(len(explored)),
        n_active_features=int(len(run.feats)),
        unexplored_as_error=True,
        backend=explorer.backend,
        rows_on_device=bool(on_device),
        backward_gflop=round(explorer.stats.get("flops", 0) / 1e9, 3),
        max_n_logits=int(max_n_logits),
        desired_logit_prob=float(desired_logit_prob),
    )
    nodes = full.select(np.concatenate([keep_cols, np.arange(n_cols, n_cols + len(targets))]))
    adjacency = folded.to_csr() if on_device else folded
    graph = run.graph(nodes, adjacency, targets, np.array([t.weight for t in targets]), meta)
    w, blocks = graph.logit_weights(), layer_blocks(graph.nodes)
    if on_device:  # the folded graph's influence where its rows still are
        graph.nodes.influence = folded.influence(w, blocks, graph.nodes.kind == "error", 0).influence
    else:
        graph.nodes.influence = streamed_influence(graph.adjacency, w, blocks).influence
    return graph


class _Explorer:
    """Steps 1-3: the rows of the logit targets, then of the most influential unexplored features,
    kept per exploration step as `(nodes ascending, rows over all N nodes)` in `row_sets`."""

    def __init__(self, run: PromptRun, targets: list[Target], backend: str, batch_size: int | None):
        self.run, self.stats = run, {}
        n_cols, n_t = run.sources.n_columns, len(targets)
        self.N = n_cols + n_t
        logit_inj = [Injection(t.vector, run.n_pos - 1, logits=True) for t in targets]
        self.engine = rows_engine(backend, run.rm, logit_inj)
        # the linear engine counts its flops; either plans its batches when `batch_size` is None
        linear = self.engine is linear_rows
        self.backend = "linear" if linear else "autograd"  # as attribute's meta names it
        self.options = dict(batch_size=batch_size) | (
            dict(stats=self.stats, keep_on_device=True) if linear else {}
        )
        self.w = np.zeros(self.N)
        self.w[n_cols:] = [t.weight for t in targets]
        self.row_sets = [(n_cols + np.arange(n_t), self.rows_for(logit_inj))]

    def rows_for(self, inj: list[Injection]) -> sp.csr_array | DeviceRows:
        """Rows of `inj`: as the linear engine kept them on the device, else over all N nodes (the
        arrays of the engine's [n, n_cols] result, not a copy)."""
        run = self.run
        r = self.engine(run.rm, run.state, run.sources, inj, **self.options)
        return r if isinstance(r, DeviceRows) else self.on_host(r)

    def on_host(self, r: sp.csr_array | DeviceRows) -> sp.csr_array:
        """Rows `[n, n_cols]` (host or device) as a host matrix over all N nodes."""
        r = r.to_csr() if isinstance(r, DeviceRows) else r
        return sp.csr_array(
            (r.data.astype(np.float32, copy=False), r.indices, r.indptr), shape=(r.shape[0], self.N)
        )

    @property
    def on_device(self) -> bool:
        """Whether every row set is still on the device (module docstring, last paragraph)."""
        return all(isinstance(rows, DeviceRows) for _, rows in self.row_sets)

    def influence(self, ranges: list[tuple[int, int]]) -> np.ndarray:
        """Step 2: every node's logit influence in the current estimate; on the device while every
        row set is there, else on the host, with every row set moved there first."""
        if self.on_device:
            return influence_of_sets(self.row_sets, self.w, ranges).influence
        self.row_sets = [(nodes, self.on_host(rows)) for nodes, rows in self.row_sets]
        return streamed_influence_rows(self.row_sets, self.w, ranges).influence

    def layer_ranges(self) -> list[tuple[int, int]]:
        """Blocks of nodes for the influence solve: the sources without rows, each layer and site's
        features (attention first), the logits."""
        run, L = self.run, self.run.n_layers
        rank, n_src, n_cols = run.layer_rank(), run.n_src, run.sources.n_columns
        bounds = (
            np.searchsorted(rank, np.arange(2 * L + 1)) + n_src if len(rank) else np.full(2 * L + 1, n_src)
        )
        middle = [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
        return [(0, n_src)] + middle + [(n_cols, self.N)]

    def explore(self, max_feature_nodes: int, k: int, trace: list | None) -> np.ndarray:
        """Steps 2-3: explore the top `k` unexplored features by logit influence until the budget is
        spent or none has influence; returns the explored features (indices into `run.feats`)."""
        run, ranges = self.run, self.layer_ranges()
        n_src, n_cols = run.n_src, run.sources.n_columns
        explored = np.zeros(0, np.int64)
        budget = min(max_feature_nodes, len(run.feats))
        while len(explored) < budget:
            influence = self.influence(ranges)[n_src:n_cols]
            influence[explored] = -np.inf
            order = np.argsort(-influence, kind="stable")[: min(k, budget - len(explored))]
            order = np.sort(order[influence[order] > 0])
            if not len(order):
                break
            attn = torch.from_numpy(run.sites[order] == "attn")
            inj = feature_injections(run.rm, torch.from_numpy(run.feats[order]), attn)
            self.row_sets.append((n_src + order, self.rows_for(inj)))
            explored = np.concatenate([explored, order])
            if trace is not None:
                trace.append(
                    dict(n_explored=int(len(explored)), seconds=round(time.perf_counter() - run.t0, 3))
                )
        return explored


def _fold_unexplored(
    run: PromptRun, row_sets: list, explored: np.ndarray, n_t: int, on_device: bool
) -> tuple[sp.csr_array | DeviceRows, np.ndarray]:
    """Step 4: the adjacency over the embeddings, errors, explored features and logits, with each
    unexplored feature's edges added to its error node, and the kept source columns. While every
    row set is on the device (`on_device`, `_Explorer.on_device`) it is folded there into one `DeviceRows` (`fold_rows`); else on the
    host, one row set at a time (the folded rows are much smaller than the raw ones, which are
    dropped as they go), and the folded rows are copied once into the graph's CSR arrays."""
    feats, sites, sources = run.feats, run.sites, run.sources
    n_pos, n_src, n_cols = run.n_pos, run.n_src, sources.n_columns
    explored_sorted = np.sort(explored)
    unexplored = np.setdiff1d(np.arange(len(feats)), explored_sorted)
    fold = np.arange(n_cols)
    n_exc = sources.n_excluded
    fold[n_src + unexplored] = n_pos + feats[unexplored, 0] * (n_pos - n_exc) + feats[unexplored, 1] - n_exc
    if run.rm.attn is not None:  # attention features fold into the attention error nodes
        attn = unexplored[sites[unexplored] == "attn"]
        fold[n_src + attn] += sources.error_column(0, "attn") - sources.error_column(0, "mlp")
    keep_cols = np.concatenate([np.arange(n_src), n_src + explored_sorted])
    n_keep = len(keep_cols)
    new_index = np.full(n_cols, -1)
    new_index[keep_cols] = np.arange(n_keep)
    target = new_index[fold].astype(np.int32)
    n = n_keep + n_t
    row_of = np.concatenate([new_index, n_keep + np.arange(n_t)])  # a row node's row in the graph
    if on_device:
        return fold_rows([(row_of[nodes], rows) for nodes, rows in row_sets], target, (n, n)), keep_cols
    # one entry per row, at the column it folds into, with int32 indices like the raw rows': int64
    # ones made scipy convert the raw rows' indices (1.4 s of 2.3 for 6.9 10^7 nonzeros at 128 tokens)
    M = sp.csr_array(
        (np.ones(n_cols, np.float32), target, np.arange(n_cols + 1, dtype=np.int32)), shape=(n_cols, n_keep)
    )
    folded = []  # (rows in the graph, rows over the kept columns)
    while row_sets:
        row_nodes, raw = row_sets.pop()
        raw = raw.to_csr() if isinstance(raw, DeviceRows) else raw  # the last step's, where it fit
        raw = sp.csr_array((raw.data, raw.indices, raw.indptr), shape=(len(row_nodes), n_cols))
        folded.append((row_of[row_nodes], sp.csr_array(raw @ M)))
        del raw
    nnz = sum(int(r.nnz) for _, r in folded)
    itype = index_dtype(n, nnz)
    return (
        assemble_csr(
            n,
            n,
            np.concatenate([rows for rows, _ in folded]),
            np.concatenate([np.diff(r.indptr) for _, r in folded]),
            np.concatenate([r.data for _, r in folded]),
            np.concatenate([r.indices.astype(itype, copy=False) for _, r in folded]),
        ),
        keep_cols,
    )

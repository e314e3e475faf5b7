"""`attribute_pruned`: the pruned attribution graph of a prompt without holding its full graph.

Seed: circuit-tracing appendix, "Attribution Graph Computation" and "Graph Pruning". The full
graph of a long prompt is most of a build's memory (8 bytes per edge: the 128-token prompt of
benchmarks/long_build.py has 9.4 10^7 edges, 0.75 GB, on default-plt), yet pruning needs of it only every node's
logit influence, which one pass over the rows from the last block of nodes to the first computes
(streamed_influence.InfluenceSolve), and then the rows of the nodes it keeps. So:

1. Steps 1-2 of `attribute` (attribute.standard_setup): model run, targets, sources, node table.
2. The blocks of nodes (graph.NODE_ORDER: the features of one layer, the targets; layer_blocks)
   from the last to the first. Each block's targets go to the rows engine in groups of at most
   about `chunk_edges` edges (a row has at most as many edges as there are sources at or before
   its position); each group's rows are added to the influence solve and dropped. A block's rows
   only read lower blocks, so every node's influence is final once the blocks above it are done.
3. Node pruning (prune.select_nodes, by `rule`) on that influence; the rows of the kept features
   and of the targets computed again, restricted to the kept nodes: the node-pruned graph, whose
   nodes carry their influence in the full graph and its cumulative share (`unpruned_influence`,
   `unpruned_share`), as `prune_graph` records them.
4. Edge pruning and the rule's last step (prune.prune_graph_edges), as `prune_graph` does.

On a GPU, where the linear engine keeps every row on the device (linear_backward.py step 8:
where they fit), step 2 is `DeviceRows.influence` on the rows held there, and steps 3-4 prune them
there (device_prune.py): no row is computed twice and only the pruned graph comes to the host.

The result is `prune_graph(attribute(...))`: the same steps on the same rows (a row computed in
another batch agrees to float32 rounding). Cost: the rows of every target once, as `attribute`,
plus the kept targets' again (not on a GPU that holds the rows). Peak memory: the setup, one
group's rows and the node-pruned graph, whatever the number of edges of the full graph, which
the result's meta records as `unpruned_n_nodes`, `unpruned_n_edges`, `unpruned_n_features`, and
its scores as `unpruned_replacement_score` and `unpruned_completeness_score` (as `attribute`
does); its `attribution_seconds` are steps 1-2, `pruning_seconds` steps 3-4.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import numpy as np
import scipy.sparse as sp
from torch import Tensor
from tqdm import tqdm

from attrgraph.engine.attribute import StandardSetup, standard_setup
from attrgraph.engine.device_prune import prune_device_edges
from attrgraph.engine.targets import DESIRED_LOGIT_PROB, MAX_N_LOGITS, Target
from attrgraph.errors import OptionError
from attrgraph.graph.graph import Graph, Nodes
from attrgraph.graph.prune import (
    DEFAULT_RULE,
    check_rule,
    check_thresholds,
    influence_shares,
    prune_graph_edges,
    pruned_meta,
    select_nodes,
)
from attrgraph.graph.scores import scores_from_shares
from attrgraph.graph.streamed_influence import InfluenceSolve, StreamedInfluence, layer_blocks
from transcoders.arguments import shown
from transcoders.config import is_whole

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from attrgraph.engine.replacement import ReplacementModel
    from transcoders import SparseCoder

CHUNK_EDGES = 1 << 25
"""Most edges (8 bytes each) of one group of rows in step 2 (268 MB): a group costs the engine
some 0.1 s to set up on a 128-token prompt, so fewer, larger groups are faster."""


def attribute_pruned(
    model: HookedTransformer,
    transcoders: SparseCoder | ReplacementModel,
    prompt: str | list[int] | Tensor | np.ndarray,
    node_threshold: float = 0.8,
    edge_threshold: float = 0.98,
    *,
    max_n_logits: int = MAX_N_LOGITS,
    desired_logit_prob: float = DESIRED_LOGIT_PROB,
    targets: list[Target] | None = None,
    batch_size: int | None = None,
    exclude_bos: bool | None = None,
    embedding: str = "token+position",
    progress: bool = False,
    backend: str = "auto",
    precision: str = "fp32",
    chunk_edges: int = CHUNK_EDGES,
    rule: str = DEFAULT_RULE,
) -> Graph:
    """`prune_graph(attribute(model, transcoders, prompt, ...), node_threshold, edge_threshold, rule=rule)`
    (module docstring, steps 1-4), with `attribute`'s options; the full graph is never held.
    A `node_threshold` of 1 keeps every node, so step 3 computes every row a second time."""
    check_rule(rule)
    check_thresholds(node_threshold, edge_threshold)
    if not is_whole(chunk_edges) or chunk_edges < 1:
        raise OptionError(f"chunk_edges is {shown(chunk_edges)}; pass a whole number of edges, at least 1.")
    setup = standard_setup(
        model,
        transcoders,
        prompt,
        max_n_logits=max_n_logits,
        desired_logit_prob=desired_logit_prob,
        targets=targets,
        batch_size=batch_size,
        exclude_bos=exclude_bos,
        embedding=embedding,
        backend=backend,
        precision=precision,
    )
    stats: dict = {}
    kind, w, n_src = setup.nodes.kind, setup.logit_weights(), setup.n_src
    on_device = setup.resident_rows(batch_size, progress, stats)  # step 2 on a GPU, where they fit
    if on_device is None:
        full, n_edges = _influence(setup, batch_size, chunk_edges, progress, stats)
    else:
        blocks = layer_blocks(setup.nodes)
        n_edges = on_device.nnz()
        full = on_device.influence(w, blocks, kind == "error", n_src)
    scores = scores_from_shares(kind, full.influence, full.error_share, w)

    t1 = time.perf_counter()
    keep = select_nodes(kind, full.influence, node_threshold, rule)  # step 3
    summary = dict(
        unpruned_replacement_score=scores.replacement,
        unpruned_completeness_score=scores.completeness,
        unpruned_n_nodes=int(len(kind)),
        unpruned_n_edges=int(n_edges),
        unpruned_n_features=int((kind == "feature").sum()),
        attribution_seconds=round(t1 - setup.run.t0, 4),
    )
    if on_device is not None:  # steps 3-4 on the rows held there (device_prune.py)
        pruned = prune_device_edges(on_device, kind, w, keep, blocks, n_src, edge_threshold, rule)
        kept = np.flatnonzero(pruned.keep)
        nodes = _kept_nodes(setup, kept, full.influence)
        nodes.influence = pruned.influence
        out = setup.graph(nodes, pruned.adjacency, stats)
        out.meta.update(summary | pruned_meta(node_threshold, edge_threshold, rule))
        out.meta["pruning_seconds"] = round(time.perf_counter() - t1, 4)
        return out
    kept = np.flatnonzero(keep)
    n_cols = setup.sources.n_columns
    with_rows = kept[kept >= n_src] - n_src  # injections of the kept features and of every target
    rows = setup.rows([setup.injections[i] for i in with_rows], batch_size, stats=stats)
    rows = sp.csr_array((rows.data, rows.indices, rows.indptr), shape=(len(with_rows), n_cols))
    rows = rows[:, kept[kept < n_cols]]  # the kept sources (embeddings, errors, features) come first
    indptr = np.concatenate([np.zeros(int((kept < n_src).sum()), rows.indptr.dtype), rows.indptr])
    nodes = _kept_nodes(setup, kept, full.influence)
    nodes.influence = full.influence[kept]
    pruned = setup.graph(
        nodes, sp.csr_array((rows.data, rows.indices, indptr), shape=(len(kept),) * 2), stats
    )
    pruned.meta.update(summary)
    out = prune_graph_edges(pruned, edge_threshold, progress, node_threshold, rule)  # step 4
    out.meta["pruning_seconds"] = round(time.perf_counter() - t1, 4)
    return out


def _kept_nodes(setup: StandardSetup, kept: np.ndarray, influence: np.ndarray) -> Nodes:
    """The node table of the nodes `kept` (indices), with their influence in the full graph and its
    cumulative share (prune_graph's `unpruned_influence`, `unpruned_share`)."""
    nodes = setup.nodes.select(kept)
    nodes.unpruned_influence = influence[kept]
    nodes.unpruned_share = influence_shares(influence)[kept]
    return nodes


def _influence(
    setup: StandardSetup, batch_size: int, chunk_edges: int, progress: bool, stats: dict
) -> tuple[StreamedInfluence, int]:
    """Step 2: the full graph's influence and error shares, and its number of edges."""
    nodes, n_src, N, n_cols = setup.nodes, setup.n_src, setup.n_nodes, setup.sources.n_columns
    # a feature's row reads at most the sources of lower layers (embeddings: -1) at or before its
    # position, a target's those of any layer
    top = int(nodes.layer.max()) + 1
    count = np.zeros((top + 2, setup.tokens.shape[0]), np.int64)
    np.add.at(count, (nodes.layer[:n_cols] + 1, nodes.position[:n_cols]), 1)
    below = count.cumsum(0).cumsum(1)  # [l, p]: sources of layers < l at positions <= p
    rows_of = slice(n_src, N)
    layer = np.where(nodes.kind[rows_of] == "feature", nodes.layer[rows_of], top + 1)
    bound = below[layer, nodes.position[rows_of]]
    solve = InfluenceSolve(setup.logit_weights(), nodes.kind == "error")
    n_edges = 0
    bar = tqdm(
        total=len(setup.injections),
        desc="attribution (rows into influence)",
        unit="target",
        disable=not progress,
    )
    for b0, b1 in reversed(layer_blocks(nodes)):
        solve.start_block(b0, b1)
        i, i_end = max(b0 - n_src, 0), max(b1 - n_src, 0)
        while i < i_end:  # groups of about chunk_edges edges, at least one target
            i1 = i + max(1, int(np.searchsorted(np.cumsum(bound[i:i_end]), chunk_edges, side="right")))
            rows = setup.rows(setup.injections[i:i1], batch_size, stats=stats)
            rows = sp.csr_array((rows.data, rows.indices, rows.indptr), shape=(i1 - i, N))
            n_edges += solve.add_rows(np.arange(n_src + i, n_src + i1), rows)
            del rows
            bar.update(i1 - i)
            i = i1
    bar.close()
    return solve.result(), n_edges

"""`attribute`: the full attribution graph of a prompt, one batched backward per group of targets.

Seed: circuit-tracing appendix, "Attribution Graph Computation". Algorithm:

1. Run the model once (`ReplacementModel.run`): record patterns, norm scales, MLP inputs and
   outputs; compute feature activations `a` and errors `e`, held constant.
2. Nodes (graph.NODE_ORDER): an embedding per position, an error per (layer, position), a feature
   per active (layer, position, feature) with `a > 0` (with an attention set also an attention
   error per (layer, position) and the active attention features, site "attn"), and the targets (logits by default: the
   smallest top-K past 0.95 probability, K <= 10; see targets.py). Sources and injections:
   sources.py.
3. Rows: for each batch of targets, `J^T v_in` through the frozen model dotted with every
   source's output vector; the rows engine is linear_backward.py (explicit matrix products,
   default) or autograd_rows.py (one autograd backward per batch, the reference).
4. Rows are stored sparse (CSR, rows = targets); embedding and error rows are empty.
5. Influence on the logits and the replacement / completeness scores, in one streamed pass.

The cost is one backward per batch of targets, linear in the number of active features.
`attribute_hierarchical` (hierarchical.py) and `attribute_adaptive` (adaptive.py) are the other two
entry points; `attribute(method=...)` runs either, and refuses options the method does not take.
`attribute_pruned` (pruned_build.py) runs steps 1-5 and pruning without holding the rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import scipy.sparse as sp
from torch import Tensor

from attrgraph.engine.adaptive import attribute_adaptive
from attrgraph.engine.batch_plan import CPU_ROWS, check_batch_size
from attrgraph.engine.device_rows import DeviceRows
from attrgraph.engine.hierarchical import attribute_hierarchical
from attrgraph.engine.linear_backward import linear_rows, rows_engine
from attrgraph.engine.methods import check_method
from attrgraph.engine.precision import PRECISIONS
from attrgraph.engine.prompt_run import PromptRun, run_prompt
from attrgraph.engine.replacement import ReplacementModel
from attrgraph.engine.sources import (
    Injection,
    feature_injections,
    node_table,
    target_values,
)
from attrgraph.engine.targets import (
    DESIRED_LOGIT_PROB,
    MAX_N_LOGITS,
    Target,
    select_logit_targets,
)
from attrgraph.errors import OptionError
from attrgraph.graph.graph import Graph, Nodes
from attrgraph.graph.scores import scores_from_shares
from attrgraph.graph.streamed_influence import layer_blocks, streamed_influence

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from attrgraph.engine.sets import TranscoderSets
    from transcoders import SparseCoder


@dataclass
class StandardSetup:
    """What standard attribution (module docstring, steps 1-2) prepares before computing rows: the
    prompt's run (prompt_run.py), the targets, one injection per feature and target, the node table.
    Node `n_src + i` is the target of `injections[i]` (features, then targets, in node order)."""

    run: PromptRun
    targets: list[Target]
    weights: np.ndarray
    injections: list[Injection]
    nodes: Nodes
    engine: Callable
    max_n_logits: int
    desired_logit_prob: float
    precision: str = "fp32"

    model = property(lambda self: self.run.model)
    rm = property(lambda self: self.run.rm)
    tokens = property(lambda self: self.run.tokens)
    state = property(lambda self: self.run.state)
    sources = property(lambda self: self.run.sources)
    n_src = property(
        lambda self: self.run.n_src, doc="Embedding and error nodes: no rows, first in node order."
    )

    @property
    def n_nodes(self) -> int:
        return self.sources.n_columns + len(self.targets)

    def logit_weights(self) -> np.ndarray:
        """`Graph.logit_weights` of the full graph, before it exists (its logit probabilities are
        stored as float32)."""
        w = np.zeros(self.n_nodes)
        w[self.nodes.kind == "logit"] = self.weights.astype(np.float32)
        return w

    def rows(
        self,
        injections: list[Injection],
        batch_size: int | None,
        progress: bool = False,
        stats=None,
        keep_on_device: bool = False,
    ) -> sp.csr_array | DeviceRows:
        """Step 3: the rows of `injections`, `[len(injections), n_columns]` (sources only); `stats`
        (a dict) adds up the linear engine's flops. With `keep_on_device`, rows the linear engine
        kept on a GPU come back as `DeviceRows` (linear_backward.py step 8)."""
        extra = {}
        if self.engine is linear_rows:
            extra = dict(precision=self.precision, keep_on_device=keep_on_device)
            extra |= dict(stats=stats) if stats is not None else {}
        return self.engine(
            self.rm, self.state, self.sources, injections, batch_size=batch_size, progress=progress, **extra
        )

    def resident_rows(self, batch_size: int | None, progress: bool, stats: dict) -> DeviceRows | None:
        """Step 3 for every injection when the linear engine keeps the rows on the device
        (linear_backward.py step 8: on a GPU, where they fit), else None, with nothing computed."""
        if self.engine is not linear_rows:
            return None
        return linear_rows(
            self.rm,
            self.state,
            self.sources,
            self.injections,
            batch_size=batch_size,
            progress=progress,
            stats=stats,
            precision=self.precision,
            only_resident=True,
        )

    def graph(self, nodes: Nodes, adjacency: sp.csr_array, stats: dict) -> Graph:
        """The graph on `nodes` (all of them, or a selection) with `adjacency`, and its metadata."""
        targets = self.targets
        meta = dict(
            backend="linear" if self.engine is linear_rows else "autograd",
            precision=self.precision,
            backward_gflop=round(stats.get("flops", 0) / 1e9, 3),
            max_n_logits=int(self.max_n_logits),
            desired_logit_prob=float(self.desired_logit_prob),
            custom_targets=any(
                t.hook is not None or t.token < 0 or not math.isfinite(t.weight) for t in targets
            ),
        )
        return self.run.graph(nodes, adjacency, targets, self.weights, meta)


def standard_setup(
    model: HookedTransformer,
    transcoders: SparseCoder | Sequence[SparseCoder] | TranscoderSets | ReplacementModel,
    prompt: str | list[int] | Tensor | np.ndarray,
    *,
    max_n_logits: int = MAX_N_LOGITS,
    desired_logit_prob: float = DESIRED_LOGIT_PROB,
    targets: list[Target] | None = None,
    batch_size: int | None = None,
    exclude_bos: bool | None = None,
    embedding: str = "token+position",
    backend: str = "auto",
    precision: str = "fp32",
) -> StandardSetup:
    """Steps 1-2 of `attribute` (same options): run the prompt (prompt_run.py), choose the targets,
    make the injections and the node table, and pick the rows engine."""
    check_batch_size(batch_size)
    if precision not in PRECISIONS:
        raise OptionError(f"precision is {precision!r}; pass one of {PRECISIONS}.")
    run = run_prompt(
        model, transcoders, prompt, exclude_bos=exclude_bos, embedding=embedding, targets=targets
    )
    rm, state, sources = run.rm, run.state, run.sources
    injections = feature_injections(rm, sources.features, sources.attn)
    if targets is None:
        targets = select_logit_targets(state.logits[-1], max_n_logits, desired_logit_prob, run.tokenizer)
    weights = np.array([t.weight for t in targets], np.float64)
    weights = np.where(np.isnan(weights), 1.0 / len(targets), weights)

    positions = [t.position % run.n_pos for t in targets]
    injections += [
        Injection(t.vector, pos, hook=t.hook, logits=t.hook is None) for t, pos in zip(targets, positions)
    ]
    values = target_values(rm, state, targets, positions)
    engine = rows_engine(backend, rm, injections)
    if precision != "fp32" and engine is not linear_rows:
        raise OptionError(
            f"precision={precision!r} is the linear engine's; leave it out or pass backend='linear'."
        )
    return StandardSetup(
        run=run,
        targets=targets,
        weights=weights,
        injections=injections,
        nodes=node_table(state, sources, targets, positions, values, run.n_layers),
        engine=engine,
        max_n_logits=max_n_logits,
        desired_logit_prob=desired_logit_prob,
        precision=precision,
    )


def attribute(
    model: HookedTransformer,
    transcoders: SparseCoder | Sequence[SparseCoder] | TranscoderSets | ReplacementModel,
    prompt: str | list[int] | Tensor | np.ndarray,
    *,
    method: str = "standard",
    max_n_logits: int | None = None,
    desired_logit_prob: float | None = None,
    targets: list[Target] | None = None,
    batch_size: int | None = None,
    exclude_bos: bool | None = None,
    embedding: str = "token+position",
    progress: bool = False,
    backend: str = "auto",
    tau: float | None = None,
    max_feature_nodes: int | None = None,
    precision: str = "fp32",
) -> Graph:
    """The attribution graph of `prompt` (module docstring, steps 1-5).

    `transcoders` is an MLP transcoder set, or `[mlp_set, attn_set]` / `TranscoderSets(mlp, attn)`
    with an attention-output SAE set, whose features and errors become nodes too (site "attn").
    `targets` replaces the default logit targets (targets.py: `logit_difference`, `direction`);
    `max_n_logits` (default 10) and `desired_logit_prob` (default 0.95) choose the logit targets.
    `exclude_bos=None` excludes position 0 (no features, no error nodes; circuit-tracer's
    convention) exactly when it holds the tokenizer's BOS token. `embedding` folds the positional
    embedding into the embedding node ("token+position", default) or leaves it in the bias ("token").
    Influence on the logits (prune.compute_influence) is filled in on the returned graph.
    `batch_size` caps the targets per backward; by default the linear engine sizes its batches
    from the device (batch_plan.py: cache-sized on the CPU, at most 256 targets; from free memory
    on a GPU, where the rows also stay on the device and influence is solved there).
    `precision` ("fp32", default and exact; "tf32" or "bf16", faster on a GPU at a measured price:
    precision.py) is the linear engine's; the autograd engine takes "fp32" only. `backend` picks the rows engine:
    "autograd" (autograd_rows.py), "linear" (linear_backward.py) or "auto" (linear wherever it
    applies, else autograd; the default); both give equal rows.
    `method="hierarchical"` runs `attribute_hierarchical` from `targets[0]` (default: the top
    logit) with threshold `tau`; `method="adaptive"` runs `attribute_adaptive` with
    `max_feature_nodes`. An option the method does not take raises `OptionError`. The graph's
    meta carries its replacement and completeness scores (scores.py) as `unpruned_*_score`.
    """
    given = dict(
        precision=precision,
        max_n_logits=max_n_logits,
        desired_logit_prob=desired_logit_prob,
        targets=targets,
        progress=progress,
        tau=tau,
        max_feature_nodes=max_feature_nodes,
    )
    check_method(method, given)
    common = dict(exclude_bos=exclude_bos, embedding=embedding, backend=backend, batch_size=batch_size)
    logits = dict(
        max_n_logits=MAX_N_LOGITS if max_n_logits is None else max_n_logits,
        desired_logit_prob=DESIRED_LOGIT_PROB if desired_logit_prob is None else desired_logit_prob,
    )
    if method == "hierarchical":
        if targets is not None and len(targets) != 1:
            raise OptionError(
                f"hierarchical attribution has one root; got {len(targets)} targets, pass targets=[root]."
            )
        root = targets[0] if targets else None
        common["batch_size"] = CPU_ROWS if batch_size is None else batch_size
        return attribute_hierarchical(model, transcoders, prompt, tau=tau or 0.0, root=root, **common)
    if method == "adaptive":
        return attribute_adaptive(
            model, transcoders, prompt, max_feature_nodes=max_feature_nodes, **logits, **common
        )
    setup = standard_setup(
        model,
        transcoders,
        prompt,
        targets=targets,
        exclude_bos=exclude_bos,
        embedding=embedding,
        backend=backend,
        batch_size=batch_size,
        precision=precision,
        **logits,
    )
    stats: dict = {}
    rows = setup.rows(setup.injections, batch_size, progress=progress, stats=stats, keep_on_device=True)
    on_device = None
    if isinstance(rows, DeviceRows):  # influence on the device, then one copy (linear_backward.py step 8)
        nodes = setup.nodes
        on_device = rows.influence(
            setup.logit_weights(), layer_blocks(nodes), nodes.kind == "error", setup.n_src
        )
        rows = rows.to_csr()
    # rows only for features and targets; embeddings and errors have no inputs (empty rows)
    # keep the rows' index dtype, so that scipy does not copy the (large) indices
    indptr = np.concatenate([np.zeros(setup.n_src, rows.indptr.dtype), rows.indptr])
    adjacency = sp.csr_array((rows.data, rows.indices, indptr), shape=(setup.n_nodes, setup.n_nodes))
    graph = setup.graph(setup.nodes, adjacency, stats)
    # influence and scores in one streamed pass (no copies of a possibly huge adjacency)
    w = graph.logit_weights()
    pass_ = on_device or streamed_influence(
        graph.adjacency, w, layer_blocks(graph.nodes), graph.nodes.kind == "error", progress=progress
    )
    graph.nodes.influence = pass_.influence
    scores = scores_from_shares(graph.nodes.kind, pass_.influence, pass_.error_share, w)
    graph.meta.update(
        unpruned_replacement_score=scores.replacement, unpruned_completeness_score=scores.completeness
    )
    return graph

"""What every attribution method does first, and how each returns its graph: written once.

Seed: circuit-tracing appendix, "Attribution Graph Computation". The standard (attribute.py),
hierarchical (hierarchical.py), adaptive (adaptive.py) and streamed-pruned (pruned_build.py)
methods differ in which rows they compute; they share:

1. The replacement model of `transcoders` (a set, `[mlp_set, attn_set]`, or a `ReplacementModel`).
2. The prompt's tokens, and whether position 0 is excluded (`resolve_exclude_bos`).
3. Custom targets checked against the model and the prompt before any heavy work.
4. One recorded run (`ReplacementModel.run`): patterns, norm scales, activations and errors frozen,
   on one thread unless its widest product pays for parallel waits (threads.py).
5. The sources: embeddings, errors and active features (sources.py), with the features as numpy
   rows `(layer, position, feature)` and their sites.
6. The graph: its nodes and adjacency with the prompt, the logit targets and the provenance every
   graph records (`PromptRun.graph`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np
import scipy.sparse as sp
import torch
from torch import Tensor

from attrgraph.engine.replacement import ReplacementModel
from attrgraph.engine.sources import (
    build_sources,
    graph_provenance,
    prompt_strings,
    resolve_exclude_bos,
    to_tokens,
)
from attrgraph.engine.targets import Target, check_targets
from attrgraph.engine.threads import threads_for, torch_threads
from attrgraph.graph.graph import Graph, Nodes

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from attrgraph.engine.sets import TranscoderSets
    from transcoders import SparseCoder


@dataclass
class PromptRun:
    """Steps 1-5 for one prompt (module docstring)."""

    model: HookedTransformer
    rm: ReplacementModel
    tokens: Tensor
    state: object
    sources: object
    exclude_bos: bool
    embedding: str
    t0: float
    """When the run started (`time.perf_counter`): graphs record their attribution time from it."""

    @property
    def n_pos(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def n_layers(self) -> int:
        return int(self.model.cfg.n_layers)

    @property
    def n_src(self) -> int:
        """Embedding and error nodes: the nodes without rows, first in node order."""
        return self.n_pos + self.sources.n_errors

    @property
    def tokenizer(self):
        return getattr(self.model, "tokenizer", None)

    @cached_property
    def feats(self) -> np.ndarray:
        """[n_features, 3] the active features as `(layer, position, feature)`, in node order."""
        return self.sources.features.cpu().numpy().reshape(-1, 3)

    @cached_property
    def sites(self) -> np.ndarray:
        """[n_features] each feature's site, "mlp" or "attn"."""
        return self.sources.feature_sites()

    def layer_rank(self) -> np.ndarray:
        """[n_features] `2 layer + (site is mlp)`: the blocks of one layer and site in node order (a
        layer's attention features feed its MLP features, so they come first)."""
        return 2 * self.feats[:, 0] + (self.sites != "attn")

    def graph(
        self,
        nodes: Nodes,
        adjacency: sp.csr_array,
        targets: list[Target],
        logit_probs: np.ndarray,
        meta: dict,
    ) -> Graph:
        """Step 6: the graph on `nodes` with `adjacency`, the logit targets and probabilities, and
        `meta` beside the provenance and the attribution time."""
        return Graph(
            nodes=nodes,
            adjacency=adjacency,
            prompt_ids=self.tokens.cpu().numpy(),
            prompt_tokens=prompt_strings(self.model, self.tokens),
            logit_tokens=np.array([t.token for t in targets], np.int64),
            logit_probs=logit_probs,
            logit_strings=[t.name for t in targets],
            meta=dict(
                **meta,
                **graph_provenance(self.model, self.rm, self.state, self.exclude_bos, self.embedding),
                attribution_seconds=round(time.perf_counter() - self.t0, 4),
            ),
        )


# the recorded run is made of ordinary tensors, whatever block the caller is in: the autograd rows
# differentiate through it
@torch.inference_mode(False)
def run_prompt(
    model: HookedTransformer,
    transcoders: SparseCoder | Sequence[SparseCoder] | TranscoderSets | ReplacementModel,
    prompt: str | list[int] | Tensor | np.ndarray,
    *,
    exclude_bos: bool | None = None,
    embedding: str = "token+position",
    targets: list[Target] | None = None,
) -> PromptRun:
    """Steps 1-5 (module docstring); `targets` are checked (step 3), not selected."""
    t0 = time.perf_counter()
    rm = ReplacementModel.of(model, transcoders)
    tokens = to_tokens(model, prompt)
    exclude_bos = bool(resolve_exclude_bos(model, tokens, exclude_bos))
    if targets is not None:
        check_targets(targets, model, len(tokens))
    # the forward pass and the sources are small products on a short prompt: on one thread unless
    # the widest one pays for parallel waits (threads.py; the rows engines decide for themselves)
    cfg = model.cfg
    widest = 2.0 * len(tokens) * cfg.d_model * max(cfg.d_mlp or 0, cfg.d_vocab, rm.tc.cfg.d_sae)
    with torch_threads(threads_for(widest)):
        state = rm.run(tokens, exclude_bos=exclude_bos, embedding=embedding)
        sources = build_sources(rm, state)
    return PromptRun(model, rm, tokens, state, sources, exclude_bos, embedding, t0)

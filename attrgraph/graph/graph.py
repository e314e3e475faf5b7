"""`Graph`: an attribution graph as plain arrays (seed: circuit-tracing appendix, "Attribution Graph Computation").

1. Nodes are embeddings (one per position), errors (one per layer and position), active
   transcoder features (one per layer, position and feature with activation > 0) and logits
   (one per selected output token). Feature and error nodes have a `site`: "mlp" (the MLP
   transcoders', the only site without an attention set) or "attn" (attention-output SAE features
   and attention error nodes, `attn_out - SAE(attn_out)`; seed: linear-computation-graphs,
   section 2); embeddings and logits have site "". A graph without a site field (older files)
   has site "mlp" on every feature and error node.
2. `adjacency[t, s]` is the direct linear effect of source `s` on target `t` in the frozen local
   replacement model: rows are targets, columns are sources (scipy CSR).
3. The node order is the constant `NODE_ORDER`: every kind is contiguous and kinds follow
   each other in that order. Within a kind: embeddings by position; errors by (site, layer,
   position), the MLP errors first, then the attention errors; features by (layer, site, position,
   feature) with the attention site before the MLP site of a layer (attention runs before the MLP
   in a block, so an attention feature can feed an MLP feature of its own layer, never the
   reverse); logits by descending probability. Embeddings and errors have no inputs and features
   only read from lower (layer, site) pairs, so every edge goes from a lower index to a higher
   one: the adjacency is strictly lower-triangular, which is what lets `prune.compute_influence`
   use one triangular solve.

Layer convention: embeddings sit at layer -1, logits at layer `n_layers`; `feature` is -1 for
every non-feature node; `token` is the input token of an embedding node, the output token of a
logit node and -1 otherwise. `activation` is the feature activation, the demeaned logit for a
logit node, and the L2 norm of the output vector for embedding and error nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

import numpy as np
import scipy.sparse as sp

from attrgraph.errors import GraphError
from transcoders.config import is_whole

NODE_ORDER: tuple[str, ...] = ("embedding", "error", "feature", "logit")
"""Kinds in the order their nodes appear in `Graph.nodes` and the adjacency (see module docstring)."""

NODE_FIELDS: dict[str, type] = {
    "kind": np.str_,
    "layer": np.int32,
    "position": np.int32,
    "feature": np.int64,
    "activation": np.float32,
    "token": np.int64,
    "influence": np.float64,
    "site": np.str_,
    "unpruned_influence": np.float64,
    "unpruned_share": np.float64,
}
SITES: tuple[str, ...] = ("attn", "mlp")
"""Sites of feature and error nodes, in their order within a layer (module docstring, step 3)."""


@dataclass
class Nodes:
    """The node table: equal-length arrays, one entry per node, in `NODE_ORDER`."""

    kind: np.ndarray
    """"embedding", "error", "feature" or "logit"."""
    layer: np.ndarray
    """Layer; -1 for embeddings, `n_layers` for logits."""
    position: np.ndarray
    """Token position in the prompt."""
    feature: np.ndarray
    """Feature index within its layer; -1 for non-feature nodes."""
    activation: np.ndarray
    """Feature activation; demeaned logit for logits; output-vector norm for embeddings and errors."""
    token: np.ndarray
    """Input token (embedding), output token (logit), else -1."""
    influence: np.ndarray = None  # type: ignore[assignment]
    """Logit influence (prune.compute_influence) in float64, so that `prune_graph(graph,
    influence=graph.nodes.influence)` prunes exactly as computing it again; NaN until computed."""
    site: np.ndarray = None  # type: ignore[assignment]
    """"mlp" or "attn" for feature and error nodes, "" otherwise (default: "mlp" on every feature
    and error node)."""
    unpruned_influence: np.ndarray = None  # type: ignore[assignment]
    """In a pruned graph: the node's logit influence in the unpruned graph it was pruned from
    (prune.py), float64; NaN in an unpruned graph and in graphs pruned before this was kept."""
    unpruned_share: np.ndarray = None  # type: ignore[assignment]
    """In a pruned graph: circuit-tracer's cumulative influence of the node in the unpruned graph
    (prune.influence_shares: the running share of the sorted influence up to the node), what its
    export writes as node `influence`; NaN where `unpruned_influence` is."""

    def __post_init__(self):
        n = len(self.kind)
        for name in ("influence", "unpruned_influence", "unpruned_share"):
            if getattr(self, name) is None:
                setattr(self, name, np.full(n, np.nan))
        if self.site is None:
            kind = np.asarray(self.kind).astype(np.str_)
            self.site = np.where((kind == "feature") | (kind == "error"), "mlp", "")
        for f in fields(self):
            value = np.asarray(getattr(self, f.name))
            if f.name == "kind":
                value = value.astype(np.str_)
            elif f.name == "site":  # wide enough for every site, so that assigning "attn" is not cut
                value = value.astype("<U4")
            else:
                value = value.astype(NODE_FIELDS[f.name], copy=False)
            if value.shape != (n,):
                raise GraphError(
                    f"node field {f.name} has shape {value.shape}, expected ({n},); give every field one entry per node."
                )
            setattr(self, f.name, value)

    def __len__(self) -> int:
        return len(self.kind)

    def select(self, index: np.ndarray) -> Nodes:
        """The nodes at `index` (boolean mask or integer indices), order kept."""
        return Nodes(**{f.name: getattr(self, f.name)[index] for f in fields(self)})

    def mask(self, kind: str, site: str | None = None) -> np.ndarray:
        """Boolean mask of the nodes of one kind (and of one site, when given)."""
        return self.kind == kind if site is None else (self.kind == kind) & (self.site == site)

    @staticmethod
    def concat(parts: list[Nodes]) -> Nodes:
        return Nodes(**{f.name: np.concatenate([getattr(p, f.name) for p in parts]) for f in fields(Nodes)})


def check_graph(graph, who: str) -> None:
    """`GraphError` naming `who` (a public function) unless `graph` is a `Graph`: a path or a
    graph's name passed where the graph itself goes is the likely mistake, and says how to load it."""
    if isinstance(graph, Graph):
        return
    hint = ""
    if isinstance(graph, str | bytes) or hasattr(graph, "__fspath__"):
        hint = f" ({graph!r} looks like a path or a name: load the graph with load_graph(path, name))"
    raise GraphError(f"{who} takes a Graph, got a {type(graph).__name__}{hint}.")


@dataclass
class Graph:
    """An attribution graph: node table, signed adjacency (rows = targets), prompt and logits."""

    nodes: Nodes
    """Node table in `NODE_ORDER`."""
    adjacency: sp.csr_array
    """[n_nodes, n_nodes] direct effects, rows = targets, columns = sources."""
    prompt_ids: np.ndarray
    """[n_pos] token ids of the prompt as the model saw it (BOS included when prepended)."""
    prompt_tokens: list[str]
    """[n_pos] token strings of the prompt."""
    logit_tokens: np.ndarray
    """[n_logits] ids of the logit nodes' tokens, most probable first."""
    logit_probs: np.ndarray
    """[n_logits] their probabilities under the model."""
    logit_strings: list[str] = field(default_factory=list)
    """[n_logits] their strings."""
    meta: dict = field(default_factory=dict)
    """Plain attributes: model and transcoder identity, options, thresholds, version, time."""

    def __post_init__(self):
        if not sp.issparse(self.adjacency):
            self.adjacency = sp.csr_array(np.asarray(self.adjacency))
        self.adjacency = sp.csr_array(self.adjacency)
        self.prompt_ids = np.asarray(self.prompt_ids, np.int64)
        self.logit_tokens = np.asarray(self.logit_tokens, np.int64)
        self.logit_probs = np.asarray(self.logit_probs, np.float32)
        self.prompt_tokens = [str(t) for t in self.prompt_tokens]
        self.logit_strings = [str(t) for t in self.logit_strings] or [str(t) for t in self.logit_tokens]
        self.validate()

    def __repr__(self) -> str:
        """One line (the arrays would run over many, also in every error message quoting a graph)."""
        counts = {k: int((self.nodes.kind == k).sum()) for k in NODE_ORDER}
        shown = " ".join(repr(t) for t in self.prompt_tokens[:6])  # repr: a newline in a token stays \\n
        more = f" ... ({self.n_pos} tokens)" if self.n_pos > 6 else ""
        return (
            f"Graph({self.n_nodes} nodes: {', '.join(f'{v} {k}' for k, v in counts.items())}; "
            f"{self.n_edges} edges; prompt {shown}{more})"
        )

    # ------------------------------------------------------------------ sizes
    @property
    def n_nodes(self) -> int:
        return len(self.nodes)

    @property
    def n_edges(self) -> int:
        """Number of nonzero edges."""
        return int(self.adjacency.count_nonzero())

    @property
    def n_features(self) -> int:
        return int(self.nodes.mask("feature").sum())

    @property
    def n_pos(self) -> int:
        return len(self.prompt_ids)

    def logit_weights(self) -> np.ndarray:
        """[n_nodes] the logit probability on logit nodes, 0 elsewhere (pruning's weighting)."""
        w = np.zeros(self.n_nodes, np.float64)
        w[self.nodes.mask("logit")] = self.logit_probs
        return w

    def dense(self) -> np.ndarray:
        """The adjacency as a dense array."""
        return self.adjacency.toarray()

    def label(self, i: int) -> str:
        """A short human-readable name of node `i`."""
        n = self.nodes
        if not is_whole(i) or not 0 <= i < len(n):
            raise GraphError(f"node {i!r} is not in this graph; pass an index in 0..{len(n) - 1}.")
        kind, layer, pos = n.kind[i], int(n.layer[i]), int(n.position[i])
        if kind == "embedding":
            return f"emb@{pos} {self.prompt_tokens[pos]!r}"
        attn = n.site[i] == "attn"
        if kind == "error":
            return f"{'attn ' if attn else ''}err L{layer}@{pos}"
        if kind == "feature":
            return f"{'A' if attn else 'L'}{layer}/F{int(n.feature[i])}@{pos}"
        k = int(np.flatnonzero(n.mask("logit")).tolist().index(i))
        return f"logit {self.logit_strings[k]!r}"

    def subgraph(self, keep: np.ndarray, adjacency: sp.csr_array | None = None) -> Graph:
        """The graph on the nodes `keep` (boolean mask), optionally with a replacement adjacency
        already restricted to them; logit arrays follow the kept logit nodes."""
        keep = np.asarray(keep, bool)
        idx = np.flatnonzero(keep)
        adj = self.adjacency[idx][:, idx] if adjacency is None else adjacency
        logit_keep = keep[self.nodes.mask("logit")]
        return replace(
            self,
            nodes=self.nodes.select(idx),
            adjacency=sp.csr_array(adj),
            logit_tokens=self.logit_tokens[logit_keep],
            logit_probs=self.logit_probs[logit_keep],
            logit_strings=[s for s, k in zip(self.logit_strings, logit_keep) if k],
            meta=dict(self.meta),
        )

    # ------------------------------------------------------------------ checks
    def validate(self) -> None:
        """Raise `GraphError` when shapes or the node order break the documented layout."""
        n = self.n_nodes
        if self.adjacency.shape != (n, n):
            raise GraphError(
                f"adjacency has shape {self.adjacency.shape} but there are {n} nodes; it must be square, one row and column per node."
            )
        order = np.full(n, -1, np.int64)  # rank of each node's kind in NODE_ORDER
        for i, k in enumerate(NODE_ORDER):
            order[self.nodes.kind == k] = i
        if np.any(order < 0):
            unknown = sorted(set(self.nodes.kind[order < 0].tolist()))
            raise GraphError(f"unknown node kinds {unknown}; use only {NODE_ORDER}.")
        if np.any(np.diff(order) < 0):
            raise GraphError(f"nodes are not grouped in NODE_ORDER {NODE_ORDER}; sort them by kind first.")
        has_site = (self.nodes.kind == "feature") | (self.nodes.kind == "error")
        bad = has_site & ~np.isin(self.nodes.site, SITES) | ~has_site & (self.nodes.site != "")
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise GraphError(
                f"node {i} ({self.nodes.kind[i]}) has site {self.nodes.site[i]!r}; feature and error nodes "
                f"take one of {SITES}, the other kinds ''."
            )
        n_logit = int(self.nodes.mask("logit").sum())
        if not (len(self.logit_tokens) == len(self.logit_probs) == len(self.logit_strings) == n_logit):
            raise GraphError(
                f"{n_logit} logit nodes but {len(self.logit_tokens)} logit tokens, {len(self.logit_probs)} "
                f"probabilities and {len(self.logit_strings)} strings; give one of each per logit node."
            )
        if len(self.prompt_tokens) != len(self.prompt_ids):
            raise GraphError(
                f"{len(self.prompt_ids)} prompt ids but {len(self.prompt_tokens)} prompt strings; give one string per id."
            )

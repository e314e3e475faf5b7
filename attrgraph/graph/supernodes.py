"""Supernodes: groups of graph nodes that play one role (seed: circuit-tracing appendix, "Similar
Features and Supernodes").

1. A supernode is a name and a set of node keys (kind, layer, position, feature), so it survives
   pruning and reloading; `supernode(graph, name, node_ids)` builds one by hand from node indices.
2. Suggestions: features whose *edge profiles* (input-normalized incoming row and outgoing column
   of the adjacency) or *decoder directions* (all output layers, zero-padded for a CLT) have cosine
   similarity >= `threshold` are grouped by average-linkage clustering.
3. Supernode adjacency, with `A'` the input-normalized adjacency (`A[t, s] / sum_s' |A[t, s']|`,
   sign kept) and `frac_external(n)` the share of `n`'s absolute input weight from outside its
   own group:
       `S(t, s) = sum_{n_t in N_t} frac_external(n_t) * sum_{n_s in N_s} A'[n_t, n_s]
                  / sum_{n_t in N_t} frac_external(n_t)`
   Nodes in no supernode are singleton groups (frac_external 1), so edges between plain nodes are
   just `A'`; the diagonal (edges inside a group) is set to 0.
Storage in the graph's HDF5 file: supernode_store.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import scipy.sparse as sp
from jaxtyping import Float

from attrgraph.errors import SupernodeError
from attrgraph.graph.graph import NODE_ORDER, Graph, check_graph
from attrgraph.graph.provenance import provenance_mismatch
from transcoders.arguments import shown
from transcoders.config import is_real, is_whole

if TYPE_CHECKING:
    from transcoders.base import SparseCoder


class NodeKey(NamedTuple):
    """A node's identity independent of its index: kind, layer, position, feature (-1 if none), and
    the site of a feature or error node ("attn" for attention-output SAE features and attention
    errors; "mlp", the default, for every other node)."""

    kind: str
    layer: int
    position: int | None
    feature: int = -1
    site: str = "mlp"


@dataclass(frozen=True)
class Supernode:
    """A named group of nodes (usually features); usable as an `intervene` key."""

    name: str
    """Label shown in the supernode graph."""
    members: tuple[NodeKey, ...]
    """The grouped nodes: `NodeKey`s, or (layer, position, feature) tuples of features (as
    `intervene` takes them), which become `NodeKey`s."""

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name.strip():
            raise SupernodeError(
                f"a supernode's name is {self.name!r}; give it a label to show, such as 'Texas'."
            )
        if isinstance(self.members, str | bytes | NodeKey) or not hasattr(self.members, "__iter__"):
            raise SupernodeError(
                f"supernode {self.name!r} has members {self.members!r}; pass a tuple of NodeKey or "
                "(layer, position, feature) tuples."
            )
        object.__setattr__(self, "members", tuple(_member_key(self.name, m) for m in self.members))
        if not self.members:
            raise SupernodeError(f"supernode {self.name!r} has no members; give it at least one node.")


def _member_key(name: str, m) -> NodeKey:
    """A supernode member as a `NodeKey`: one already, its fields (kind, layer, position[, feature[,
    site]]), or a feature's (layer, position, feature)."""
    if isinstance(m, tuple | list) and not isinstance(m, NodeKey):
        if len(m) == 3 and all(is_whole(v) for v in m):
            m = NodeKey("feature", *(int(v) for v in m))
        elif 3 <= len(m) <= 5 and isinstance(m[0], str):
            m = NodeKey(*m)
    if (
        isinstance(m, NodeKey)
        and m.kind in NODE_ORDER
        and is_whole(m.layer)
        and (m.position is None or is_whole(m.position))
        and is_whole(m.feature)
        and m.site in ("mlp", "attn")
    ):
        return m
    raise SupernodeError(
        f"supernode {name!r} member {m!r} is not a node key; pass NodeKey(kind, layer, position, feature) "
        "or a feature's (layer, position, feature) (supernode(graph, name, node_ids) makes them)."
    )


class SupernodeGraph(NamedTuple):
    """What `supernode_adjacency` returns."""

    adjacency: Float[np.ndarray, "n_groups n_groups"]
    """`S[t, s]` of step 3, rows = targets."""
    names: list[str]
    """Group names: a supernode's name, or the node label of a singleton."""
    groups: list[np.ndarray]
    """Node indices of each group."""
    frac_external: Float[np.ndarray, " n_nodes"]
    """`frac_external` of every graph node under this grouping."""


def node_key(graph: Graph, i: int) -> NodeKey:
    n = graph.nodes
    site = "attn" if n.site[i] == "attn" else "mlp"
    return NodeKey(str(n.kind[i]), int(n.layer[i]), int(n.position[i]), int(n.feature[i]), site)


def supernode(graph: Graph, name: str, node_ids: Sequence[int]) -> Supernode:
    """A supernode of the given node indices of `graph` (by hand)."""
    check_graph(graph, "supernode")
    if isinstance(node_ids, str | bytes) or not hasattr(node_ids, "__iter__"):
        raise SupernodeError(f"node_ids is {node_ids!r}; pass a list of node indices.")
    ids = list(node_ids)
    odd = [i for i in ids if not is_whole(i)]
    if odd:
        raise SupernodeError(f"node ids {odd} are not integers; pass node indices.")
    ids = [int(i) for i in ids]
    bad = [i for i in ids if not 0 <= i < graph.n_nodes]
    if bad:
        raise SupernodeError(
            f"node ids {bad} are outside the graph's {graph.n_nodes} nodes; pass valid indices."
        )
    return Supernode(name, tuple(node_key(graph, i) for i in ids))


def node_indices(graph: Graph, sn: Supernode) -> np.ndarray:
    """Indices of `sn`'s members in `graph`; raises `SupernodeError` for a member it lacks."""
    n = graph.nodes
    index = {node_key(graph, i): i for i in range(len(n))}
    out = []
    for m in sn.members:
        if m not in index:
            raise SupernodeError(
                f"supernode {sn.name!r} member {tuple(m)} is not in this graph (pruned away?); drop it or use the full graph."
            )
        out.append(index[m])
    return np.array(out, np.int64)


def _input_normalized(adjacency) -> sp.csr_array:
    A = sp.csr_array(adjacency, dtype=np.float64, copy=True)
    rows = np.repeat(np.arange(A.shape[0]), np.diff(A.indptr))
    sums = np.bincount(rows, weights=np.abs(A.data), minlength=A.shape[0])
    A.data = A.data / np.where(sums[rows] > 0, sums[rows], 1.0)
    return A


def supernode_list(supernodes) -> list[Supernode]:
    """`supernodes` (any iterable of `Supernode`; None: none) as a list, or `SupernodeError`."""
    if supernodes is None:
        return []
    if not isinstance(supernodes, Supernode | str) and hasattr(supernodes, "__iter__"):
        out = list(supernodes)
        if all(isinstance(sn, Supernode) for sn in out):
            return out
    raise SupernodeError(
        f"supernodes is a {type(supernodes).__name__} ({str(supernodes)[:60]}); pass a list of Supernode "
        "(supernode(graph, name, node_ids), suggest_supernodes(graph))."
    )


def supernode_adjacency(graph: Graph, supernodes: Sequence[Supernode]) -> SupernodeGraph:
    """The supernode graph of step 3 over `supernodes` plus every other node as a singleton."""
    check_graph(graph, "supernode_adjacency")
    supernodes = supernode_list(supernodes)
    n = graph.n_nodes
    group_of = np.full(n, -1, np.int64)
    groups, names = [], []
    for sn in supernodes:
        idx = node_indices(graph, sn)
        clash = idx[group_of[idx] >= 0]
        if len(clash):
            raise SupernodeError(
                f"supernode {sn.name!r} shares nodes {clash.tolist()} with another; a node may belong to one supernode."
            )
        group_of[idx] = len(groups)
        groups.append(idx)
        names.append(sn.name)
    for i in np.flatnonzero(group_of < 0):
        group_of[i] = len(groups)
        groups.append(np.array([i]))
        names.append(graph.label(int(i)))
    A = sp.csr_array(graph.adjacency, dtype=np.float64)
    A.eliminate_zeros()
    rows = np.repeat(np.arange(n), np.diff(A.indptr))
    absw = np.abs(A.data)
    total = np.bincount(rows, weights=absw, minlength=n)
    external = np.bincount(rows, weights=absw * (group_of[A.indices] != group_of[rows]), minlength=n)
    frac = np.divide(external, total, out=np.zeros(n), where=total > 0)
    An = _input_normalized(A)
    G = len(groups)
    member = sp.csr_array((np.ones(n), (group_of, np.arange(n))), shape=(G, n))  # [G, n]
    weighted = member.multiply(frac[None, :])  # frac_external on each target member
    numer = (weighted @ An @ member.T).toarray()  # [G_t, G_s]
    denom = np.asarray(weighted.sum(axis=1)).ravel()
    S = np.divide(numer, denom[:, None], out=np.zeros_like(numer), where=denom[:, None] > 0)
    np.fill_diagonal(S, 0.0)
    return SupernodeGraph(S, names, groups, frac)


# ---------------------------------------------------------------------------------- suggestions
def _cluster(vectors: np.ndarray, threshold: float) -> np.ndarray:
    from scipy.cluster.hierarchy import fcluster, linkage

    if len(vectors) < 2:
        return np.zeros(len(vectors), np.int64)
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    unit = vectors / np.where(norms > 0, norms, 1.0)
    Z = linkage(unit, method="average", metric="cosine")
    return fcluster(Z, t=1.0 - threshold, criterion="distance")


def suggest_supernodes(
    graph: Graph,
    by: str = "edges",
    transcoders: SparseCoder | None = None,
    threshold: float = 0.8,
    min_size: int = 2,
) -> list[Supernode]:
    """Groups of feature nodes with cosine similarity >= `threshold` (step 2), largest first.

    `by="edges"` compares input-normalized edge profiles (incoming row and outgoing column);
    `by="decoder"` compares decoder directions and needs `transcoders` (`[mlp_set, attn_set]` or
    `TranscoderSets` for a graph with attention features, whose directions are compared among
    themselves: they sit in a block of their own)."""
    check_graph(graph, "suggest_supernodes")
    if not is_real(threshold) or not 0.0 < threshold <= 1.0:
        raise SupernodeError(f"threshold is {shown(threshold)}; pass a cosine similarity in (0, 1].")
    if not is_whole(min_size) or min_size < 1:
        raise SupernodeError(f"min_size is {shown(min_size)}; pass the fewest members of a group, 1 or more.")
    feats = np.flatnonzero(graph.nodes.mask("feature"))
    if by == "edges":
        An = _input_normalized(graph.adjacency)
        vectors = np.hstack([An[feats].toarray(), An[:, feats].T.toarray()])
    elif by == "decoder":
        if transcoders is None:
            raise SupernodeError("by='decoder' compares decoder directions; pass transcoders=.")
        import torch

        if hasattr(transcoders, "mlp"):  # TranscoderSets
            mlp, attn = transcoders.mlp, transcoders.attn
        elif isinstance(transcoders, (list, tuple)):
            mlp, attn = transcoders[0], (transcoders[1] if len(transcoders) > 1 else None)
        else:
            mlp, attn = transcoders, None
        is_attn = graph.nodes.site[feats] == "attn"
        if is_attn.any() and attn is None:
            raise SupernodeError(
                "the graph has attention features; pass transcoders=[mlp_set, attn_set] for their decoders."
            )
        why = provenance_mismatch(graph, None, mlp, attn, attn_presence=False)
        if why is not None:
            raise SupernodeError(f"{why}; pass transcoders= the sets it was built with.")
        L, d = mlp.cfg.n_layers, mlp.cfg.d_model
        vectors = np.zeros((len(feats), 2 * L * d if is_attn.any() else L * d))
        with torch.no_grad():
            for row, i in enumerate(feats):
                layer, f = int(graph.nodes.layer[i]), int(graph.nodes.feature[i])
                tc, at = (attn, (L + layer) * d) if is_attn[row] else (mlp, layer * d)
                dec = tc.decoder_vectors(layer, torch.tensor([f]))[0].double().cpu().numpy()
                vectors[row, at : at + dec.size] = dec.ravel()  # output layers layer..
    else:
        raise SupernodeError(f"by is {by!r}; pass 'edges' or 'decoder'.")
    labels = _cluster(vectors, threshold)
    out = []
    for lab in np.unique(labels):
        idx = feats[labels == lab]
        if len(idx) >= min_size:
            out.append(
                supernode(graph, f"group {len(out)}: " + ", ".join(graph.label(int(i)) for i in idx[:3]), idx)
            )
    out.sort(key=lambda s: -len(s.members))
    return out

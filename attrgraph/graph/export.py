"""Export an attribution graph to other tools' data structures.

1. `to_networkx(graph)`: a `networkx.DiGraph` whose node `i` is row/column `i` of the adjacency,
   carrying the node table as attributes (kind, layer, position, feature, activation, token,
   influence, site, label), and one edge `s -> t` per nonzero `adjacency[t, s]` with attribute `weight`
   (the signed direct effect).
"""

from __future__ import annotations

from dataclasses import fields

import networkx as nx
import numpy as np

from attrgraph.graph.graph import Graph, Nodes, check_graph


def to_networkx(graph: Graph) -> nx.DiGraph:
    """A DiGraph with node and edge attributes; edges point from source to target."""
    check_graph(graph, "to_networkx")
    G = nx.DiGraph()
    G.graph.update(
        prompt_tokens=list(graph.prompt_tokens),
        logit_tokens=graph.logit_tokens.tolist(),
        logit_probs=graph.logit_probs.tolist(),
        **{k: v for k, v in graph.meta.items() if isinstance(v, (str, int, float, bool))},
    )
    columns = {f.name: getattr(graph.nodes, f.name).tolist() for f in fields(Nodes)}
    for i in range(graph.n_nodes):
        G.add_node(i, label=graph.label(i), **{k: v[i] for k, v in columns.items()})
    adj = graph.adjacency.tocoo()
    nonzero = adj.data != 0
    targets, sources, weights = adj.row[nonzero], adj.col[nonzero], adj.data[nonzero]
    G.add_weighted_edges_from(zip(sources.tolist(), targets.tolist(), np.asarray(weights, float).tolist()))
    return G

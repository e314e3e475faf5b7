"""Attribution graphs as data: the `Graph` dataclass, storage, pruning and influence, scores, export.

graph.py               Graph, Nodes and the node order
store.py               HDF5 storage (many graphs per file, atomic writes)
prune.py               normalized adjacency, influence, pruning by cumulative influence
streamed_influence.py  influence and error shares without copying a large adjacency
scores.py              replacement and completeness scores
summary.py             the text summary `attrgraph build` and `show` print
export.py              to networkx
neuronpedia.py         to and from the graph JSON of circuit-tracer's frontend and Neuronpedia
dashboard_lookup.py    which dashboards describe a graph's features, per site (viewer and export)
fingerprint.py         the identity hash a graph's provenance records for its model and sets
supernodes.py          groups of nodes and their adjacency
supernode_store.py     supernodes in the HDF5 file
"""

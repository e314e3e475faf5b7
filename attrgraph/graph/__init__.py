"""Attribution graphs as data: the `Graph` dataclass, storage, pruning and influence, scores, export.

graph.py               Graph, Nodes and the node order
store.py               HDF5 storage (many graphs per file, atomic writes)
prune.py               normalized adjacency, influence, pruning by cumulative influence
streamed_influence.py  influence and error shares without copying a large adjacency
scores.py              replacement and completeness scores
summary.py             the text summary `attrgraph build` and `show` print
export.py              to networkx
neuronpedia.py         to and from the graph JSON of circuit-tracer's frontend and Neuronpedia
supernodes.py          groups of nodes and their adjacency
supernode_store.py     supernodes in the HDF5 file
"""

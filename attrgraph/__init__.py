"""attrgraph: exact attribution graphs and component circuits for transformers.

Public API (each name re-exported here; see the modules for the math):
  load_model       bundled / local / TransformerLens models   (loading.py)
  attribute        prompt -> attribution Graph                 (attribute.py, replacement.py, targets.py)
  prune_graph, compute_influence                               (prune.py)
  save_graph, load_graph, to_networkx                          (store.py, export.py)
  intervene, generate, SetTo/Scale/Add, error_node             (intervene.py)
  Supernode, supernode, suggest_supernodes, supernode_adjacency  (supernodes.py)
  qk_attribution   attention score -> (query, key) source pairs (qk.py)
  attribute_inactive  what holds a feature below threshold     (inactive.py)
  attribute_hierarchical, hierarchical_attribution  detach-during-backward (hierarchical.py)
  attribute_adaptive  partial graphs within a feature budget   (adaptive.py)
  compute_graph_scores  replacement / completeness scores      (scores.py)
"""

from attrgraph.adaptive import attribute_adaptive
from attrgraph.attribute import attribute
from attrgraph.circuits import discover, eap, greedy, hap, peap, prune_edges
from attrgraph.circuits import evaluate as evaluate_circuit
from attrgraph.errors import (
    AttrgraphError,
    ChecksumError,
    CorruptWeightsError,
    GraphError,
    GraphFileError,
    ModelNotFoundError,
    PromptError,
    SchemaVersionError,
    TargetError,
    UnsupportedModelError,
)
from attrgraph.export import to_networkx
from attrgraph.graph import NODE_ORDER, Graph, Nodes
from attrgraph.hierarchical import attribute_hierarchical, hierarchical_attribution
from attrgraph.inactive import InactiveAttribution, attribute_inactive
from attrgraph.intervene import (
    Add,
    InterventionError,
    InterventionOutput,
    Scale,
    SetTo,
    error_node,
    generate,
    intervene,
)
from attrgraph.loading import load_model
from attrgraph.prune import compute_influence, find_threshold, normalize_matrix, prune_graph
from attrgraph.qk import QKAttribution, qk_attribution
from attrgraph.replacement import ReplacementModel
from attrgraph.scores import GraphScores, compute_graph_scores
from attrgraph.store import list_graphs, load_graph, save_graph
from attrgraph.supernodes import (
    NodeKey,
    Supernode,
    load_supernodes,
    save_supernodes,
    suggest_supernodes,
    supernode,
    supernode_adjacency,
)
from attrgraph.targets import Target, direction, logit_difference

__version__ = "0.1.0"

__all__ = [
    "AttrgraphError",
    "ChecksumError",
    "CorruptWeightsError",
    "ModelNotFoundError",
    "PromptError",
    "load_model",
    "attribute",
    "attribute_adaptive",
    "attribute_hierarchical",
    "hierarchical_attribution",
    "compute_graph_scores",
    "GraphScores",
    "Graph",
    "Nodes",
    "NODE_ORDER",
    "ReplacementModel",
    "Target",
    "direction",
    "logit_difference",
    "prune_graph",
    "compute_influence",
    "find_threshold",
    "normalize_matrix",
    "save_graph",
    "load_graph",
    "list_graphs",
    "to_networkx",
    "GraphError",
    "GraphFileError",
    "SchemaVersionError",
    "TargetError",
    "UnsupportedModelError",
    "discover",
    "eap",
    "evaluate_circuit",
    "greedy",
    "hap",
    "peap",
    "prune_edges",
    "intervene",
    "generate",
    "SetTo",
    "Scale",
    "Add",
    "error_node",
    "InterventionOutput",
    "InterventionError",
    "NodeKey",
    "Supernode",
    "supernode",
    "suggest_supernodes",
    "supernode_adjacency",
    "save_supernodes",
    "load_supernodes",
    "qk_attribution",
    "QKAttribution",
    "attribute_inactive",
    "InactiveAttribution",
]

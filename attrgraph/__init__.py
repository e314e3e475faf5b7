"""attrgraph: exact attribution graphs and component circuits for transformers.

Public API (each name re-exported here; see the modules for the math). Names are imported on
first use (`__getattr__`), so that `import attrgraph` does not load h5py, networkx or the
circuits code for a user who only builds graphs:
  load_model       bundled / local / TransformerLens models   (loading.py)
  attribute        prompt -> attribution Graph                 (attribute.py, replacement.py, targets.py)
  to_tokens        prompt -> checked token ids (strict=, truncate=)  (attribute.py)
  prune_graph, compute_influence                               (prune.py)
  save_graph, load_graph, to_networkx                          (store.py, export.py)
  intervene, generate, SetTo/Scale/Add, error_node             (intervene.py)
  Supernode, supernode, suggest_supernodes, supernode_adjacency  (supernodes.py)
  save_supernodes, load_supernodes                              (supernode_store.py)
  qk_attribution   attention score -> (query, key) source pairs (qk.py)
  attribute_inactive  what holds a feature below threshold     (inactive.py)
  attribute_hierarchical, hierarchical_attribution  detach-during-backward (hierarchical.py)
  attribute_adaptive  partial graphs within a feature budget   (adaptive.py)
  compute_graph_scores  replacement / completeness scores      (scores.py)
  discover, eap, peap, greedy, hap, prune_edges, evaluate_circuit  component circuits (circuits/)
"""

from __future__ import annotations

import importlib

# `attribute` and `intervene` are also submodule names: bound eagerly, so that importing the
# submodule later does not shadow the function
from attrgraph.attribute import attribute as attribute
from attrgraph.intervene import intervene as intervene

__version__ = "0.1.0"

_EXPORTS = {  # module -> public names it provides (name: same name there, or "name=there")
    "attrgraph.adaptive": ["attribute_adaptive"],
    "attrgraph.attribute": ["attribute", "to_tokens"],
    "attrgraph.circuits": [
        "discover",
        "eap",
        "greedy",
        "hap",
        "peap",
        "prune_edges",
        "evaluate_circuit=evaluate",
    ],
    "attrgraph.errors": [
        "AttrgraphError",
        "ChecksumError",
        "CorruptWeightsError",
        "GraphError",
        "GraphFileError",
        "ModelNotFoundError",
        "PromptError",
        "PromptWarning",
        "SchemaVersionError",
        "TargetError",
        "UnsupportedModelError",
    ],
    "attrgraph.export": ["to_networkx"],
    "attrgraph.graph": ["NODE_ORDER", "Graph", "Nodes"],
    "attrgraph.hierarchical": ["attribute_hierarchical", "hierarchical_attribution"],
    "attrgraph.inactive": ["InactiveAttribution", "attribute_inactive"],
    "attrgraph.intervene": [
        "Add",
        "InterventionError",
        "InterventionOutput",
        "Scale",
        "SetTo",
        "error_node",
        "generate",
        "intervene",
    ],
    "attrgraph.loading": ["load_model"],
    "attrgraph.prune": ["compute_influence", "find_threshold", "normalize_matrix", "prune_graph"],
    "attrgraph.qk": ["QKAttribution", "qk_attribution"],
    "attrgraph.replacement": ["ReplacementModel"],
    "attrgraph.scores": ["GraphScores", "compute_graph_scores"],
    "attrgraph.store": ["list_graphs", "load_graph", "save_graph"],
    "attrgraph.supernode_store": ["load_supernodes", "save_supernodes"],
    "attrgraph.supernodes": [
        "NodeKey",
        "Supernode",
        "suggest_supernodes",
        "supernode",
        "supernode_adjacency",
    ],
    "attrgraph.targets": ["Target", "direction", "logit_difference"],
}
_WHERE = {
    name.split("=")[0]: (module, name.split("=")[-1]) for module, names in _EXPORTS.items() for name in names
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module 'attrgraph' has no attribute {name!r}")
    module, attr = _WHERE[name]
    value = getattr(importlib.import_module(module), attr)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))

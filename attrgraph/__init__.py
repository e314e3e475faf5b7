"""attrgraph: exact attribution graphs and component circuits for transformers.

Layout (dependencies point one way: cli -> viewer -> analysis -> engine -> graph; circuits and bundled
beside them; errors.py below everything):
  engine/    the frozen replacement model and the attribution methods
  graph/     Graph, HDF5 storage, pruning and influence, scores, supernodes, export
  analysis/  interventions, validation, QK and inactive-feature attribution
  circuits/  component circuits: EAP, PEAP, Edge Pruning, HAP
  bundled/   the bundled model: tasks, tokenizer, training, loading
  viewer/    the graph viewer: `attrgraph serve` (a local HTTP server) and `show` (Jupyter)
  cli/       the `attrgraph` command
  errors.py  every public exception (one hierarchy under AttrgraphError)

Public API, re-exported here and imported on first use (`__getattr__`), so that
`import attrgraph` does not load torch, h5py, networkx or the circuits code up front:
  load_model, load_model_config (its config alone)   bundled/loading.py
  attribute, attribute_hierarchical, attribute_adaptive, node_biases   engine/
  attribute_pruned (attribute + prune_graph, the full graph never held)   engine/pruned_build.py
  to_tokens (prompt -> checked ids: strict=, truncate=)   engine/sources.py
  Target, direction, logit_difference            engine/targets.py
  ReplacementModel                               engine/replacement.py
  TranscoderSets (MLP set + attention SAE set)   engine/sets.py
  Graph, Nodes, NODE_ORDER                       graph/graph.py
  prune_graph, compute_influence, ...            graph/prune.py
  save_graph, load_graph, list_graphs            graph/store.py
  to_networkx                                    graph/export.py
  export_json, load_json, graph_to_json          graph/neuronpedia.py
  read_view, SharedView, view_link (Neuronpedia links: supernodes, pins, labels)   graph/shared_view.py
  load_pt, save_pt (circuit-tracer's .pt graphs, read and written)   graph/circuit_tracer_pt.py
  compute_graph_scores                           graph/scores.py
  Supernode, supernode, ... save_supernodes      graph/supernodes.py, graph/supernode_store.py
  intervene, generate, SetTo/Scale/Add           analysis/intervene.py
  validate_graph, ValidateConfig                 analysis/validate.py
  qk_attribution, attribute_inactive             analysis/qk.py, analysis/inactive.py
  head_loadings, HeadLoadings                     analysis/head_loadings.py
  virtual_weights, GlobalWeights, output_logit_weights, norm scales   analysis/global_weights.py
  discover, eap, peap, hap, prune_edges, evaluate_circuit  circuits/
  show (the viewer inside Jupyter)               viewer/notebook.py
  AttrgraphError and every subclass              errors.py
"""

from __future__ import annotations

import importlib
import warnings

# as in transcoders/__init__.py: transformer_lens's
# tqdm.auto warns "IProgress not found" in a Jupyter kernel without ipywidgets, then uses its text bar
warnings.filterwarnings("ignore", message="IProgress not found", module="tqdm")

__version__ = "0.1.0"

_EXPORTS = {  # module -> public names it provides (name: same name there, or "name=there")
    "attrgraph.bundled.loading": ["load_model", "load_model_config"],
    "attrgraph.engine.attribute": ["attribute"],
    "attrgraph.engine.sources": ["to_tokens"],
    "attrgraph.engine.hierarchical": ["attribute_hierarchical", "hierarchical_attribution", "node_biases"],
    "attrgraph.engine.adaptive": ["attribute_adaptive"],
    "attrgraph.engine.pruned_build": ["attribute_pruned"],
    "attrgraph.engine.replacement": ["ReplacementModel"],
    "attrgraph.engine.sets": ["TranscoderSets"],
    "attrgraph.engine.targets": ["Target", "direction", "logit_difference", "logit_target"],
    "attrgraph.graph.graph": ["NODE_ORDER", "Graph", "Nodes"],
    "attrgraph.graph.prune": ["compute_influence", "find_threshold", "normalize_matrix", "prune_graph"],
    "attrgraph.graph.store": ["list_graphs", "load_graph", "save_graph"],
    "attrgraph.graph.export": ["to_networkx"],
    "attrgraph.graph.neuronpedia": ["export_json", "graph_to_json", "load_json"],
    "attrgraph.graph.shared_view": ["SharedView", "read_view", "view_link"],
    "attrgraph.graph.circuit_tracer_pt": ["load_pt", "save_pt"],
    "attrgraph.graph.scores": ["GraphScores", "compute_graph_scores"],
    "attrgraph.graph.supernodes": [
        "NodeKey",
        "Supernode",
        "suggest_supernodes",
        "supernode",
        "supernode_adjacency",
    ],
    "attrgraph.graph.supernode_store": ["load_supernodes", "save_supernodes"],
    "attrgraph.analysis.intervene": [
        "Add",
        "InterventionOutput",
        "Scale",
        "SetTo",
        "attn_feature",
        "error_node",
        "generate",
        "intervene",
    ],
    "attrgraph.analysis.validate": ["ValidateConfig", "validate_graph"],
    "attrgraph.analysis.qk": ["QKAttribution", "qk_attribution"],
    "attrgraph.analysis.inactive": ["InactiveAttribution", "attribute_inactive"],
    "attrgraph.analysis.head_loadings": ["HeadLoadings", "head_loadings"],
    "attrgraph.analysis.global_weights": [
        "Connections",
        "GlobalWeights",
        "mean_norm_scales",
        "norm_scales_at",
        "output_logit_weights",
        "virtual_weights",
    ],
    "attrgraph.viewer.notebook": ["show"],
    "attrgraph.circuits.discovery": ["discover"],
    "attrgraph.circuits.eap": ["eap"],
    "attrgraph.circuits.peap": ["peap"],
    "attrgraph.circuits.hap": ["hap"],
    "attrgraph.circuits.construct": ["greedy"],
    "attrgraph.circuits.edge_pruning": ["prune_edges"],
    "attrgraph.circuits.evaluate": ["evaluate_circuit=evaluate"],
    "attrgraph.errors": [
        "AttrgraphError",
        "ChecksumError",
        "CircuitMethodError",
        "ClusterError",
        "ConstantMetricError",
        "CorruptWeightsError",
        "ExportError",
        "ExportWarning",
        "GraphError",
        "GraphFileError",
        "GraphReplacedWarning",
        "InterventionError",
        "LabelError",
        "ModelNameWarning",
        "ModelNotFoundError",
        "ModelStateError",
        "NonFiniteValueError",
        "OptionError",
        "OutputBusyError",
        "PairLengthError",
        "PromptError",
        "PromptWarning",
        "QKError",
        "ResumeError",
        "SchemaError",
        "SchemaVersionError",
        "ServeError",
        "SparsityError",
        "SupernodeError",
        "TargetError",
        "UnsupportedModelError",
        "ValidationError",
        "ViewError",
        "ViewRequestError",
    ],
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

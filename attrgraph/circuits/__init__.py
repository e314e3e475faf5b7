"""Component-level circuits: EAP, position-aware EAP with schemas, Edge Pruning and HAP.

Modules: graph (nodes and edges), pairs (clean/corrupted data, metric), patching (edge-level
hooks), eap (`eap`, EAP and EAP-IG), attention_edges (cross-position q/k/v edge scores), peap
(`peap`), schema, construct (top-n, greedy), edge_pruning (`prune_edges`), hap (`hap`), evaluate
(`evaluate`, faithfulness), store (HDF5, networkx), discovery (`discover`: one method on one task).

The functions named like their modules (`eap`, `peap`, `hap`, `evaluate`) are not re-exported
here, so that `attrgraph.circuits.eap` is always the module: import them from their modules or use
`attrgraph.eap`, `attrgraph.peap`, `attrgraph.hap` and `attrgraph.evaluate_circuit`.
"""

from __future__ import annotations

from attrgraph.circuits.circuit import Circuit, EdgeLayout, EdgeScores
from attrgraph.circuits.construct import greedy, is_connected, top_n
from attrgraph.circuits.discovery import METHODS, Discovery, discover, task_data
from attrgraph.circuits.eap import example_scores
from attrgraph.circuits.edge_pruning import PruneConfig, prune_edges
from attrgraph.circuits.evaluate import Faithfulness
from attrgraph.circuits.evaluate import evaluate as evaluate_circuit
from attrgraph.circuits.graph import ComponentGraph
from attrgraph.circuits.pairs import Pairs, task_pairs
from attrgraph.circuits.schema import Schema, ioi_schema, propose_schema, read_schema
from attrgraph.circuits.store import circuit_to_networkx, list_circuits, load_circuit, save_circuit
from attrgraph.errors import (
    CircuitMethodError,
    ConstantMetricError,
    PairLengthError,
    SchemaError,
    SparsityError,
)

__all__ = [
    "METHODS",
    "Circuit",
    "CircuitMethodError",
    "ComponentGraph",
    "ConstantMetricError",
    "Discovery",
    "EdgeLayout",
    "EdgeScores",
    "Faithfulness",
    "PairLengthError",
    "Pairs",
    "PruneConfig",
    "Schema",
    "SchemaError",
    "SparsityError",
    "circuit_to_networkx",
    "discover",
    "evaluate_circuit",
    "example_scores",
    "greedy",
    "ioi_schema",
    "is_connected",
    "list_circuits",
    "load_circuit",
    "propose_schema",
    "prune_edges",
    "read_schema",
    "save_circuit",
    "task_data",
    "task_pairs",
    "top_n",
]

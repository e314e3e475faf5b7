"""`discover`: run one circuit-finding method on one bundled task and evaluate it on fresh pairs."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from attrgraph.bundled.loading import check_model
from attrgraph.circuits.circuit import Circuit, EdgeScores
from attrgraph.circuits.construct import greedy
from attrgraph.circuits.eap import eap
from attrgraph.circuits.edge_pruning import PruneConfig, prune_edges
from attrgraph.circuits.evaluate import Faithfulness, evaluate
from attrgraph.circuits.hap import check_keep_frac, hap
from attrgraph.circuits.pairs import task_pairs
from attrgraph.circuits.peap import peap
from attrgraph.circuits.schema import ioi_schema, read_schema
from attrgraph.errors import CircuitMethodError, OptionError, SchemaError
from transcoders.arguments import shown
from transcoders.config import is_whole

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

METHODS = ("eap", "eap-ig", "peap", "ep", "hap")
TASKS = ("ioi", "greater-than")
OPTIONS = {
    "eap": ("edges",),
    "eap-ig": ("edges",),
    "peap": ("edges", "aggregation", "schema_path"),
    "ep": ("sparsity", "steps"),
    "hap": ("sparsity", "steps", "keep_frac"),
}
"""The options of `discover` each method reads beyond (task, n, seed); the others it ignores."""


class Discovery(NamedTuple):
    """One method run on one task."""

    circuit: Circuit
    """The circuit found."""
    scores: EdgeScores | None
    """Edge scores (EAP / PEAP; the EAP scores HAP started from)."""
    faithfulness: Faithfulness
    """Evaluated on held-out pairs."""
    seconds: float
    """Wall-clock time of discovery (scores + construction or training), not evaluation."""


def check_discovery(
    task: str,
    method: str,
    n: int,
    edges: int,
    sparsity: float,
    steps: int,
    keep_frac: float,
    schema_path: str | None = None,
    seed: int = 0,
) -> None:
    """Refuse, before any work, what `discover` cannot run (the CLI calls it before loading the
    model): an unknown task or method (`CircuitMethodError`), fewer than 1 example, edge or step
    (`OptionError`), a sparsity or kept fraction outside (0, 1) (`SparsityError`), a schema for
    another method or task than PEAP on IOI (`OptionError`) or a schema file that is not there
    (`SchemaError`); one line each."""
    _check_task(task, n)
    if method not in METHODS:
        raise CircuitMethodError(f"method {method!r} is unknown; use one of {', '.join(METHODS)}.")
    if method in ("eap", "eap-ig", "peap") and (not is_whole(edges) or edges < 1):
        raise OptionError(f"edges (--edges) is {shown(edges)}; pass the circuit's size, at least 1 edge.")
    if not is_whole(seed):
        raise OptionError(f"seed is {shown(seed)}; pass a whole number.")
    if method in ("ep", "hap"):
        PruneConfig(sparsity=sparsity, steps=steps)  # refuses a sparsity outside (0, 1) and steps < 1
    if method == "hap":
        check_keep_frac(sparsity, keep_frac)
    if schema_path is not None:
        if (method, task) != ("peap", "ioi"):
            raise OptionError(
                f"a schema names spans of IOI's examples for peap; it does not apply to {method} on {task}."
            )
        if not Path(schema_path).is_file():
            raise SchemaError(f"schema file {schema_path} does not exist or is not a file.")


def _check_task(task: str, n: int) -> None:
    if task not in TASKS:
        raise CircuitMethodError(f"task {task!r} is unknown; use one of {', '.join(TASKS)}.")
    if not is_whole(n) or n < 1:
        raise OptionError(f"n (--n) is {n!r}; pass at least 1 example (as many again are made to evaluate).")


def task_data(model: HookedTransformer, task: str, n: int, seed: int = 0):
    """(discovery pairs, evaluation pairs, discovery examples, evaluation examples) for 'ioi' or 'greater-than'."""
    from attrgraph.bundled.tasks import greater_than_pairs, ioi_pairs

    _check_task(task, n)  # any other name was taken for greater-than
    make = ioi_pairs if task == "ioi" else greater_than_pairs
    train, test = make(n, seed=seed), make(n, seed=seed + 1)
    return task_pairs(model, train), task_pairs(model, test), train, test


def discover(
    model: HookedTransformer,
    task: str,
    method: str,
    n: int = 100,
    edges: int = 50,
    sparsity: float = 0.95,
    steps: int = 200,
    keep_frac: float = 0.3,
    aggregation: str = "avg",
    schema_path: str | None = None,
    seed: int = 0,
) -> Discovery:
    """Find a circuit for `task` with `method` (eap, eap-ig, peap, ep, hap) and evaluate it on fresh pairs."""
    check_model(model)
    check_discovery(task, method, n, edges, sparsity, steps, keep_frac, schema_path, seed)
    train_p, test_p, train, test = task_data(model, task, n, seed)
    start = time.perf_counter()
    scores, schema_test = None, None
    if method in ("eap", "eap-ig"):
        scores = eap(model, train_p, ig_steps=5 if method == "eap-ig" else 0)
        circuit = greedy(scores, edges)
    elif method == "peap":
        schema = None
        if task == "ioi":
            schema = (
                read_schema(schema_path, (train_p.last + 1).tolist()) if schema_path else ioi_schema(train)
            )
            schema_test = ioi_schema(test)
        scores = peap(model, train_p, schema=schema, aggregation=aggregation)
        circuit = greedy(scores, edges)
    elif method == "ep":
        circuit = prune_edges(model, train_p, PruneConfig(sparsity=sparsity, steps=steps, seed=seed)).circuit
    else:  # hap (check_discovery refused any other method)
        scores = eap(model, train_p)
        circuit = hap(
            model, train_p, PruneConfig(sparsity=sparsity, steps=steps, seed=seed), keep_frac, scores=scores
        ).circuit
    seconds = time.perf_counter() - start
    return Discovery(circuit, scores, evaluate(model, test_p, circuit, schema=schema_test), seconds)

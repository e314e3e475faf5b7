"""Circuits on the bundled model: the CLI end to end, the faithfulness figures the README quotes
(recomputed in the benchmark's exact setting and compared with its results files), and the
schema-based positional circuit's known answers."""

import json
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.bundled("default")  # fails, never skips, when data/default is missing

RESULTS = Path(__file__).resolve().parents[3] / "benchmarks" / "results"

# README, "Component circuits": normalized faithfulness as quoted, with the number of decimals it is
# quoted to, for (task, method, requested edges) of `benchmarks.circuits`.
QUOTED = {
    ("ioi", "peap", 20): (0.91, 2),
    ("greater-than", "peap", 40): (0.975, 3),
    ("greater-than", "eap", 40): (0.982, 3),
    ("ioi", "hap", 40): (0.963, 3),
    ("ioi", "ep", 40): (0.950, 3),
    ("greater-than", "hap", 40): (0.981, 3),
    ("greater-than", "ep", 40): (0.985, 3),
}
# README: "EAP needs 20 edges that expand to 1,344 per-position edges" (IOI); "1,898 expanded EAP
# edges" (greater-than, 40 requested, 41 kept).
QUOTED_EXPANDED = {("ioi", "eap", 20): 1344, ("greater-than", "eap", 40): 1898}
# Recomputing in the benchmark's setting gives the results files' numbers to within 3e-7 (float32
# summation order; 1 and 2 torch threads agree exactly), so 1e-5 leaves room and no more.
TOL = 1e-5


@pytest.fixture(scope="module")
def model():
    from attrgraph.bundled.loading import load_model

    return load_model("default")


def _results(task: str) -> dict:
    return json.loads((RESULTS / f"circuits_{task}.json").read_text())


def _check_row(task, method, k, size_index, circuit, f, n_pos, steps=None):
    """`circuit` and its faithfulness `f` against the results file's row, then the README's quote."""
    from benchmarks.circuits import expanded_edges

    data = _results(task)
    row = [r for r in data["rows"] if r["method"] == method][size_index]
    where = f"{task} {method} {k} edges"
    assert (circuit.n_edges, expanded_edges(circuit, n_pos)) == (row["edges"], row["edges_expanded"]), where
    assert f.normalized == pytest.approx(row["normalized"], abs=TOL), where
    assert f.soft == pytest.approx(row["soft"], abs=TOL), where
    assert f.hard == pytest.approx(row["hard"], abs=TOL), where
    assert f.metric_model == pytest.approx(data["model_metric"], rel=TOL)
    assert f.metric_corrupt == pytest.approx(data["corrupt_metric"], rel=TOL)
    if steps is not None:
        assert steps == row["steps"], where
    if (task, method, k) in QUOTED:
        value, decimals = QUOTED[task, method, k]
        assert abs(f.normalized - value) <= 0.5 * 10**-decimals + TOL, where
        assert round(row["normalized"], decimals) == value, (
            f"{where}: the results file disagrees with the README"
        )
    if (task, method, k) in QUOTED_EXPANDED:
        assert row["edges_expanded"] == QUOTED_EXPANDED[task, method, k], where


@pytest.mark.parametrize("task", ["ioi", "greater-than"])
def test_eap_and_peap_faithfulness_are_the_quoted_figures(model, task):
    """`benchmarks/results/circuits_{task}.json`, rows eap and peap at 20 and 40 requested edges
    (normalized and soft faithfulness, hard agreement, edge counts), recomputed in the benchmark's
    setting: 48 discovery pairs (seed 0) and 48 evaluation pairs (seed 1), greedy construction;
    IOI's PEAP over the built-in schema. Among them the README's IOI PEAP 0.91 at 20 edges (EAP: 20
    edges, 1,344 expanded) and greater-than PEAP 0.975 at 40 vs EAP 0.982 at 1,898 expanded edges.

    These figures depend on the pair sample: with pair seeds 1-3 instead of 0 (48 pairs each) IOI
    PEAP at 20 edges gave 0.916, 0.873, 0.614, IOI EAP at 20 edges 0.935, 0.930, 0.919,
    greater-than PEAP at 40 edges 0.953, 0.965, 0.976 and EAP at 40 (41 kept) 0.998, 1.003, 0.994.
    Within one sample the computation is deterministic, which is what this test pins."""
    from attrgraph.circuits import example_scores, greedy, ioi_schema, task_data
    from attrgraph.circuits.eap import eap
    from attrgraph.circuits.evaluate import evaluate
    from attrgraph.circuits.peap import peap
    from benchmarks.circuits import SIZES

    train_p, test_p, train, test = task_data(model, task, _results(task)["n"], seed=0)
    n_pos = int(train_p.last.max()) + 1
    schema, schema_test = (ioi_schema(train), ioi_schema(test)) if task == "ioi" else (None, None)
    s_eap = eap(model, train_p)
    ex = example_scores(model, train_p, cross_position=True)
    s_peap = peap(model, train_p, schema=schema, example=ex)
    for k in (20, 40):
        c = greedy(s_eap, k)
        _check_row(task, "eap", k, SIZES.index(k), c, evaluate(model, test_p, c), n_pos)
        c = greedy(s_peap, k)
        _check_row(task, "peap", k, SIZES.index(k), c, evaluate(model, test_p, c, schema=schema_test), n_pos)


@pytest.mark.slow
@pytest.mark.parametrize("task", ["ioi", "greater-than"])
def test_edge_pruning_and_hap_faithfulness_are_the_quoted_figures(model, task):
    """`benchmarks/results/circuits_{task}.json`, rows ep and hap at 15 and 40 edges (faithfulness,
    edge counts, optimizer steps), recomputed in the benchmark's setting; among them the README's
    HAP vs EP at 40 edges (IOI 0.963 vs 0.950, greater-than 0.981 vs 0.985). About 40 s for IOI
    and 30 s for greater-than on one thread of an idle machine."""
    from attrgraph.circuits import PruneConfig, prune_edges, task_data
    from attrgraph.circuits.evaluate import evaluate
    from attrgraph.circuits.hap import hap
    from benchmarks.circuits import EP_SIZES, PATIENCE

    data = _results(task)
    train_p, test_p, _, _ = task_data(model, task, data["n"], seed=0)
    n_pos = int(train_p.last.max()) + 1
    for i, k in enumerate(EP_SIZES):
        cfg = PruneConfig(
            sparsity=1 - k / data["n_edges"], steps=data["steps"], batch_size=16, patience=PATIENCE
        )
        r = prune_edges(model, train_p, cfg)
        _check_row(task, "ep", k, i, r.circuit, evaluate(model, test_p, r.circuit), n_pos, len(r.kl))
        r = hap(model, train_p, cfg, keep_frac=0.3)
        _check_row(task, "hap", k, i, r.circuit, evaluate(model, test_p, r.circuit), n_pos, len(r.kl))


def test_cli_finds_evaluates_and_stores_a_circuit(tmp_path, capsys):
    from attrgraph.circuits.store import load_circuit
    from attrgraph.cli import main

    out = tmp_path / "c.h5"
    assert (
        main(
            [
                "circuit",
                "--task",
                "greater-than",
                "--method",
                "eap",
                "--n",
                "16",
                "--edges",
                "30",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    printed = capsys.readouterr().out
    report = json.loads(printed[: printed.rindex("}") + 1])
    assert report["edges"] >= 30 and 0.0 <= report["hard"] <= 1.0
    circuit, scores = load_circuit(out, "greater-than-eap")
    assert circuit.n_edges == report["edges"] and scores is not None


def test_peap_on_ioi_with_the_builtin_schema_recovers_the_model(model):
    """Known answers of a schema circuit: all edges are the model, and only END feeds the logits."""
    from attrgraph.circuits import ioi_schema, task_data
    from attrgraph.circuits.circuit import Circuit
    from attrgraph.circuits.evaluate import evaluate
    from attrgraph.circuits.peap import peap

    train_p, test_p, train, test = task_data(model, "ioi", 12)
    scores = peap(model, train_p, schema=ioi_schema(train))
    assert scores.layout.positions[-1] == "END"
    full = Circuit.from_flat(scores.layout, torch.ones(scores.layout.n_edges))
    f = evaluate(model, test_p, full, schema=ioi_schema(test))
    assert f.soft == pytest.approx(1.0, abs=1e-4) and f.metric_model > f.metric_corrupt
    # the metric is read at END, so every residual edge into the logits elsewhere scores 0
    g = scores.layout.graph
    assert (scores.resid[:-1, :, g.down_logits] == 0).all()

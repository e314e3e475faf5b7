"""Circuits on the bundled model: the CLI end to end, and a known-answer sanity check."""

import json

import pytest
import torch

pytestmark = pytest.mark.bundled("default")  # fails, never skips, when data/default is missing


@pytest.fixture(scope="module")
def model():
    from attrgraph.loading import load_model

    return load_model("default")


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
    from attrgraph.circuits import greedy, ioi_schema, peap, task_data
    from attrgraph.circuits.circuit import Circuit
    from attrgraph.circuits.evaluate import evaluate

    train_p, test_p, train, test = task_data(model, "ioi", 12)
    scores = peap(model, train_p, schema=ioi_schema(train))
    assert scores.layout.positions[-1] == "END"
    full = Circuit.from_flat(scores.layout, torch.ones(scores.layout.n_edges))
    f = evaluate(model, test_p, full, schema=ioi_schema(test))
    assert f.soft == pytest.approx(1.0, abs=1e-4) and f.metric_model > f.metric_corrupt
    # the metric is read at END, so every residual edge into the logits elsewhere scores 0
    g = scores.layout.graph
    assert (scores.resid[:-1, :, g.down_logits] == 0).all()
    c = greedy(scores, 40)
    assert evaluate(model, test_p, c, schema=ioi_schema(test)).normalized > 0.5

"""A stored component circuit as the page draws it: its kept edges with their stored scores,
its nodes in rows by layer and columns by position."""

import re

import numpy as np
import pytest

from attrgraph.circuits.construct import edge_table
from attrgraph.circuits.store import load_circuit, node_names
from attrgraph.viewer.circuit_payload import circuit_payload
from tests.attrgraph.viewer.viewer_helpers import toy_circuits


@pytest.fixture(scope="module")
def circuit_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("circuits") / "c.h5"
    toy_circuits(path)
    return path


@pytest.mark.parametrize("name", ["toy-eap", "toy-peap"])
def test_kept_edges_with_their_scores(circuit_file, name):
    circuit, scores = load_circuit(circuit_file, name)
    data = circuit_payload(circuit_file, name)
    parent, child, *_ = edge_table(circuit.layout)
    names, edge_names = node_names(circuit.layout), circuit.layout.edge_names()
    kept = np.flatnonzero(circuit.flat().numpy())
    label = [n["label"] for n in data["nodes"]]
    drawn = sorted((label[s], label[t], n) for (s, t, _), n in zip(data["edges"], data["edge_labels"]))
    expected = sorted((names[parent[e]], names[child[e]], edge_names[e]) for e in kept)
    assert data["n_edges"] == circuit.n_edges == len(drawn) and drawn == expected
    score = dict(zip(data["edge_labels"], (w for *_, w in data["edges"])))
    assert all(score[edge_names[e]] == pytest.approx(float(scores.flat()[e]), rel=1e-5) for e in kept)
    assert "logits" in label and "input" in {x.split("@")[0] for x in label}


def expected_row(base: str, n_layers: int, positional: bool) -> int:
    """Rows bottom to top: input; per layer (q/k/v inputs when positional), heads, MLP; logits."""
    per = 3 if positional else 2
    if base == "input":
        return 0
    if base == "logits":
        return per * n_layers + 1
    if m := re.fullmatch(r"m(\d)", base):
        return per * int(m[1]) + per
    m = re.fullmatch(r"a(\d)\.h\d(\.[qkv])?", base)
    return per * int(m[1]) + (1 if m[2] else per - 1)


@pytest.mark.parametrize("name,positional", [("toy-eap", False), ("toy-peap", True)])
def test_rows_by_layer_and_columns_by_position(circuit_file, name, positional):
    data = circuit_payload(circuit_file, name)
    assert len(data["row_labels"]) == (3 if positional else 2) * 2 + 2
    assert data["row_labels"][:3] == (
        ["input", "L0 q/k/v", "L0 heads"] if positional else ["input", "L0 heads", "L0 mlp"]
    )
    assert data["col_labels"] == (["t0", "t1", "t2"] if positional else ["all positions"])
    for n in data["nodes"]:
        base, _, at = n["label"].partition("@")
        assert n["row"] == expected_row(base, 2, positional), n["label"]
        if at:
            assert data["col_labels"][n["col"]] == at
        else:  # the logits (at the last position), or any node of a non-positional circuit
            assert n["col"] == (len(data["col_labels"]) - 1 if positional else 0)

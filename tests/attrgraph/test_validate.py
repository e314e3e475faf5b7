"""Validation: influence columns equal the dense formula, faithfulness is perfect when the
replacement is the model, the report is written, and the CLI runs on the bundled model."""

import json
import math

import numpy as np
import pytest
import torch
from ag_helpers import random_graph, tiny_model, tiny_transcoders

from attrgraph.attribute import attribute
from attrgraph.prune import normalize_matrix
from attrgraph.replacement import ReplacementModel
from attrgraph.validate import ValidateConfig, faithfulness, influence_columns, validate_graph
from attrgraph.validation_report import write_report

TOKENS = [3, 17, 5, 9, 17, 5, 22, 8, 4, 11]


def test_influence_columns_equal_the_dense_formula():
    g = random_graph(3)
    A = normalize_matrix(g.adjacency).toarray()
    B = np.linalg.inv(np.eye(len(A)) - A) - np.eye(len(A))
    src = np.array([7, 9, 12])
    np.testing.assert_allclose(influence_columns(g, src), B[:, src], atol=1e-12)


def test_faithfulness_is_perfect_when_the_replacement_is_exact():
    """With MLPs that output nothing and transcoders that decode nothing, the replacement model is the
    model: every perturbation has the same effect in both (cosine 1, normalized MSE 0)."""
    model = tiny_model("gpt2", n_layers=3)
    tc = tiny_transcoders(model, "plt")
    with torch.no_grad():
        for block in model.blocks:
            block.mlp.W_out.zero_()
            block.mlp.b_out.zero_()
        tc.W_dec.zero_()
        tc.b_dec.zero_()
    rm = ReplacementModel(model, tc)
    state = rm.run(torch.tensor(TOKENS), exclude_bos=False)
    out = faithfulness(rm, state, ValidateConfig(n_perturbations=4))
    assert set(out) == {"encoder", "random", "upstream"}
    for kind in ("encoder", "random"):
        np.testing.assert_allclose(out[kind]["cosine"], 1.0, atol=1e-9)
        np.testing.assert_allclose(out[kind]["nmse"], 0.0, atol=1e-12)


def test_validate_graph_and_report(tmp_path):
    model = tiny_model("gpt2", n_layers=3)
    tc = tiny_transcoders(model, "clt")
    graph = attribute(model, tc, TOKENS, exclude_bos=False)
    cfg = ValidateConfig(max_features=30, n_perturbations=3, windows=(0, 99))
    res = validate_graph(model, tc, graph, cfg)
    n2l = res["node_to_logit"]
    assert n2l["n_features"] == 30 and set(n2l["windows"]) == {"0", "99"}
    assert all(-1 <= v <= 1 for v in n2l["mean"].values() if not math.isnan(v))
    assert np.all(np.array(n2l["_scatter"]["kl"]) >= 0) and max(n2l["_scatter"]["kl"]) > 0
    ff = res["feature_to_feature"]
    assert ff["n_pairs"] > 50 and -1 <= ff["spearman"] <= 1
    # effects are real: ablating a source changes some downstream activation
    assert max(ff["_scatter"]["effect"]) > 0
    for v in res["faithfulness"].values():
        assert all(-1 - 1e-9 <= c <= 1 + 1e-9 for c in v["cosine"] if not math.isnan(c))
    summary = write_report([res, res], ["a", "b"], tmp_path, stem="validate")
    for f in (
        "validate.json",
        "validate.md",
        "validate_node_to_logit.png",
        "validate_feature_to_feature.png",
        "validate_faithfulness.png",
    ):
        assert (tmp_path / f).stat().st_size > 0
    assert json.loads((tmp_path / "validate.json").read_text())["summary"]["n_graphs"] == 2
    assert summary["feature_to_feature_spearman_mean"] == pytest.approx(ff["spearman"])


@pytest.mark.slow
@pytest.mark.bundled("default", "default-plt")
def test_validate_cli_on_the_bundled_model(tmp_path):
    """`attrgraph build` then `attrgraph validate` on the bundled model and its PLT."""
    from attrgraph.cli import main

    path = tmp_path / "g.h5"
    prompt = "When Mary and John went to the store , John gave a drink to"
    assert main(["build", prompt, "-o", str(path), "--transcoders", "default-plt", "--json"]) == 0
    out = tmp_path / "report"
    assert (
        main(["validate", str(path), "-o", str(out), "--max-features", "10", "--n-perturbations", "2"]) == 0
    )
    summary = json.loads((out / "validate.json").read_text())["summary"]
    assert summary["n_graphs"] == 1 and (out / "validate_faithfulness.png").exists()

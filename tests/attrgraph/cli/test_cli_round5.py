"""Bad input, round 5 (docs/bad_inputs.md, "Round 5"), on the command line: an option the chosen
method does not take, and validation settings that make no sense. Each is one line on stderr and
exit status 2 before the model loads (the tests pass a model that does not exist, whose own error
would come first otherwise), with nothing written."""

import sys

import pytest

from attrgraph.graph.store import save_graph
from tests.attrgraph.ag_helpers import random_graph
from tests.attrgraph.cli.test_cli import error_line, run

NO_MODEL = ["--model", "/nonexistent/model"]

METHOD_OPTIONS = [
    # before: a TypeError traceback from attribute_pruned after the model loaded
    (["--tau", "0.5"], "--method standard does not take --tau (--tau is for --method hierarchical)"),
    # before: the Python sentence (`method='adaptive' needs max_feature_nodes`) after the model loaded
    (["--method", "adaptive"], "--method adaptive needs --max-feature-nodes, the most features to explore."),
    (
        ["--method", "hierarchical", "--max-logits", "3"],
        "--method hierarchical does not take --max-logits (--max-logits is for --method standard or "
        "--method adaptive); leave it out or change --method.",
    ),
    (["--method", "hierarchical", "--precision", "bf16"], "--method hierarchical does not take --precision"),
    (["--method", "hierarchical", "--max-feature-nodes", "8"], "does not take --max-feature-nodes"),
    (
        ["--max-feature-nodes", "8", "--logit-prob", "0.9", "--tau", "1"],
        "--method adaptive does not take --tau",
    ),
]


@pytest.mark.parametrize("args,said", METHOD_OPTIONS)
def test_build_refuses_an_option_its_method_does_not_take_before_the_model_loads(
    tmp_path, capsys, args, said
):
    rc, out, err = run(capsys, "build", "Mary and John", "-o", tmp_path / "g.h5", *NO_MODEL, *args)
    assert rc == 2 and out == ""
    assert said in error_line(err, "build")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args,said", METHOD_OPTIONS[:2])
def test_build_many_refuses_them_before_ray(tmp_path, capsys, monkeypatch, args, said):
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` meets when Ray is not installed
    (tmp_path / "p.jsonl").write_text('{"prompt": "hello"}\n')
    rc, _, err = run(capsys, "build-many", tmp_path / "p.jsonl", "-o", tmp_path / "g.h5", *NO_MODEL, *args)
    assert rc == 2 and said in error_line(err, "build-many")
    assert [p.name for p in tmp_path.iterdir()] == ["p.jsonl"]


def test_build_still_takes_each_methods_own_options(model_dir, tmp_path, capsys):
    """The same check lets through what each method takes (fp32 counts as no precision asked)."""
    for args in (
        ["--method", "hierarchical", "--tau", "0.1", "--precision", "fp32"],
        ["--max-feature-nodes", "8", "--max-logits", "2"],
    ):
        rc, _, err = run(
            capsys, "build", "When Mary and John went to the store", "-o", tmp_path / "g.h5", "--model", model_dir,
            "--transcoders", model_dir / "tc", "--no-progress", *args,
        )  # fmt: skip
        assert rc == 0, err


@pytest.mark.parametrize(
    "args,said",
    [
        (["--max-features", "0"], "--max-features is 0; --max-features and --batch-size must be >= 1"),
        (["--batch-size", "0"], "--batch-size is 0; --max-features and --batch-size must be >= 1"),
        (["--n-perturbations", "-1"], "--n-perturbations is -1; "),
    ],
)
def test_validate_settings_are_refused_before_the_model_loads(tmp_path, capsys, args, said):
    """Before: the config's line, naming fields, after the graphs were read and the model and
    transcoders loaded. Now the flag and its value, before anything loads."""
    save_graph(random_graph(0), tmp_path / "g.h5")
    rc, out, err = run(capsys, "validate", tmp_path / "g.h5", *NO_MODEL, *args)
    assert rc == 2 and out == ""
    assert said in error_line(err, "validate")
    assert [p.name for p in tmp_path.iterdir()] == ["g.h5"]

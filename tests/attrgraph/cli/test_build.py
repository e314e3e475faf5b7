"""The `attrgraph build` and `attrgraph show` commands on a tiny model folder, and the summary."""

import json

import h5py
import pytest

from attrgraph.cli import main
from attrgraph.errors import GraphFileError
from attrgraph.graph.store import list_graphs, load_graph

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPT = "When Mary and John went to the store , John gave a drink to"


def test_build_then_show(model_dir, tmp_path, capsys):
    out = tmp_path / "g.h5"
    args = [
        "build",
        PROMPT,
        "-o",
        str(out),
        "--model",
        str(model_dir),
        "--transcoders",
        str(model_dir / "tc"),
        "--max-logits",
        "3",
        "--batch-size",
        "64",
        "--no-progress",
        "--full",
    ]
    assert main(args) == 0
    text = capsys.readouterr().out
    for piece in ("full:", "pruned:", "logits:", "top features by logit influence", "wall time"):
        assert piece in text
    assert list_graphs(out) == ["graph", "graph_full"]
    full, pruned = load_graph(out, "graph_full"), load_graph(out, "graph")
    assert pruned.n_nodes <= full.n_nodes and len(full.logit_tokens) <= 3
    assert main(["show", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["name"] == "graph"
    assert summary["n_nodes"] == pruned.n_nodes and summary["n_edges"] == pruned.n_edges
    assert summary["n_features"] == pruned.n_features
    assert summary["logit_tokens"] == pruned.logit_tokens.tolist()
    assert len(summary["logit_probs"]) == len(summary["logit_tokens"])
    assert main(["show", str(out), "--name", "graph_full"]) == 0
    assert "graph_full" in capsys.readouterr().out


def test_build_refuses_empty_prompt_and_show_a_bad_file(tmp_path, capsys):
    # the CLI turns a user's mistake into its one sentence on stderr and exit status 2
    assert main(["build", "  ", "-o", str(tmp_path / "g.h5")]) == 2
    assert "prompt is empty" in capsys.readouterr().err
    assert not (tmp_path / "g.h5").exists()
    bad = tmp_path / "bad.h5"
    bad.write_bytes(b"\x89HDF\r\n\x1a\n" + b"\x00" * 64)  # an HDF5 signature and nothing after it
    assert main(["show", str(bad)]) == 2
    assert str(bad) in capsys.readouterr().err
    with pytest.raises(GraphFileError):
        load_graph(bad)
    with h5py.File(tmp_path / "empty.h5", "w"):
        pass
    assert main(["show", str(tmp_path / "empty.h5")]) == 2
    assert "no graphs" in capsys.readouterr().err


@pytest.mark.parametrize(
    "extra, check",
    [
        (
            ["--max-feature-nodes", "5"],
            lambda g: g.meta["method"] == "adaptive" and g.meta["n_explored"] <= 5,
        ),
        (["--method", "hierarchical", "--tau", "1e-3"], lambda g: "root_value" in g.meta),
    ],
    ids=["adaptive", "hierarchical"],
)
def test_build_passes_method_options_through(model_dir, tmp_path, extra, check):
    out = tmp_path / "g.h5"
    args = [
        "build",
        PROMPT,
        "-o",
        str(out),
        "--model",
        str(model_dir),
        "--transcoders",
        str(model_dir / "tc"),
    ]
    assert main(args + ["--no-progress", "--full", *extra]) == 0
    full = load_graph(out, "graph_full")
    assert check(full)


def test_build_with_attention_saes(model_dir, tmp_path, capsys):
    """`--attn-transcoders` adds attention features and errors to the graph; an MLP set in its
    place is refused in one line (exit 2)."""
    import torch

    from attrgraph.bundled.loading import load_model
    from tests.attrgraph.ag_helpers import tiny_attn_saes
    from transcoders.formats import save_transcoders

    save_transcoders(tiny_attn_saes(load_model(model_dir)).to(torch.float32), tmp_path / "attn")
    out = tmp_path / "g.h5"
    args = [
        "build",
        PROMPT,
        "-o",
        str(out),
        "--model",
        str(model_dir),
        "--transcoders",
        str(model_dir / "tc"),
    ]
    assert main([*args, "--attn-transcoders", str(tmp_path / "attn"), "--no-progress", "--full"]) == 0
    text = capsys.readouterr().out
    assert "attention:" in text
    full = load_graph(out, "graph_full")
    assert full.nodes.mask("feature", "attn").sum() > 0 and full.nodes.mask("error", "attn").sum() > 0
    assert (
        full.meta["attn_transcoders"] == str(tmp_path / "attn") and "attn_transcoder_fingerprint" in full.meta
    )
    # validate finds the attention set in the graph's meta
    v = ["validate", str(out), "--name", "graph_full", "-o", str(tmp_path / "v"), "--max-features", "4"]
    assert main([*v, "--n-perturbations", "1"]) == 0
    assert (tmp_path / "v" / "validate.json").exists()
    capsys.readouterr()
    assert main([*args, "--attn-transcoders", str(model_dir / "tc"), "-o", str(tmp_path / "bad.h5")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "attention set is a 'plt' set" in err[0]


@pytest.mark.parametrize("full", [False, True])
def test_build_precision_reaches_the_engine(model_dir, tmp_path, full):
    """`--precision bf16` builds (streamed pruned build, and with --full the full graph) with
    bfloat16 products: the graph records it, and its edges sit within bfloat16's few per cent of the
    fp32 graph's; a precision the engine does not take is argparse's one line, exit 2."""
    import numpy as np

    graphs = {}
    for precision in ("fp32", "bf16"):
        out = tmp_path / f"{precision}.h5"
        args = ["build", PROMPT, "-o", str(out), "--model", str(model_dir), "--transcoders"]
        args += [str(model_dir / "tc"), "--no-progress", "--precision", precision] + (["--full"] * full)
        assert main(args) == 0
        graphs[precision] = load_graph(out, "graph_full" if full else "graph")
    assert graphs["bf16"].meta["precision"] == "bf16" and graphs["fp32"].meta["precision"] == "fp32"
    a, b = graphs["fp32"], graphs["bf16"]
    if full:  # the forward pass, hence the nodes, are the model's; only the backward's products change
        np.testing.assert_array_equal(a.nodes.feature, b.nodes.feature)
        err = np.abs((b.adjacency - a.adjacency).toarray()).max() / np.abs(a.adjacency).max()
        assert 0 < err < 0.05
    with pytest.raises(SystemExit) as stop:
        main(["build", PROMPT, "-o", str(tmp_path / "x.h5"), "--precision", "fp16"])
    assert stop.value.code == 2

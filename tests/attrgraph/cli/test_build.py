"""The `attrgraph build` and `attrgraph show` commands on a tiny model folder, and the summary."""

import json

import h5py
import pytest
import torch
from safetensors.torch import save_file

from attrgraph.bundled import tasks
from attrgraph.bundled.tokenizer import build_tokenizer
from attrgraph.cli import main
from attrgraph.errors import GraphFileError
from attrgraph.graph.store import list_graphs, load_graph
from tests.attrgraph.ag_helpers import tiny_transcoders
from transcoders.formats import save_transcoders

pytestmark = pytest.mark.usefixtures("one_torch_thread")

PROMPT = "When Mary and John went to the store , John gave a drink to"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A model folder as `load_model` reads it (config.json, model.safetensors, tokenizer/) plus transcoders."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    root = tmp_path_factory.mktemp("tiny_model")
    tok = build_tokenizer(tasks.vocabulary(), root / "tokenizer")
    kwargs = dict(
        n_layers=2,
        d_model=16,
        n_heads=4,
        d_head=4,
        d_mlp=64,
        d_vocab=len(tok),
        n_ctx=32,
        act_fn="gelu",
        normalization_type="LN",
        seed=0,
    )
    (root / "config.json").write_text(json.dumps(kwargs))
    model = HookedTransformer(HookedTransformerConfig(**kwargs))
    save_file(
        {k: v.contiguous() for k, v in model.state_dict().items() if not k.endswith((".mask", ".IGNORE"))},
        str(root / "model.safetensors"),
    )
    save_transcoders(tiny_transcoders(model, "plt").to(torch.float32), root / "tc")
    return root


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

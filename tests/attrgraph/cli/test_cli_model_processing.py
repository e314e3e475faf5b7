"""The command line loads the model as its sets were trained on it (cli/build.py `model_for`): a set
recording folded norms (TransformerLens's default processing; sae_lens sets with `fold_ln`) gets the
processed model, any other the model as it is. Before, `build` always loaded it unprocessed and was
refused with advice only Python could follow (`attrgraph.load_model(name, processing=True)`). The
oracle is Python's own path: `load_model(name, processing=True)` and `attribute`, value for value."""

import json
import shutil

import numpy as np

from attrgraph.bundled.loading import load_model
from attrgraph.engine.attribute import attribute
from attrgraph.graph.store import load_graph
from tests.attrgraph.cli.test_cli import run
from transcoders import load_transcoders
from transcoders.paths import BUNDLED

PROMPT = "When Mary and John went to the store"


def folded_copy(tmp_path):
    """The bundled PLT, its config saying it was trained on the processed model (manifest dropped:
    the edit would fail its checksum)."""
    folder = tmp_path / "plt-folded"
    shutil.copytree(BUNDLED["default-plt"], folder)
    (folder / "manifest.json").unlink(missing_ok=True)
    meta = json.loads((folder / "config.json").read_text())
    meta["config"]["folded_norms"] = True
    (folder / "config.json").write_text(json.dumps(meta))
    return folder


def test_build_loads_the_model_processed_for_a_set_trained_so(tmp_path, capsys):
    folder = folded_copy(tmp_path)
    out = tmp_path / "g.h5"
    rc, _, err = run(capsys, "build", PROMPT, "--transcoders", folder, "-o", out, "--full", "--no-progress")
    assert rc == 0, err
    ours = load_graph(out, "graph_full")
    model = load_model("default", processing=True)
    assert model.cfg.normalization_type == "LNPre"
    expected = attribute(model, load_transcoders(folder), PROMPT)
    assert ours.adjacency.shape == expected.adjacency.shape
    np.testing.assert_allclose(ours.adjacency.toarray(), expected.adjacency.toarray(), rtol=0, atol=1e-6)


def test_validate_does_too(tmp_path, capsys):
    folder = folded_copy(tmp_path)
    out = tmp_path / "g.h5"
    assert run(capsys, "build", PROMPT, "--transcoders", folder, "-o", out, "--no-progress")[0] == 0
    rc, _, err = run(capsys, "validate", out, "--out", tmp_path / "v", "--no-progress")
    assert rc == 0, err


def test_an_unfolded_set_keeps_the_model_as_it_is(tmp_path, capsys):
    out = tmp_path / "g.h5"
    rc, _, err = run(capsys, "build", PROMPT, "-o", out, "--full", "--no-progress")
    assert rc == 0, err
    expected = attribute(load_model("default"), load_transcoders("default-plt"), PROMPT)
    np.testing.assert_allclose(
        load_graph(out, "graph_full").adjacency.toarray(), expected.adjacency.toarray(), rtol=0, atol=1e-6
    )

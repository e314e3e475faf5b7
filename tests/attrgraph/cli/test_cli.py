"""The `attrgraph` command line on bad input (the matrix of ../shared/BAD_INPUTS.md): every mistake
is one line on stderr and exit status 2, never a traceback, and nothing is written; a doubtful
prompt is one warning line. Each test is one row of the matrix."""

import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import h5py
import pytest

from attrgraph.cli import main
from attrgraph.graph.store import load_graph, save_graph
from tests.attrgraph.ag_helpers import bars_finished
from transcoders.config import TranscoderConfig
from transcoders.formats import save_transcoders
from transcoders.manifest import sha256
from transcoders.plt import PerLayerTranscoder

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROOT = Path(__file__).resolve().parents[3]
LATIN1 = "caf\udce9"  # what Python makes of the argv bytes b"caf\xe9" on Linux (a surrogate escape)


def run(capsys, *args) -> tuple[int, str, str]:
    rc = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return rc, out, err


def error_line(err: str, command: str) -> str:
    """The one line of an error (and no traceback)."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"attrgraph {command}: error: "), err
    return lines[0]


def model_args(model_dir):
    return ["--model", model_dir, "--transcoders", model_dir / "tc"]


@pytest.mark.parametrize("command", ["build", "predict"])
def test_prompt_that_is_not_utf8(model_dir, tmp_path, capsys, command):
    out = ["-o", tmp_path / "g.h5"] if command == "build" else []
    extra = model_args(model_dir) if command == "build" else ["--model", model_dir]
    rc, _, err = run(capsys, command, LATIN1, *out, *extra)
    assert rc == 2
    line = error_line(err, command)
    assert "not valid UTF-8: byte 0xe9 at character 3" in line and "iconv" in line
    assert list(tmp_path.iterdir()) == []


def test_prompt_bytes_from_a_real_command_line(model_dir):
    """The same row through a real argv (bytes that are not UTF-8), in a subprocess."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "attrgraph.cli", "predict", b"caf\xe9", "--model", str(model_dir)]
    res = subprocess.run(cmd, capture_output=True, env=env, cwd=ROOT, timeout=120)
    assert res.returncode == 2
    assert error_line(res.stderr.decode(), "predict").endswith("iconv -f latin1 -t utf-8).")
    assert "byte 0xe9" in res.stderr.decode()


def test_unknown_words_warn_and_strict_refuses(model_dir, tmp_path, capsys):
    rc, out, err = run(capsys, "predict", "zxqv blorf", "--model", model_dir)
    assert rc == 0 and len(out.splitlines()) == 5
    (line,) = err.strip().splitlines()
    assert line.startswith("attrgraph predict: warning: 2 of 2 prompt tokens (100%)")
    assert "'zxqv', 'blorf'" in line
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # as PYTHONWARNINGS=ignore would: the CLI still says it
        assert run(capsys, "predict", "zxqv blorf", "--model", model_dir)[2] == err
    rc, _, err = run(capsys, "predict", "zxqv blorf", "--model", model_dir, "--strict")
    assert rc == 2 and "'zxqv', 'blorf'" in error_line(err, "predict")
    g = tmp_path / "g.h5"
    rc, _, err = run(capsys, "build", "When Mary and zxqv went", "-o", g, *model_args(model_dir), "--strict")
    assert rc == 2 and "1 of 5 prompt tokens (20%)" in error_line(err, "build")
    assert not g.exists()
    rc, _, err = run(
        capsys, "build", "When Mary and zxqv went", "-o", g, *model_args(model_dir), "--no-progress"
    )
    assert rc == 0 and g.exists()
    assert err.strip() == (
        "attrgraph build: warning: 1 of 5 prompt tokens (20%) are not in the model's vocabulary and "
        "become '<unk>': 'zxqv'; the model sees that token, not these words (strict=True / --strict "
        "refuses such prompts)."
    )


def test_prompt_longer_than_the_context(model_dir, tmp_path, capsys):
    prompt = " ".join(["the"] * 35 + ["store", "bank", "gift", "cup"])  # 1 + 39 tokens, n_ctx 32
    g = tmp_path / "g.h5"
    rc, _, err = run(capsys, "build", prompt, "-o", g, *model_args(model_dir))
    assert rc == 2
    assert "prompt has 40 tokens but the model's context is 32" in error_line(err, "build")
    assert not g.exists()
    rc, _, err = run(capsys, "build", prompt, "-o", g, *model_args(model_dir), "--truncate", "--no-progress")
    assert rc == 0
    (line,) = err.strip().splitlines()
    assert line == (
        "attrgraph build: warning: prompt has 40 tokens but the model's context is 32; truncated: "
        "dropped the last 8 tokens ('the the the the store bank gift cup')."
    )
    assert len(load_graph(g).prompt_ids) == 32
    rc, _, err = run(capsys, "predict", prompt, "--model", model_dir)
    assert rc == 2 and "--truncate" in error_line(err, "predict")


def test_unknown_transformer_lens_model(capsys):
    rc, _, err = run(capsys, "predict", "hello", "--model", "gpt2-smal")
    assert rc == 2
    line = error_line(err, "predict")
    assert len(line) < 250, line  # not the list of every official name
    assert line.endswith("did you mean 'gpt2-small' or 'opt-small' or 'gpt2-xs'?")
    rc, _, err = run(capsys, "predict", "hello", "--model", "qwerty")
    assert rc == 2 and "OFFICIAL_MODEL_NAMES" in error_line(err, "predict")


def test_output_in_a_folder_that_does_not_exist(model_dir, tmp_path, capsys):
    g = tmp_path / "new" / "folder" / "g.h5"
    rc, _, _ = run(
        capsys, "build", "When Mary and John went", "-o", g, *model_args(model_dir), "--no-progress"
    )
    assert rc == 0 and load_graph(g).n_nodes > 0
    with pytest.raises(SystemExit) as exit_:
        main(["build", "--help"])
    assert exit_.value.code == 0
    assert "missing parent folders are created" in " ".join(capsys.readouterr().out.split())


def _truncated(tmp_path, g):
    data = (tmp_path / "good.h5").read_bytes()
    g.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda tmp, g: None, "does not exist"),
        (lambda tmp, g: g.write_bytes(b""), "not an HDF5 file"),
        (lambda tmp, g: g.write_text("a text file\n"), "not an HDF5 file"),
        (_truncated, "damaged or truncated"),
    ],
    ids=["missing", "empty", "text", "truncated"],
)
def test_show_on_a_bad_file(make_random_graph, tmp_path, capsys, make, expected):
    save_graph(make_random_graph(0, n_feat=300), tmp_path / "good.h5")
    g = tmp_path / "g.h5"
    make(tmp_path, g)
    rc, _, err = run(capsys, "show", g)
    assert rc == 2
    line = error_line(err, "show")
    assert str(g) in line and expected in line


def test_show_a_graph_name_that_is_not_there(make_random_graph, tmp_path, capsys):
    save_graph(make_random_graph(0), tmp_path / "g.h5", name="ioi")
    rc, _, err = run(capsys, "show", tmp_path / "g.h5", "--name", "ioi_2")
    assert rc == 2
    assert "has no graph named 'ioi_2'; it holds ['ioi']" in error_line(err, "show")


@pytest.mark.parametrize(
    "cfg, expected",
    [
        (dict(n_layers=2, d_model=8), "d_model"),
        (dict(n_layers=3, d_model=16), "layers"),
    ],
    ids=["d_model", "n_layers"],
)
def test_transcoders_that_do_not_fit_the_model(model_dir, tmp_path, capsys, cfg, expected):
    tc = tmp_path / "tc"
    save_transcoders(PerLayerTranscoder(TranscoderConfig(kind="plt", d_sae=4, **cfg)), tc)
    g = tmp_path / "g.h5"
    rc, _, err = run(
        capsys, "build", "When Mary and John went", "-o", g, "--model", model_dir, "--transcoders", tc
    )
    assert rc == 2 and expected in error_line(err, "build")
    assert not g.exists()


def test_transcoders_whose_config_says_another_width(model_dir, tmp_path, capsys):
    tc = tmp_path / "tc"
    shutil.copytree(model_dir / "tc", tc)
    meta = json.loads((tc / "config.json").read_text())
    meta["config"]["d_sae"] = 7  # the weights hold 24 features per layer
    (tc / "config.json").write_text(json.dumps(meta))
    rc, _, err = run(
        capsys, "build", "When Mary went", "-o", tmp_path / "g.h5", "--model", model_dir, "--transcoders", tc
    )
    assert rc == 2 and "shape" in error_line(err, "build")


@pytest.mark.parametrize("folder", ["model", "transcoders"])
def test_edited_config_with_the_old_sha256(model_dir, tmp_path, capsys, folder):
    shutil.copytree(model_dir, tmp_path / "m")
    where = tmp_path / "m" if folder == "model" else tmp_path / "m" / "tc"
    manifest = {"files": {"config.json": sha256(where / "config.json")}}
    (where / "manifest.json").write_text(json.dumps(manifest))
    assert run(capsys, "predict", "When Mary went", "--model", tmp_path / "m")[0] == 0
    config = json.loads((where / "config.json").read_text())
    (where / "config.json").write_text(json.dumps(config, indent=2))  # same content, other bytes
    rc, _, err = run(
        capsys,
        "build",
        "When Mary went",
        "-o",
        tmp_path / "g.h5",
        "--model",
        tmp_path / "m",
        "--transcoders",
        tmp_path / "m" / "tc",
    )
    assert rc == 2 and "does not match the sha256" in error_line(err, "build")
    assert not (tmp_path / "g.h5").exists()


def test_progress_bars_of_every_long_step_are_on_stderr(model_dir, tmp_path, capsys):
    args = ["build", "When Mary and John went to the store", *model_args(model_dir)]
    rc, _, err = run(capsys, *args, "-o", tmp_path / "a.h5")
    assert rc == 0
    # the full graph's rows streamed into its influence (attribute_pruned), then the node-pruned
    # graph's influence pass
    assert bars_finished(err, "attribution (rows into influence)") == 1
    assert bars_finished(err, "influence") == 1
    rc, _, err = run(capsys, *args, "-o", tmp_path / "a.h5", "--full")
    assert rc == 0
    # attribution, then two influence passes: the full graph's once, in attribute (pruning takes
    # it from there instead of computing it again), and the node-pruned graph's in pruning
    assert bars_finished(err, "attribution (linear)") == 1 and bars_finished(err, "influence") == 2
    rc, _, err = run(capsys, *args, "-o", tmp_path / "b.h5", "--no-progress")
    assert rc == 0 and err == ""


def test_a_full_graph_file_is_not_left_half_written(model_dir, tmp_path, capsys):
    """A refused run leaves an existing output file as it was."""
    g = tmp_path / "g.h5"
    assert run(capsys, "build", "When Mary went", "-o", g, *model_args(model_dir), "--no-progress")[0] == 0
    before = g.read_bytes()
    rc, _, _ = run(capsys, "build", "zxqv", "-o", g, *model_args(model_dir), "--strict")
    assert rc == 2 and g.read_bytes() == before
    with h5py.File(g) as f:
        assert list(f["graphs"]) == ["graph"]
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


NO_CUDA = pytest.mark.skipif(
    __import__("torch").cuda.is_available(),
    reason="this machine has CUDA, so --device cuda is no mistake here",
)


@pytest.mark.parametrize(
    "device, expected",
    [
        pytest.param(
            "cuda", "device 'cuda' was asked for, but CUDA is not available on this machine", marks=NO_CUDA
        ),
        ("gpu", "device 'gpu' is not a torch device; pass cpu, cuda, cuda:N or mps."),
    ],
)
@pytest.mark.parametrize("command", ["build", "build-many", "validate", "train-transcoders"])
def test_a_device_this_machine_lacks(
    model_dir, make_random_graph, tmp_path, capsys, command, device, expected
):
    """`--device cuda` without CUDA (or a name torch does not know): one line, exit 2, nothing written,
    before anything loads."""
    graph = tmp_path / "g.h5"
    args = {
        "build": ["build", "hello", "-o", graph, *model_args(model_dir)],
        "build-many": ["build-many", tmp_path / "p.jsonl", "-o", graph, *model_args(model_dir)],
        "validate": ["validate", graph, *model_args(model_dir)],
        "train-transcoders": ["train-transcoders", "--model", model_dir, "--out", tmp_path / "run"],
    }[command]
    if command == "build-many":
        (tmp_path / "p.jsonl").write_text('{"prompt": "hello"}\n')
    if command == "validate":
        save_graph(make_random_graph(0), graph)
    before = sorted(tmp_path.iterdir())
    rc, _, err = run(capsys, *args, "--device", device)
    assert rc == 2
    assert expected in error_line(err, command)
    assert sorted(tmp_path.iterdir()) == before


def test_train_module_device_this_machine_lacks(capsys):
    """`python -m transcoders.train --device gpu`: the config's refusal, exit 2, no traceback."""
    from transcoders.train import main as train_main

    with pytest.raises(SystemExit) as e:
        train_main(["--device", "gpu"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "error: device 'gpu' is not a torch device" in err and "Traceback" not in err

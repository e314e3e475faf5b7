"""The command line on the bad input of round 2 (../shared/BAD_INPUTS.md): each row is one line on
stderr and exit status 2 (Ctrl-C: 130), no traceback, nothing written; checks that need no model
come before it loads (shown by a model path that does not exist: were the model loaded first, its
error would be the one reported)."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import h5py
import pytest
import torch

from attrgraph.cli import main
from attrgraph.graph.store import save_graph
from tests.attrgraph.ag_helpers import bars_finished, random_graph
from tests.attrgraph.cli.test_cli import error_line, model_args, run
from tests.interrupts import interrupted
from transcoders import load_transcoders, save_transcoders

pytestmark = pytest.mark.usefixtures("one_torch_thread")
ROOT = Path(__file__).resolve().parents[3]
NO_MODEL = ["--model", "/nonexistent/model", "--transcoders", "/nonexistent/tc"]


@pytest.mark.parametrize(
    "args, expected",
    [
        (["--threads", "0"], "--threads is 0; pass at least 1."),
        (["--threads", "99999999999999999999"], "--threads is 99999999999999999999; pass at most 1024"),
        (["--method", "hierarchical", "--tau", "-1"], "--tau is -1.0; pass an attribution of 0 or more"),
        (["--max-feature-nodes", "0"], "--max-feature-nodes is 0; pass at least 1."),
        (["--node-threshold", "2"], "--node-threshold is 2.0; pass a fraction in [0, 1]"),
        (["--node-threshold", "-0.5"], "--node-threshold is -0.5; pass a fraction in [0, 1]"),
        (["--node-threshold", "nan"], "--node-threshold is nan; pass a fraction in [0, 1]"),
        (["--edge-threshold", "1.5"], "--edge-threshold is 1.5; pass a fraction in [0, 1]"),
        (["--max-logits", "0"], "--max-logits is 0; pass at least 1."),
        (["--logit-prob", "0"], "--logit-prob is 0.0; pass a probability in (0, 1]"),
        (["--batch-size", "0"], "--batch-size is 0; pass at least 1."),
    ],
)
@pytest.mark.parametrize("command", ["build", "build-many"])
def test_options_that_make_no_sense(tmp_path, capsys, command, args, expected):
    (tmp_path / "p.jsonl").write_text('{"prompt": "hello"}\n')
    first = "hello" if command == "build" else tmp_path / "p.jsonl"
    rc, _, err = run(capsys, command, first, "-o", tmp_path / "g.h5", *NO_MODEL, *args)
    assert rc == 2 and expected in error_line(err, command)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.jsonl"]


def test_show_top_below_zero(tmp_path, capsys):
    save_graph(random_graph(0), tmp_path / "g.h5")
    rc, out, err = run(capsys, "show", tmp_path / "g.h5", "--top", "-3")
    assert rc == 2 and "--top is -3; pass 0 or more" in error_line(err, "show") and out == ""


def test_show_takes_file_colon_name_as_export_does(tmp_path, capsys):
    path = tmp_path / "g.h5"
    save_graph(random_graph(0, n_feat=10), path, name="graph")
    save_graph(random_graph(1, n_feat=25), path, name="other")
    rc, out, _ = run(capsys, "show", f"{path}:other", "--json")
    assert rc == 0 and json.loads(out)["name"] == "other" and json.loads(out)["n_features"] == 25
    rc, _, err = run(capsys, "show", f"{path}:nope")
    assert rc == 2 and "has no graph named 'nope'" in error_line(err, "show")
    rc, _, err = run(capsys, "show", f"{path}:other", "--name", "graph")
    assert rc == 2 and "pass one of them" in error_line(err, "show")


def test_top_level_help_description_is_whole_sentences(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    description = out.split("\n\n")[1].strip()  # argparse: usage, blank line, description
    assert description.endswith(".") and "attribution graphs" in description, description


def test_validate_on_a_file_without_graphs(tmp_path, capsys):
    path = tmp_path / "circuits.h5"
    with h5py.File(path, "w") as f:  # what `circuit --out` writes: circuits, no graphs
        f.create_group("circuits").create_dataset("edges", data=[1, 2, 3])
    rc, _, err = run(capsys, "validate", path, *NO_MODEL)
    assert rc == 2 and "holds no graphs" in error_line(err, "validate")


def test_validate_shows_a_progress_bar_per_graph(model_dir, tmp_path, capsys):
    g = tmp_path / "g.h5"
    for name in ("a", "b"):
        rc = main(["build", "When Mary went", "-o", str(g), "--name", name, *map(str, model_args(model_dir))])
        assert rc == 0
    capsys.readouterr()
    small = ["--max-features", "3", "--n-perturbations", "2", "-o", tmp_path / "report"]
    rc, _, err = run(capsys, "validate", g, *model_args(model_dir), *small)
    assert rc == 0 and bars_finished(err, "validate") == 2
    rc, _, err = run(capsys, "validate", g, *model_args(model_dir), *small, "--no-progress")
    assert rc == 0 and "validate:" not in err


@pytest.mark.parametrize("kind", ["folder", "text file", "file as folder"])
def test_outputs_that_cannot_be_written_are_found_before_the_model_loads(tmp_path, capsys, kind):
    (tmp_path / "notes.txt").write_text("keep me")
    out = {
        "folder": tmp_path,
        "text file": tmp_path / "notes.txt",
        "file as folder": tmp_path / "notes.txt" / "g.h5",
    }
    rc, _, err = run(capsys, "build", "hello", "-o", out[kind], *NO_MODEL)
    line = error_line(err, "build")
    assert rc == 2 and "/nonexistent" not in line
    assert {"folder": "is a folder; pass a file name", "text file": "so no graph can be added"}.get(
        kind, "is a file"
    ) in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_a_read_only_output_folder_is_found_before_the_model_loads(read_only_dir, capsys):
    rc, _, err = run(capsys, "build", "hello", "-o", read_only_dir / "g.h5", *NO_MODEL)
    assert rc == 2 and "pass an output in a folder you can write" in error_line(err, "build")


def test_build_many_without_ray_writes_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` meets when Ray is not installed
    (tmp_path / "p.jsonl").write_text('{"prompt": "hello"}\n{"oops": 1}\n')
    rc, _, err = run(capsys, "build-many", tmp_path / "p.jsonl", "-o", tmp_path / "graphs.h5", *NO_MODEL)
    assert rc == 2 and "needs Ray, which is not installed" in error_line(err, "build-many")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.jsonl"]


def test_a_set_with_nan_weights_is_refused_by_build(model_dir, tmp_path, capsys):
    tc = load_transcoders(model_dir / "tc")
    with torch.no_grad():
        tc.W_enc[0, :, :2] = float("nan")  # two features of a diverged run; no manifest
    save_transcoders(tc, tmp_path / "tc")
    rc, _, err = run(
        capsys,
        "build",
        "When Mary went",
        "-o",
        tmp_path / "g.h5",
        "--model",
        model_dir,
        "--transcoders",
        tmp_path / "tc",
    )
    assert rc == 2 and f"W_enc holds {2 * tc.cfg.d_model} of" in error_line(err, "build")
    assert not (tmp_path / "g.h5").exists()


# ------------------------------------------------------------------ Ctrl-C, in a real process
@pytest.mark.parametrize("existing", [pytest.param(False, marks=pytest.mark.slow), True])  # ~10 s each
def test_ctrl_c_while_a_graph_is_written(model_dir, tmp_path, existing):
    g = tmp_path / "g.h5"
    if existing:
        save_graph(random_graph(0), g, name="other")
    before = g.read_bytes() if existing else None
    args = ["build", "When Mary and John went to the store", "-o", g, "--full", *model_args(model_dir)]
    res = interrupted("attrgraph.cli", args, "attrgraph.graph.store", "_write_array")
    assert res.returncode == 130, res.stderr[-3000:]
    assert "Traceback" not in res.stderr and "Exception ignored" not in res.stderr
    assert (
        res.stderr.strip().splitlines()[-1]
        == "attrgraph build: interrupted; any file being written is left as it was."
    )
    assert (g.read_bytes() if g.exists() else None) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == (["g.h5"] if existing else [])


def test_ctrl_c_during_attribution(model_dir, tmp_path):
    args = ["build", "When Mary went", "-o", tmp_path / "g.h5", "--no-progress", *model_args(model_dir)]
    res = interrupted("attrgraph.cli", args, "attrgraph.engine.pruned_build", "attribute_pruned")
    assert res.returncode == 130, res.stderr[-3000:]
    assert res.stderr.strip().splitlines() == [
        "attrgraph build: interrupted; any file being written is left as it was."
    ]
    assert list(tmp_path.iterdir()) == []


FULL = """
import resource, signal, sys
from attrgraph.cli import main
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), resource.RLIM_INFINITY))
sys.exit(main(sys.argv[2:]))
"""


def test_a_full_disk_while_build_writes(model_dir, tmp_path):
    """RLIMIT_FSIZE as the full disk (any user may set it; test_store_failures.py also fills a real tmpfs)."""
    g = tmp_path / "g.h5"
    save_graph(random_graph(0), g, name="other")
    before = g.read_bytes()
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    args = ["build", "When Mary went", "-o", g, "--full", "--no-progress", *model_args(model_dir)]
    cmd = [sys.executable, "-c", FULL, str(len(before) + 4096), *map(str, args)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=600)
    assert res.returncode == 2, res.stderr[-3000:]
    assert "the file would pass the size limit" in error_line(res.stderr, "build")
    assert g.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["g.h5"]


def test_a_second_ctrl_c_while_exiting_changes_nothing():
    """A second SIGINT that lands in an atexit hook (torch registers some) after the first ended
    the command: still the one line and 130, no "Exception ignored in atexit callback"."""
    script = (
        "import atexit, os, signal, sys, time\n"
        "import attrgraph.cli.show as show\n"
        "from attrgraph.cli import main\n"
        "def run(args):\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    time.sleep(30)\n"
        "show.run = run\n"
        "atexit.register(lambda: (os.kill(os.getpid(), signal.SIGINT), time.sleep(0.5)))\n"
        "sys.exit(main(['show', 'g.h5']))\n"
    )
    res = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert res.returncode == 130, res.stderr[-3000:]
    assert res.stderr.strip().splitlines() == [
        "attrgraph show: interrupted; any file being written is left as it was."
    ]


def test_main_gives_an_in_process_caller_its_sigint_handler_back(tmp_path):
    before = signal.getsignal(signal.SIGINT)
    assert main(["show", str(tmp_path / "missing.h5")]) == 2
    assert signal.getsignal(signal.SIGINT) is before

"""The command line on the faults of round 3 (issue 30, parts 2 and 3; docs/bad_inputs.md): writes
that must keep their promise (all or nothing, Ctrl-C, outputs that cannot be written, symbolic
links, a graph name already in the file) and messages (a closed pipe, resume keys, `<bos>` as
text). Each is one line on stderr and exit status 2 (Ctrl-C: 130), no traceback."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from attrgraph.graph.store import list_graphs, save_graph
from tests.attrgraph.ag_helpers import random_graph
from tests.attrgraph.cli.test_cli import error_line, model_args, run
from transcoders.h5file import RESERVE

pytestmark = pytest.mark.usefixtures("one_torch_thread")
ROOT = Path(__file__).resolve().parents[3]
ENV = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
PROMPT = "When Mary and John went to the store"
NO_MODEL = ["--model", "/nonexistent/model", "--transcoders", "/nonexistent/tc"]
FULL = """
import resource, signal, sys
from attrgraph.cli import main
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]), resource.RLIM_INFINITY))
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.slow  # ~10 s: a build in its own process (test_cli_round2 has a full disk by default)
def test_build_full_on_a_full_disk_writes_neither_graph(model_dir, tmp_path):
    """The file-size limit (RLIMIT_FSIZE, a full disk any user can make) leaves room for the pruned
    graph (a few kB plus the writer's 1 MiB margin) but not for the unpruned one (~130 kB of edges):
    the message promises the old file unchanged, so the pruned graph must not be written alone."""
    g = tmp_path / "g.h5"
    save_graph(random_graph(0), g, name="other")
    before = g.read_bytes()
    args = ["build", PROMPT, "-o", g, "--full", "--no-progress", *model_args(model_dir)]
    cmd = [sys.executable, "-c", FULL, str(len(before) + RESERVE + 64 * 1024), *map(str, args)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=600)
    assert res.returncode == 2, res.stderr[-3000:]
    assert "(the old file, if any, is unchanged)" in error_line(res.stderr, "build")
    assert list_graphs(g) == ["other"] and g.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.h5"]


# ------------------------------------------------------------------ Ctrl-C inside h5py's own write
INSIDE_H5PY = """
import os, signal, sys, weakref
from h5py._hl import selections
from attrgraph.cli import main

real = selections.SimpleSelection.broadcast


class Freed:
    pass


def ctrl_c(ref):
    os.kill(os.getpid(), signal.SIGINT)


def broadcast(self, source_shape):
    # h5py's Dataset.__setitem__ writes each dataspace this generator yields; resumed after the
    # write of the first edge slice of the full graph, it sends two Ctrl-Cs from a weakref
    # callback, as h5py frees its objects through weakref callbacks mid-write: an exception a
    # handler raises there is printed and dropped by CPython ("Exception ignored in ...")
    for fspace in real(self, source_shape):
        yield fspace
        if source_shape == (SIZE,) and not broadcast.sent:
            broadcast.sent = True
            print("written", flush=True)
            for _ in range(2):
                obj = Freed()
                ref = weakref.ref(obj, ctrl_c)
                del obj  # the callback runs here, inside h5py's __setitem__


broadcast.sent = False
selections.SimpleSelection.broadcast = broadcast
SIZE = int(sys.argv[1])
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.slow  # ~10 s: a build in its own process (test_cli_round2 has Ctrl-C by default)
def test_ctrl_c_inside_an_h5py_write_stops_it(model_dir, tmp_path):
    """Two Ctrl-Cs that land inside h5py while it writes the full graph's edges into a file that
    holds another graph: the CLI's own SIGINT handler (cli/__init__.py) must be held as Python's is,
    or its KeyboardInterrupt is lost inside h5py, the write finishes and the command exits 0."""
    from attrgraph.bundled.loading import load_model
    from attrgraph.engine.attribute import attribute
    from transcoders.formats import load_transcoders

    model = load_model(model_dir)
    full = attribute(model, load_transcoders(model_dir / "tc"), model.to_tokens(PROMPT)[0])
    g = tmp_path / "g.h5"
    save_graph(random_graph(0), g, name="other")
    before = g.read_bytes()
    args = ["build", PROMPT, "-o", g, "--full", "--no-progress", *model_args(model_dir)]
    cmd = [sys.executable, "-c", INSIDE_H5PY, str(full.adjacency.nnz), *map(str, args)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=ROOT, timeout=600)
    assert res.stdout.splitlines()[0] == "written"  # the signals were sent inside the write
    assert res.returncode == 130, res.stderr[-3000:]
    assert "Traceback" not in res.stderr and "Exception ignored" not in res.stderr
    assert res.stderr.strip().splitlines() == [
        "attrgraph build: interrupted; any file being written is left as it was."
    ]
    assert g.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["g.h5"]


# ------------------------------------------------------------------ outputs build-many cannot write
@pytest.mark.parametrize("kind", ["read-only folder", "folder"])
def test_build_many_outputs_that_cannot_be_written_are_one_line_before_ray(
    read_only_dir, tmp_path, capsys, monkeypatch, kind
):
    """Found before Ray is even imported: without Ray installed, the output's line still comes first."""
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` meets when Ray is not installed
    (tmp_path / "p.jsonl").write_text('{"prompt": "hello"}\n')
    out = read_only_dir / "g.h5" if kind == "read-only folder" else tmp_path
    rc, _, err = run(capsys, "build-many", tmp_path / "p.jsonl", "-o", out, *NO_MODEL)
    words = {
        "read-only folder": "pass an output in a folder you can write",
        "folder": "is a folder; pass a file name",
    }
    assert rc == 2 and words[kind] in error_line(err, "build-many")
    assert (
        sorted(p.name for p in tmp_path.iterdir()) == ["p.jsonl", "ro"]
        and list(read_only_dir.iterdir()) == []
    )


def test_a_second_build_many_run_through_a_symbolic_link_is_refused(tmp_path):
    """The run lock is the target's: a run on the link while one runs on the file is refused."""
    from attrgraph.cli.build_many import one_run
    from attrgraph.errors import OutputBusyError

    target = tmp_path / "g.h5"
    save_graph(random_graph(0), target)
    (tmp_path / "link.h5").symlink_to(target)
    with one_run(target):
        with pytest.raises(OutputBusyError, match=rf"another build-many run \(pid {os.getpid()}\)"):
            with one_run(tmp_path / "link.h5"):
                pass
    with one_run(tmp_path / "link.h5"):  # released: the next run goes on
        pass
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.h5", "link.h5"]


# ------------------------------------------------------------------ a graph name already in the file
@pytest.mark.parametrize(
    "extra, said",
    [
        ([], "g.h5 already holds 'graph'; this build replaces it (pass --name to keep it)."),
        (["--full"], "g.h5 already holds 'graph' and 'graph_full'; this build replaces them"),
        (["--name", "graph_full"], "g.h5 already holds 'graph_full'; this build replaces it"),
        (["--name", "new"], None),
    ],
)
def test_build_says_before_the_work_that_it_replaces_a_graph(tmp_path, capsys, extra, said):
    """Said before the model loads (the missing model's error comes after the warning)."""
    g = tmp_path / "g.h5"
    save_graph(random_graph(0), g, name="graph")
    save_graph(random_graph(1), g, name="graph_full")
    rc, _, err = run(capsys, "build", "hello", "-o", g, *NO_MODEL, *extra)
    lines = err.strip().splitlines()
    assert rc == 2 and lines[-1].startswith("attrgraph build: error: ") and "/nonexistent" in lines[-1]
    if said is None:
        assert len(lines) == 1
    else:
        assert len(lines) == 2 and lines[0].startswith("attrgraph build: warning: ") and said in lines[0]


# ------------------------------------------------------------------ messages
def test_show_into_a_closed_pipe_ends_quietly(tmp_path):
    """`attrgraph show g.h5 | head -3` once head has gone: the pipe's read end is closed before the
    command starts, so every write meets it (no timing). No traceback, and the status of a command
    that SIGPIPE ended (128 + 13), as `yes | head` gives."""
    g = tmp_path / "g.h5"
    save_graph(random_graph(0, n_feat=300), g)
    r, w = os.pipe()
    os.close(r)
    try:
        cmd = [sys.executable, "-m", "attrgraph.cli", "show", str(g), "--top", "300"]
        res = subprocess.run(cmd, stdout=w, stderr=subprocess.PIPE, text=True, env=ENV, cwd=ROOT, timeout=120)
    finally:
        os.close(w)
    assert res.returncode == 128 + signal.SIGPIPE and res.stderr == "", res.stderr[-3000:]


@pytest.mark.parametrize(
    "prompt, said",
    [
        ("<bos>", "'<bos>' at token 1 (a second BOS)"),
        ("When Mary went <eos> John", "'<eos>' at token 4;"),
    ],
)
def test_special_tokens_written_in_the_prompt_are_said_and_strict_refuses_them(
    model_dir, tmp_path, capsys, prompt, said
):
    """The bundled tokenizer reads "<bos>" in the text as its BOS token (id 0), after the one the
    model adds in front: without a word the graph had two BOS tokens and features at position 1."""
    g = tmp_path / "g.h5"
    rc, _, err = run(capsys, "build", prompt, "-o", g, "--no-progress", *model_args(model_dir))
    [line] = err.strip().splitlines()
    assert (
        rc == 0
        and line.startswith("attrgraph build: warning: prompt text holds special tokens")
        and said in line
    )
    rc, _, err = run(capsys, "build", prompt, "-o", tmp_path / "s.h5", *model_args(model_dir), "--strict")
    assert rc == 2 and said in error_line(err, "build") and not (tmp_path / "s.h5").exists()


def test_a_written_bos_is_the_one_bos_of_a_model_that_adds_none(model_dir):
    import warnings

    from attrgraph.bundled.loading import load_model
    from attrgraph.engine.sources import to_tokens

    model = load_model(model_dir)
    model.cfg.default_prepend_bos = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails
        tokens = to_tokens(model, "<bos> When Mary went")
    assert tokens.tolist()[0] == model.tokenizer.bos_token_id and len(tokens) == 4

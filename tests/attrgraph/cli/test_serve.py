"""`attrgraph serve FILE`: serves on 127.0.0.1 until stopped; a port in use, a file with nothing
to view and a bad port are one line and exit code 2; another host is served with a warning."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import urllib.request
from pathlib import Path

import h5py
import pytest

from attrgraph.cli import main
from attrgraph.graph.store import save_graph
from attrgraph.viewer.server import warn_if_exposed
from tests.attrgraph.ag_helpers import random_graph
from tests.attrgraph.viewer.viewer_helpers import served

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def graph_file(tmp_path):
    path = tmp_path / "graphs.h5"
    save_graph(random_graph(0), path, "g")
    return path


@contextlib.contextmanager
def serving(*args):
    """`python ARGS`, a command that serves as `attrgraph serve` does, started; yields the process,
    the line it printed first ("serving FILE at URL ...") and the URL. Killed at the end if still
    running."""
    proc = subprocess.Popen(
        [sys.executable, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("serving "), line + proc.stderr.read()
        yield proc, line, line.split(" at ")[1].split()[0]
    finally:
        proc.kill()
        proc.communicate(timeout=10)


def test_serves_the_file_on_loopback_until_stopped(graph_file):
    with serving("-m", "attrgraph.cli", "serve", str(graph_file), "--port", "0") as (_, line, url):
        assert line.startswith(f"serving {graph_file} at http://127.0.0.1:"), line
        page_read = urllib.request.Request(url + "api/graphs", headers={"X-Attrgraph-Page": "1"})
        with urllib.request.urlopen(page_read, timeout=30) as r:
            assert json.load(r)["graphs"] == ["g"]
        with urllib.request.urlopen(url, timeout=30) as r:
            assert b"attrgraph viewer" in r.read()


def one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


def test_a_port_in_use_is_one_line_and_exit_code_2(graph_file, capsys):
    with served(graph_file) as server:
        port = server.server_address[1]
        assert main(["serve", str(graph_file), "--port", str(port)]) == 2
    assert one_error_line(capsys) == (
        f"attrgraph serve: error: port {port} on 127.0.0.1 is in use; pick another with --port "
        "(or --port 0 for a free one)."
    )


def test_nothing_to_view_and_bad_ports_are_one_line_and_exit_code_2(graph_file, tmp_path, capsys):
    empty = tmp_path / "empty.h5"
    with h5py.File(empty, "w") as f:
        f.attrs["format"] = "attrgraph"
    assert main(["serve", str(empty)]) == 2
    assert "holds no graphs or circuits to view" in one_error_line(capsys)
    assert main(["serve", str(tmp_path / "missing.h5")]) == 2
    assert "does not exist" in one_error_line(capsys)
    assert main(["serve", str(graph_file), "--port", "70000"]) == 2
    assert "--port 70000 is not a port" in one_error_line(capsys)
    assert main(["serve", str(graph_file), "--attn-dashboards", str(tmp_path / "nope.h5")]) == 2
    assert "no dashboards file at" in one_error_line(capsys)


def test_another_host_is_served_with_a_warning(capsys):
    warn_if_exposed("127.0.0.1")
    assert capsys.readouterr().err == ""
    warn_if_exposed("0.0.0.0")
    assert "warning: listening on 0.0.0.0, so other machines can read" in one_error_line(capsys)


BUSY_PANEL = """
import sys

import torch

from attrgraph.cli import main
from attrgraph.viewer.server import Viewer


def computing(self, query):  # a model panel that never ends, inside torch's C++ nearly all the time
    print("computing", flush=True)
    x = torch.randn(512, 512)
    while True:
        x = torch.einsum("ij,jk->ik", x, x).tanh()


Viewer.global_connections = computing
sys.exit(main(["serve", sys.argv[1], "--port", "0"]))
"""


def test_ctrl_c_while_a_model_panel_computes_stops_with_one_line(graph_file):
    """Ctrl-C while a request thread is inside torch: one line and exit 0, where the interpreter's
    finalization ended that thread inside torch's C++ and aborted ("terminate called without an
    active exception", exit 134)."""
    with serving("-c", BUSY_PANEL, str(graph_file)) as (proc, _, url):
        ask = urllib.request.Request(url + "api/global?graph=g&node=0", headers={"X-Attrgraph-Page": "1"})
        threading.Thread(target=lambda: _ignore_errors(ask), daemon=True).start()
        assert proc.stdout.readline() == "computing\n"
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert err == "attrgraph serve: stopped; 1 request still computing (a model panel) was dropped.\n"


def _ignore_errors(request) -> None:
    try:
        urllib.request.urlopen(request, timeout=120).read()
    except OSError:  # the server ends without answering
        pass

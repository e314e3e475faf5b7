"""Bad input, round 6 (docs/bad_inputs.md, "Round 6"): `attrgraph circuit` given an option its method
does not read. Before, `--method eap --sparsity 0.5` (or `--steps`, `--keep-frac`, `--aggregation`)
ran and ignored it, so the user believed a setting was in force that was not. Now one line before the
model loads, in the words `build` uses for `--tau` without `--method hierarchical`; an option the
method reads still reaches it, and one not given keeps `discover`'s default."""

import inspect
import re

import numpy as np
import pytest

from attrgraph.circuits.discovery import OPTIONS, discover
from attrgraph.circuits.store import load_circuit
from attrgraph.errors import OptionError
from tests.attrgraph.cli.test_cli import error_line, run

NO_MODEL = ["--model", "/nonexistent/model"]


@pytest.mark.parametrize(
    "args,said",
    [
        (
            ["--method", "eap", "--sparsity", "0.5"],
            "--method eap does not take --sparsity (--sparsity is for --method ep, hap); leave it out or "
            "change --method.",
        ),
        (
            ["--method", "eap-ig", "--steps", "5", "--keep-frac", "0.5"],
            "--method eap-ig does not take --steps, --keep-frac (--steps is for --method ep, hap; "
            "--keep-frac is for --method hap)",
        ),
        (["--method", "ep", "--edges", "5"], "--method ep does not take --edges (--edges is for --method eap, eap-ig, peap)"),
        (["--method", "hap", "--aggregation", "sum"], "--method hap does not take --aggregation (--aggregation is for --method peap)"),
        (["--method", "peap", "--keep-frac", "0.2"], "--method peap does not take --keep-frac"),
    ],
)  # fmt: skip
def test_an_option_the_method_does_not_read_is_refused_before_the_model_loads(tmp_path, capsys, args, said):
    rc, out, err = run(capsys, "circuit", "--task", "ioi", *NO_MODEL, *args, "--out", tmp_path / "c.h5")
    assert rc == 2 and out == ""
    assert said in error_line(err, "circuit")
    assert list(tmp_path.iterdir()) == []


def test_the_options_a_method_reads_reach_it(capsys, tmp_path):
    """`--aggregation maxabs` reaches PEAP (its scores are named by it); PEAP without the flag gets
    discover's default, "avg"; the stored circuit is named by its construction and its scores."""
    out = tmp_path / "c.h5"
    for extra, method in ((["--aggregation", "maxabs"], "peap-maxabs"), ([], "peap-avg")):
        name = method
        args = ["--task", "ioi", "--method", "peap", "--n", "2", "--edges", "3", "--out", out, "--name", name]
        rc, _, err = run(capsys, "circuit", *args, *extra)
        assert rc == 0, err
        assert load_circuit(out, name)[0].method == "greedy:" + method  # greedy construction on those scores


def test_the_help_states_discovers_defaults():
    """The flags are absent unless given, so their help says the default; it must be discover's."""
    import argparse

    from attrgraph.cli.circuit import METHOD_OPTIONS, add_parser

    sub = argparse.ArgumentParser().add_subparsers()
    add_parser(sub)
    helps = {a.dest: a.help for a in sub.choices["circuit"]._actions}
    defaults = inspect.signature(discover).parameters
    for name in ("edges", "sparsity", "steps", "keep_frac", "aggregation"):
        assert helps[name].endswith(f"(default {defaults[name].default})") or helps[name].endswith(
            f"; default {defaults[name].default})"
        ), helps[name]
    assert set().union(*OPTIONS.values()) == set(METHOD_OPTIONS)  # every method option is checked


def test_export_refuses_an_empty_slug(tmp_path, capsys):
    """Before: `--slug ""` (an unset shell variable) silently fell back to the graph's name."""
    from attrgraph.graph.store import save_graph
    from tests.attrgraph.ag_helpers import random_graph

    save_graph(random_graph(0), tmp_path / "g.h5")
    rc, out, err = run(capsys, "export", tmp_path / "g.h5", "-o", tmp_path / "site", "--slug", "")
    assert rc == 2 and out == ""
    assert "slug '' is not a plain name; use letters, digits" in error_line(err, "export")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.h5"]


@pytest.mark.parametrize("host", ["", "  "])
def test_serve_refuses_an_empty_host(tmp_path, capsys, host):
    """Before: `--host ""` bound every interface (the empty address) while the warning read
    "listening on ," and the URL printed said 127.0.0.1."""
    from attrgraph.graph.store import save_graph
    from tests.attrgraph.ag_helpers import random_graph

    save_graph(random_graph(0), tmp_path / "g.h5")
    rc, out, err = run(capsys, "serve", tmp_path / "g.h5", "--host", host, "--port", "0")
    assert rc == 2 and out == ""
    assert "--host is empty; pass an address to listen on: 127.0.0.1" in error_line(err, "serve")


def test_a_dashboards_file_is_not_turned_into_a_graph_file(tmp_path, capsys):
    """Before: `build -o dashboards.h5` (and `circuit --out`, `save_graph`) added /graphs to a
    dashboards file and relabelled its root `format` "attrgraph": load_dashboards then refused it.
    Now one line before the work, the file byte for byte as it was; an HDF5 file without a format
    (a user's own) still takes graphs beside its data."""
    import h5py

    from attrgraph.errors import GraphFileError
    from attrgraph.graph.store import list_graphs, save_graph
    from tests.attrgraph.ag_helpers import random_graph

    boards = tmp_path / "dashboards.h5"
    with h5py.File(boards, "w") as f:
        f.attrs["format"] = "attrgraph-dashboards"
        f.create_dataset("stats/max", data=np.ones(3))
    before = boards.read_bytes()
    said = f"{boards} is not a graph file (its format is 'attrgraph-dashboards'), so no graph can be added"
    with pytest.raises(GraphFileError, match=re.escape(said)):
        save_graph(random_graph(0), boards)
    rc, out, err = run(capsys, "circuit", "--task", "ioi", *NO_MODEL, "--out", boards)
    assert rc == 2 and "so no circuit can be added to it without relabelling it" in error_line(err, "circuit")
    assert boards.read_bytes() == before
    own = tmp_path / "own.h5"
    with h5py.File(own, "w") as f:
        f.create_dataset("mine", data=np.arange(4))
    save_graph(random_graph(0), own)
    assert list_graphs(own) == ["graph"]


@pytest.mark.parametrize(
    "content,said",
    [
        (b"", "holds no prompts; write one {'prompt': ...} per line."),
        (b"\n  \n", "holds no prompts"),
        (b"When Mary and John went\nThe cat sat\n", "is not JSONL: line 1 is not JSON (Expecting value); write one JSON"),
        (b"\xff\xfe bad\n", "is not JSONL: line 1 is not UTF-8 text (invalid start byte at byte 0); write one"),
    ],
)  # fmt: skip
def test_build_many_prompts_files_that_hold_no_prompts(tmp_path, capsys, content, said):
    """Before: an empty file "built 0" with exit 0; a plain-text file one failure per line in a
    sidecar, exit 1; a byte that is not UTF-8 a `UnicodeDecodeError` traceback. Now one line, exit
    2, before Ray starts, nothing written."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_bytes(content)
    rc, out, err = run(capsys, "build-many", prompts, "-o", tmp_path / "g.h5", *NO_MODEL, "--no-progress")
    assert rc == 2 and out == ""
    assert f"prompts file '{prompts}' {said}" in error_line(err, "build-many")
    assert [p.name for p in tmp_path.iterdir()] == ["prompts.jsonl"]


def test_a_line_that_is_not_utf8_is_one_failure_among_good_lines(tmp_path):
    from attrgraph.cli.build_many import read_prompts

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_bytes(b'{"prompt": "When Mary and John went"}\n\xff bad\n{"prompt": "The cat"}\n')
    items, failures = read_prompts(prompts)
    assert [i["line"] for i in items] == [1, 3]
    assert failures == [
        {"line": 2, "name": "prompt_2", "error": "line is not UTF-8 text (invalid start byte at byte 0); save the file as UTF-8."}
    ]  # fmt: skip
    with pytest.raises(OptionError, match=r"^prompts file '.*' is a folder; pass a JSONL file"):
        read_prompts(tmp_path)

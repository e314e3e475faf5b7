"""`attrgraph build-many`: many graphs on a local Ray cluster (one, shared by the module), resumed,
surviving a killed worker, recording the prompts that fail."""

import argparse
import json
import os
import signal
import subprocess
import sys

import h5py
import numpy as np
import pytest

from attrgraph.bundled import tasks
from attrgraph.cli import build, build_many, main
from attrgraph.cli.build_key import KEY_OPTIONS, SOURCE_OPTIONS, SPEED_OPTIONS
from attrgraph.cli.build_many import LOOPBACK_ENV
from attrgraph.errors import OptionError, OutputBusyError, ResumeError
from attrgraph.graph.store import list_graphs, load_graph

os.environ.setdefault(LOOPBACK_ENV, "0")  # before Ray is imported: the test cluster stays on 127.0.0.1
ray = pytest.importorskip("ray", reason="Ray is in the 'distributed' extra, which the 'test' extra includes")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PROMPT = "When Mary and John went to the store , John gave a drink to"


@pytest.fixture(scope="module")
def cluster():
    """One local Ray cluster for the module: two CPUs, no dashboard, on 127.0.0.1."""
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", logging_level="WARNING")
    assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"}
    yield
    ray.shutdown()


@pytest.fixture
def deadline():
    """Fail a test that runs past 900 s instead of hanging the suite (Ray's waits check signals): a
    guard against a hang only, far above the test's time on a busy machine."""

    def expire(signum, frame):
        raise TimeoutError("build-many test ran past its 900 s deadline")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(900)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


def options(model_dir, **over) -> dict:
    base = dict(
        model=str(model_dir),
        transcoders=str(model_dir / "tc"),
        node_threshold=0.8,
        edge_threshold=0.98,
        max_logits=3,
        logit_prob=None,
        batch_size=64,
        method="standard",
        tau=None,
        max_feature_nodes=None,
        threads=1,
        full=False,
        strict=False,
        truncate=False,
    )
    return {**base, **over}


def write_jsonl(path, rows) -> None:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))


def prompts(n: int, seed: int = 0) -> list[dict]:
    return [{"prompt": ex.prompt, "name": f"ioi_{i}"} for i, ex in enumerate(tasks.generate("ioi", n, seed))]


def test_build_many_options_are_builds():
    """Every option of `attrgraph build` that applies per prompt is taken by build-many too."""

    def dests(module, command):
        sub = argparse.ArgumentParser().add_subparsers()
        module.add_parser(sub)
        return {a.dest for a in sub.choices[command]._actions}

    per_prompt = {"help", "prompt", "output", "name", "json", "no_progress"}
    assert dests(build, "build") - per_prompt == set(build_many.BUILD_OPTIONS)
    assert set(build_many.BUILD_OPTIONS) <= dests(build_many, "build-many")


def test_read_prompts_records_bad_lines(tmp_path):
    f = tmp_path / "p.jsonl"
    write_jsonl(
        f,
        [
            {"prompt": "a b", "name": "x"},
            "{not json",
            "",
            {"name": "no prompt"},
            ["a list"],
            {"prompt": "a", "name": "x"},
            {"prompt": "a", "colour": "red"},
            {"prompt": "a", "target": [" Mary"]},
            {"prompt": "a", "name": "a/b"},
            {"prompt": "c", "target": [" Mary", " John"]},
            {"prompt": "a", "name": "."},  # HDF5 reads '.' as the group that holds it
        ],
    )
    items, failures = build_many.read_prompts(f)
    assert [(it["line"], it["name"], it["target"]) for it in items] == [
        (1, "x", None),
        (10, "prompt_10", [" Mary", " John"]),
    ]
    assert [r["line"] for r in failures] == [2, 4, 5, 6, 7, 8, 9, 11]
    assert all("pass a plain name" in failures[i]["error"] for i in (6, 7))
    assert "not JSON" in failures[0]["error"] and '"prompt"' in failures[1]["error"]
    assert "earlier line" in failures[3]["error"] and "colour" in failures[4]["error"]
    with pytest.raises(OptionError, match="does not exist"):
        build_many.read_prompts(tmp_path / "missing.jsonl")


def test_build_many_of_bad_lines_only_records_them(tmp_path):
    """No prompt to build: no worker starts; the failures land beside an output in a new folder."""
    f, out = tmp_path / "p.jsonl", tmp_path / "new" / "g.h5"
    write_jsonl(f, ["[1, 2]", {"name": "x"}])
    counts = build_many.build_many(f, out, {}, workers=2, progress=False)
    assert (counts["built"], counts["failed"]) == (0, 2) and not out.exists()
    lines = build_many.failures_path(out).read_text().splitlines()
    assert [json.loads(line)["line"] for line in lines] == [1, 2]


@pytest.mark.parametrize("pages", [0, 2], ids=["no-room", "two-pages"])
def test_a_full_disk_while_the_failures_sidecar_is_written_is_one_line(small_tmpfs, pages):
    """Bad input round 7: the sidecar on a full disk is one `GraphFileError` naming it (before: an
    `OSError: [Errno 28]` traceback from the run's lock), and what it holds is whole records: none
    (no file), or those written before the disk filled (two tmpfs pages: the lock's pid and a page of
    records), never half a line.
    Bad lines only, so no worker starts."""
    from attrgraph.errors import GraphFileError

    f, out = small_tmpfs / "p.jsonl", small_tmpfs / "g.h5"
    write_jsonl(f, [{"name": "x" * 200}] * 40)
    st = os.statvfs(small_tmpfs)
    (small_tmpfs / "filler").write_bytes(b"\0" * ((st.f_bavail - pages) * st.f_frsize))
    with pytest.raises(GraphFileError, match=r"^cannot write .*g\.h5\.failures\.jsonl.*no space left") as e:
        build_many.build_many(f, out, {}, workers=1, progress=False)
    assert "\n" not in str(e.value) and not out.exists()
    side = build_many.failures_path(out)
    if pages == 0:
        assert not side.exists()  # not an empty sidecar
    else:
        *lines, last = side.read_text().split("\n")
        assert last == "" and [json.loads(line)["line"] for line in lines] == list(range(1, len(lines) + 1))
        assert 0 < side.stat().st_size <= st.f_frsize


def test_build_many_targets_failures_and_same_graphs_as_build(cluster, deadline, model_dir, tmp_path, capsys):
    rows = prompts(3) + [
        {"prompt": PROMPT, "name": "mary", "target": " Mary"},
        {"prompt": PROMPT, "name": "mary_john", "target": [" Mary", " John"]},
        {"prompt": "   ", "name": "empty"},
        {"prompt": PROMPT, "name": "unknown", "target": " Mary John"},
        "not json",
        {"prompt": PROMPT},
    ]
    f, out = tmp_path / "p.jsonl", tmp_path / "g.h5"
    write_jsonl(f, rows)
    o = options(model_dir)
    args = ["build-many", str(f), "-o", str(out), "--workers", "2", "--json", "--full"]
    args += [
        "--model",
        o["model"],
        "--transcoders",
        o["transcoders"],
        "--max-logits",
        "3",
        "--batch-size",
        "64",
    ]
    assert main(args) == 1  # some prompts failed: exit 1, the rest built
    counts = json.loads(capsys.readouterr().out)
    assert (counts["built"], counts["skipped"], counts["failed"]) == (6, 0, 3)
    names = ["ioi_0", "ioi_1", "ioi_2", "mary", "mary_john", "prompt_9"]
    assert sorted(list_graphs(out)) == sorted(names + [n + "_full" for n in names])
    failures = [json.loads(line) for line in build_many.failures_path(out).read_text().splitlines()]
    assert sorted((r["line"], r["name"]) for r in failures) == [(6, "empty"), (7, "unknown"), (8, "prompt_8")]
    by_name = {r["name"]: r["error"] for r in failures}
    assert by_name["empty"].startswith("PromptError") and by_name["unknown"].startswith("TargetError")
    assert list(load_graph(out, "mary").logit_strings) == ["Mary"]
    assert list(load_graph(out, "mary_john").logit_strings) == ["Mary - John"]
    # the same graph as `attrgraph build` with the same options
    single = tmp_path / "single.h5"
    build_args = ["build", rows[1]["prompt"], "-o", str(single), "--model", o["model"]]
    build_args += ["--transcoders", o["transcoders"], "--max-logits", "3", "--batch-size", "64", "--json"]
    assert main(build_args) == 0
    a, b = load_graph(out, "ioi_1"), load_graph(single)
    assert list(a.prompt_tokens) == list(b.prompt_tokens) and np.array_equal(a.nodes.feature, b.nodes.feature)
    assert np.allclose(a.adjacency.toarray(), b.adjacency.toarray(), atol=1e-6)


@pytest.mark.slow  # ~12 s
def test_build_many_resumes(cluster, deadline, model_dir, tmp_path):
    """Graphs already in the file (here: written in-process, as an interrupted run leaves them) are skipped."""
    from attrgraph.bundled.loading import load_model
    from attrgraph.graph.store import save_graph
    from transcoders.formats import load_transcoders

    rows, f, out = prompts(5, seed=1), tmp_path / "p.jsonl", tmp_path / "g.h5"
    o = options(model_dir)
    model, tc = load_model(o["model"]), load_transcoders(o["transcoders"])
    for line, row in enumerate(rows[:3], start=1):
        for name, graph in build_many.build_graphs(model, tc, {**row, "line": line}, o).items():
            save_graph(graph, out, name)
    with h5py.File(out) as h:
        created = {n: h[f"graphs/{n}"].attrs["created"] for n in list_graphs(out)}
    write_jsonl(f, rows)
    seen = []
    counts = build_many.build_many(f, out, o, workers=2, progress=False, on_result=seen.append)
    assert (counts["built"], counts["skipped"], counts["failed"]) == (2, 3, 0)
    assert sorted(r["name"] for r in seen) == ["ioi_3", "ioi_4"]
    assert sorted(list_graphs(out)) == [f"ioi_{i}" for i in range(5)]
    with h5py.File(out) as h:
        assert all(h[f"graphs/{n}"].attrs["created"] == c for n, c in created.items())
    assert not build_many.failures_path(out).exists()  # nothing failed: no sidecar
    # all done: a rerun starts no worker and builds nothing
    assert build_many.build_many(f, out, o, workers=2, progress=False)["built"] == 0


@pytest.mark.slow  # ~11 s
def test_build_many_survives_a_killed_worker(cluster, deadline, model_dir, tmp_path):
    """SIGKILL the worker that returned the first result while it builds its next prompt: Ray restarts
    it, the prompt is retried, and every graph is in the file once, under its own name."""
    rows, f, out = prompts(8, seed=2), tmp_path / "p.jsonl", tmp_path / "g.h5"
    write_jsonl(f, rows)
    killed, pids = [], []

    def kill_first(result):
        pids.append(result["pid"])
        if not killed:
            killed.append(result["pid"])
            os.kill(result["pid"], signal.SIGKILL)

    counts = build_many.build_many(
        f, out, options(model_dir), workers=2, progress=False, on_result=kill_first
    )
    assert (counts["built"], counts["skipped"], counts["failed"]) == (8, 0, 0)
    assert len(set(pids)) == 3  # two workers, one of them restarted in a new process
    # the killed process may still report the prompt it finished before the signal landed, but
    # nothing once its restarted successor (the third process) has reported
    seen = list(dict.fromkeys(pids))
    assert killed[0] not in pids[pids.index(seen[2]) :]
    names = list_graphs(out)
    assert sorted(names) == sorted(r["name"] for r in rows) and len(names) == len(set(names))
    for r in rows:
        tokens = "".join(load_graph(out, r["name"]).prompt_tokens).removeprefix("<bos>")
        assert tokens.replace(" ", "") == r["prompt"].replace(" ", "")


def test_build_many_user_errors(tmp_path, capsys):
    f = tmp_path / "p.jsonl"
    write_jsonl(f, [{"prompt": PROMPT}])
    out = tmp_path / "g.h5"
    assert main(["build-many", str(f), "-o", str(out), "--workers", "0"]) == 2
    err = capsys.readouterr().err
    assert "--workers is 0" in err and len(err.strip().splitlines()) == 1
    # no cluster at the address: a real command (Ray's failed connection stays out of this process)
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "attrgraph.cli",
            "build-many",
            str(f),
            "-o",
            str(out),
            "--address",
            "127.0.0.1:9",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert p.returncode == 2, p.stderr
    assert "no Ray cluster answers at '127.0.0.1:9'" in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    assert not out.exists() and sorted(x.name for x in tmp_path.iterdir()) == ["p.jsonl"]


def test_a_worker_builds_graphs_with_attention_saes(model_dir, tmp_path):
    """`--attn-transcoders` reaches build-many's workers through the shared build options."""
    import torch

    from attrgraph.bundled.loading import load_model
    from tests.attrgraph.ag_helpers import tiny_attn_saes
    from transcoders.formats import save_transcoders

    save_transcoders(tiny_attn_saes(load_model(model_dir)).to(torch.float32), tmp_path / "attn")
    worker = build_many.GraphWorker(options(model_dir, attn_transcoders=str(tmp_path / "attn")))
    assert worker.ready() is None
    got = worker.build({**prompts(1)[0], "line": 1})
    graph = got["graphs"]["ioi_0"]
    assert graph.nodes.mask("feature", "attn").sum() > 0
    assert graph.meta["attn_transcoders"] == str(tmp_path / "attn")


def test_every_build_option_is_keyed_or_named_as_not_changing_the_graph():
    """A new build option must be classified: recorded in the resume key, or identified by a
    fingerprint, or one that changes only speed."""
    parts = (KEY_OPTIONS, SOURCE_OPTIONS, SPEED_OPTIONS)
    assert sorted(sum(parts, ())) == sorted(build_many.BUILD_OPTIONS)
    assert len(set(sum(parts, ()))) == sum(map(len, parts))


def test_read_prompts_refuses_bool_targets_and_full_name_collisions(tmp_path):
    f = tmp_path / "p.jsonl"
    rows = [
        {"prompt": "a", "name": "x"},
        {"prompt": "b", "name": "x_full"},
        {"prompt": "c", "name": "y_full"},
        {"prompt": "d", "name": "y"},
        {"prompt": "e", "target": True},
        {"prompt": "f", "target": [" Mary", False]},
        {"prompt": "g", "target": 7},
    ]
    write_jsonl(f, rows)
    items, failures = build_many.read_prompts(f)  # without --full the names do not meet
    assert [it["line"] for it in items] == [1, 2, 3, 4, 7] and [r["line"] for r in failures] == [5, 6]
    assert all("neither one token nor two" in r["error"] for r in failures)
    items, failures = build_many.read_prompts(f, full=True)
    assert [it["name"] for it in items] == ["x", "y_full", "prompt_7"]
    by_line = {r["line"]: r["error"] for r in failures}
    assert "'x_full' is where --full stores the unpruned graph of 'x' (line 1)" in by_line[2]
    assert "unpruned graph of 'y' would overwrite y_full (line 3)" in by_line[4]


@pytest.mark.slow  # ~35 s: six runs, each starting a worker
def test_build_many_resume_keys_on_what_was_built(cluster, deadline, model_dir, tmp_path):
    """A graph under a known name is skipped only when built the same way; another option, another
    prompt under that name or another transcoder set is refused in one line, or rebuilt with
    overwrite. A refused run changes nothing in the file."""
    import torch

    from transcoders.formats import load_transcoders, save_transcoders

    f, out = tmp_path / "p.jsonl", tmp_path / "g.h5"
    rows = [{"prompt": r["prompt"]} for r in prompts(3, seed=3)]  # names prompt_1 .. prompt_3
    write_jsonl(f, rows)
    o = options(model_dir)
    assert build_many.build_many(f, out, o, workers=1, progress=False)["built"] == 3

    def created():
        with h5py.File(out) as h:
            return {n: h[f"graphs/{n}"].attrs["created"] for n in list_graphs(out)}

    before = created()
    # the same run again: every record equals the stored one (fingerprints as the graphs record them)
    counts = build_many.build_many(f, out, o, workers=1, progress=False)
    assert (counts["built"], counts["skipped"]) == (0, 3)
    # another threshold: refused, naming the option and both values
    with pytest.raises(
        ResumeError, match=r"3 graph\(s\) .*\(prompt_1: node_threshold 0.8 -> 0.5.*--overwrite"
    ):
        build_many.build_many(f, out, options(model_dir, node_threshold=0.5), workers=1, progress=False)
    # one line inserted at the top: every unnamed prompt now names another prompt's graph
    write_jsonl(f, [{"prompt": prompts(1, seed=9)[0]["prompt"]}] + rows)
    with pytest.raises(ResumeError, match=r"prompt_1: prompt; prompt_2: prompt; and 1 more"):
        build_many.build_many(f, out, o, workers=1, progress=False)
    # other transcoders in another folder: their fingerprint differs
    tc = load_transcoders(o["transcoders"])
    with torch.no_grad():
        next(tc.parameters()).add_(0.01)
    save_transcoders(tc, tmp_path / "tc2")
    write_jsonl(f, rows)
    with pytest.raises(ResumeError, match="prompt_1: transcoder_fingerprint"):
        build_many.build_many(f, out, {**o, "transcoders": str(tmp_path / "tc2")}, workers=1, progress=False)
    assert created() == before  # nothing was rebuilt or replaced
    # overwrite: the graphs built differently are rebuilt with this run's options
    counts = build_many.build_many(
        f, out, options(model_dir, node_threshold=0.5), workers=1, progress=False, overwrite=True
    )
    assert (counts["built"], counts["skipped"], counts["failed"]) == (3, 0, 0)
    assert all(
        load_graph(out, f"prompt_{i}").meta["build"]["options"]["node_threshold"] == 0.5 for i in (1, 2, 3)
    )


@pytest.mark.slow  # ~11 s
def test_build_many_one_run_per_output_and_no_empty_sidecar(cluster, deadline, model_dir, tmp_path):
    """While a run writes an output, a second run on it is refused (naming the first's pid) and the
    first ends normally; the last run's sidecar is gone when it starts, and while nothing has failed
    there is no sidecar on disk (which is what a killed driver leaves). An unknown target word is a
    recorded TargetError, not a graph of <unk>."""
    f, out = tmp_path / "p.jsonl", tmp_path / "g.h5"
    side = build_many.failures_path(out)
    side.write_text('{"line": 9, "name": "old", "error": "from an earlier run"}\n')
    write_jsonl(f, prompts(3, seed=4))
    o = options(model_dir)
    seen = []

    def second_run(result):
        seen.append(side.exists())
        if len(seen) == 1:
            with pytest.raises(
                OutputBusyError, match=rf"another build-many run \(pid {os.getpid()}\) is writing"
            ):
                build_many.build_many(f, out, o, workers=1, progress=False)

    counts = build_many.build_many(f, out, o, workers=1, progress=False, on_result=second_run)
    assert (counts["built"], counts["failed"]) == (3, 0) and seen == [False] * 3
    assert not side.exists()
    # the lock was released: the next run on the output goes on, and records an unknown target word
    write_jsonl(f, [{"prompt": PROMPT, "name": "unk", "target": " zxqv"}])
    assert build_many.build_many(f, out, o, workers=1, progress=False)["failed"] == 1
    [record] = [json.loads(line) for line in side.read_text().splitlines()]
    assert record["error"].startswith("TargetError: target word ' zxqv' is not in this model's vocabulary")
    assert "unk" not in list_graphs(out)


@pytest.mark.slow  # ~21 s
def test_build_many_resume_keys_on_the_target_and_reads_defaults_as_their_values(
    cluster, deadline, model_dir, tmp_path
):
    """A graph built for another target is refused (or rebuilt with overwrite), never kept; the
    documented defaults passed explicitly (`--max-logits 10`, `--logit-prob 0.95`, the CLI's help)
    key the same graphs as leaving them out."""
    f, out = tmp_path / "p.jsonl", tmp_path / "g.h5"
    rows = [{"prompt": PROMPT, "name": "mary", "target": " Mary"}, {"prompt": PROMPT, "name": "top"}]
    write_jsonl(f, rows)
    o = options(model_dir, max_logits=None)
    assert build_many.build_many(f, out, o, workers=1, progress=False)["built"] == 2
    explicit = {**o, "max_logits": 10, "logit_prob": 0.95}
    counts = build_many.build_many(f, out, explicit, workers=1, progress=False)
    assert (counts["built"], counts["skipped"]) == (0, 2)
    write_jsonl(f, [{**rows[0], "target": " John"}, rows[1]])
    with pytest.raises(ResumeError, match=r"1 graph\(s\) .*\(mary: target\)"):
        build_many.build_many(f, out, o, workers=1, progress=False)
    assert list(load_graph(out, "mary").logit_strings) == ["Mary"]
    counts = build_many.build_many(f, out, o, workers=1, progress=False, overwrite=True)
    assert (counts["built"], counts["skipped"]) == (1, 1)
    assert list(load_graph(out, "mary").logit_strings) == ["John"]


def test_records_written_before_defaults_were_recorded_still_match():
    """A record from an older build-many holds None for an option left out; a run passing the
    documented default (or the adaptive method that --max-feature-nodes alone means) matches it."""
    from attrgraph.cli.build_key import differences

    def record(**over):
        opts = dict.fromkeys(KEY_OPTIONS) | dict(node_threshold=0.8, edge_threshold=0.98, method="standard")
        return {"prompt_ids": [0, 5], "target": None, "options": opts | over}

    assert differences(record(), record(max_logits=10, logit_prob=0.95)) == []
    assert differences(record(max_feature_nodes=50), record(max_feature_nodes=50, method="adaptive")) == []
    assert differences(record(), record(max_logits=9)) == ["max_logits 10 -> 9"]

"""`attrgraph export FILE[:NAME] --format neuronpedia -o DIR` on a real attribution graph of a tiny
model: the folder, the graphs it picks, supernodes from the file, pruning, and bad input."""

import json

import h5py
import numpy as np
import pytest
import torch

from attrgraph.cli import main
from attrgraph.graph.neuronpedia import load_json
from attrgraph.graph.prune import prune_graph
from attrgraph.graph.store import load_graph, save_graph
from attrgraph.graph.supernode_store import save_supernodes
from attrgraph.graph.supernodes import supernode
from tests.attrgraph.ag_helpers import tiny_model, tiny_transcoders
from tests.attrgraph.peer_frontend import CHECK, run_peer

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def graph_file(tmp_path_factory):
    """`graph` (pruned, with a supernode) and `graph_full` of a CLT on a tiny GPT-2, as `build --full` writes."""
    from attrgraph.engine.attribute import attribute

    torch.set_num_threads(1)
    model = tiny_model("gpt2", dtype=torch.float32)
    full = attribute(
        model, tiny_transcoders(model, "clt"), torch.tensor([0, 5, 9, 3, 17, 22, 5, 9]), progress=False
    )
    full.meta.update(model="tiny", transcoders="tiny-clt")
    pruned = prune_graph(full, 0.8, 0.98)
    path = tmp_path_factory.mktemp("export") / "g.h5"
    save_graph(pruned, path, "graph")
    save_graph(full, path, "graph_full")
    feats = np.flatnonzero(pruned.nodes.kind == "feature")[:2]
    save_supernodes(path, [supernode(pruned, "first two", feats)], "graph")
    return path


def export(*args) -> int:
    return main(["export", *map(str, args)])


def test_export_one_graph(graph_file, tmp_path, capsys):
    out = tmp_path / "site"
    assert export(f"{graph_file}:graph", "--format", "neuronpedia", "-o", out) == 0
    printed = capsys.readouterr().out
    data = json.loads((out / "graph.json").read_text())
    assert f"wrote {out / 'graph.json'}: {len(data['nodes'])} nodes, {len(data['links'])} links" in printed
    assert sorted(p.name for p in out.iterdir()) == ["features", "graph-metadata.json", "graph.json"]
    assert [g["slug"] for g in json.loads((out / "graph-metadata.json").read_text())["graphs"]] == ["graph"]
    assert data["qParams"]["supernodes"][0][0] == "first two" and len(data["qParams"]["supernodes"][0]) == 3
    assert data["metadata"]["scan"] == "./data/features/tiny-clt"
    assert data["metadata"]["pruning_settings"] == {
        "node_threshold": 0.8,
        "edge_threshold": 0.98,
        "prune_rule": "circuit-tracer",
        "influence": "unpruned graph",
    }
    assert data["metadata"]["node_threshold"] == 0.8  # the frontend's slider
    stored = load_graph(graph_file, "graph")
    back = load_json(out / "graph.json")
    assert (back.adjacency != stored.adjacency).nnz == 0
    np.testing.assert_array_equal(back.nodes.feature, stored.nodes.feature)
    assert back.prompt_tokens == stored.prompt_tokens


def test_circuit_tracer_reads_what_the_command_writes(graph_file, tmp_path):
    out = tmp_path / "site"
    assert export(f"{graph_file}:graph_full", "-o", out, "--node-threshold", "0.9") == 0
    assert export(f"{graph_file}:graph", "-o", out) == 0
    report = run_peer(CHECK, out)
    assert [g["slug"] for g in report["graphs"]] == ["graph_full", "graph"]
    assert report["feature_files"] > 0


def test_every_graph_without_a_name_and_pruning_on_export(graph_file, tmp_path, capsys):
    out = tmp_path / "site"
    assert export(graph_file, "-o", out, "--node-threshold", "0.8", "--edge-threshold", "0.98") == 0
    assert capsys.readouterr().out.count("wrote ") == 2
    index = json.loads((out / "graph-metadata.json").read_text())
    assert [(g["slug"], g["node_threshold"]) for g in index["graphs"]] == [
        ("graph", 0.8),
        ("graph_full", 0.8),
    ]
    full = load_graph(graph_file, "graph_full")
    exported = json.loads((out / "graph_full.json").read_text())
    assert len(exported["nodes"]) == prune_graph(full, 0.8, 0.98).n_nodes < full.n_nodes


def test_slug_and_scan(graph_file, tmp_path):
    out = tmp_path / "site"
    assert export(f"{graph_file}:graph_full", "-o", out, "--slug", "ioi-1", "--scan", "tiny-model") == 0
    data = json.loads((out / "ioi-1.json").read_text())
    assert data["metadata"]["scan"] == "tiny-model"
    assert (out / "features" / "tiny-model").is_dir()


@pytest.mark.parametrize(
    "case, match",
    [
        ("no graphs", "holds no graphs; write one with `attrgraph build` first."),
        ("wrong name", "has no graph named 'nope'; it holds ['graph', 'graph_full']."),
        ("output is a file", "is a file; pass a folder to write into"),
        ("slug for two", "--slug names one graph but"),
        ("missing file", "does not exist or is not a file"),
        ("prune the pruned", ":graph: this graph is already pruned (circuit-tracer rule, node threshold 0.8"),
        ("rule without thresholds", "needs a node or edge threshold: this graph is unpruned"),
    ],
)
def test_bad_input_is_one_line_and_exit_code_2(graph_file, tmp_path, capsys, case, match):
    out, spec, extra = tmp_path / "site", str(graph_file), []
    if case == "no graphs":
        spec = str(tmp_path / "empty.h5")
        h5py.File(spec, "w").close()
    elif case == "wrong name":
        spec += ":nope"
    elif case == "output is a file":
        out = tmp_path / "a_file"
        out.write_text("x")
    elif case == "slug for two":
        extra = ["--slug", "x"]
    elif case == "prune the pruned":  # checked for every graph before graph_full is written
        extra = ["--node-threshold", "0.9", "--edge-threshold", "0.98"]
    elif case == "rule without thresholds":
        spec += ":graph_full"
        extra = ["--prune-rule", "appendix"]
    else:
        spec = str(tmp_path / "nothing.h5")
    assert export(spec, "-o", out, *extra) == 2
    err = capsys.readouterr().err
    assert err.startswith("attrgraph export: error: ") and match in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "site").exists()


# ------------------------------------------------------------------------- dashboards
@pytest.fixture(scope="module")
def dashboards_file(tmp_path_factory):
    """Dashboards of graph_file's tiny CLT over random sequences (ids as token strings)."""
    from transcoders import DashboardConfig, compute_dashboards

    torch.set_num_threads(1)
    model = tiny_model("gpt2", dtype=torch.float32)
    tc = tiny_transcoders(model, "clt")
    seqs = torch.randint(0, model.cfg.d_vocab, (24, 16), generator=torch.Generator().manual_seed(0))
    cfg = DashboardConfig(transcoders="tiny-clt", progress=False, n_tokens=10**6, n_top=3, reservoir=6)
    return compute_dashboards(
        cfg, model=model, tc=tc, sequences=seqs, out=tmp_path_factory.mktemp("d") / "d.h5"
    )


def test_dashboards_option_fills_the_feature_files(graph_file, dashboards_file, tmp_path, capsys):
    out = tmp_path / "site"
    assert export(f"{graph_file}:graph", "-o", out, "--dashboards", dashboards_file) == 0
    captured = capsys.readouterr()
    assert f"feature files (examples from {dashboards_file})" in captured.out and captured.err == ""
    files = list((out / "features" / "tiny-clt").iterdir())
    assert files
    for f in files:
        feat = json.loads(f.read_text())
        assert feat["examples_quantiles"][0]["quantile_name"] == "Top activations"
        assert feat["examples_quantiles"][0]["examples"] and len(feat["top_logits"]) == 4
    report = run_peer(CHECK, out)
    assert report["feature_files"] > 0


def test_without_dashboards_one_warning_line(graph_file, tmp_path, capsys):
    assert export(f"{graph_file}:graph", "-o", tmp_path / "site") == 0
    captured = capsys.readouterr()
    assert "feature files (no examples)" in captured.out
    assert captured.err.startswith("attrgraph export: warning: no dashboards for transcoder set 'tiny-clt'")
    assert captured.err.count("\n") == 1 and "feature files have no examples" in captured.err


def test_bad_dashboards_path_is_one_line(graph_file, tmp_path, capsys):
    assert export(graph_file, "-o", tmp_path / "site", "--dashboards", tmp_path / "nope.h5") == 2
    err = capsys.readouterr().err
    assert err.startswith("attrgraph export: error: ") and "nope.h5 does not exist" in err
    assert err.count("\n") == 1 and not (tmp_path / "site").exists()
    assert export(graph_file, "-o", tmp_path / "site", "--attn-dashboards", tmp_path / "nope.h5") == 2
    err = capsys.readouterr().err
    assert "nope.h5 does not exist" in err and err.count("\n") == 1 and not (tmp_path / "site").exists()


def strip_time(data: dict) -> dict:
    data["metadata"]["info"].pop("create_time_ms")
    return data


@pytest.mark.parametrize("rule", ["circuit-tracer", "appendix"])
def test_stored_pruned_graph_exports_as_its_unpruned_graph_with_thresholds(tmp_path, rule):
    """What `build` stores, exported with no options, is the file of its unpruned graph exported with
    the thresholds and rule it was pruned with: the same nodes, links, influence and slider (the
    whole file, but for the creation time and the `pruned` flag in generation_settings)."""
    path = tmp_path / "g.h5"
    assert main(["build", "When Mary and John went to the store", "-o", str(path), "--full", "--json",
                 "--prune-rule", rule]) == 0  # fmt: skip
    stored = load_graph(path, "graph")
    assert stored.meta["prune_rule"] == rule and not np.isnan(stored.nodes.unpruned_share).any()
    assert export(f"{path}:graph", "-o", tmp_path / "a", "--slug", "s") == 0
    args = ["--node-threshold", "0.8", "--edge-threshold", "0.98", "--prune-rule", rule]
    assert export(f"{path}:graph_full", "-o", tmp_path / "b", "--slug", "s", *args) == 0
    a, b = (strip_time(json.loads((tmp_path / d / "s.json").read_text())) for d in "ab")
    assert a["metadata"]["node_threshold"] == 0.8 and a["metadata"]["pruning_settings"]["prune_rule"] == rule
    assert a["nodes"] == b["nodes"] and a["links"] == b["links"] and a["metadata"] == b["metadata"]
    # `build` without --full streams the rows into pruning (engine/pruned_build.py): the same file
    streamed = tmp_path / "streamed.h5"
    assert main(["build", "When Mary and John went to the store", "-o", str(streamed), "--json",
                 "--prune-rule", rule]) == 0  # fmt: skip
    assert export(f"{streamed}:graph", "-o", tmp_path / "e", "--slug", "s") == 0
    e = json.loads((tmp_path / "e" / "s.json").read_text())
    assert [n["node_id"] for n in e["nodes"]] == [n["node_id"] for n in a["nodes"]]
    assert [(x["source"], x["target"]) for x in e["links"]] == [
        (x["source"], x["target"]) for x in a["links"]
    ]
    for x, y in zip(e["nodes"] + e["links"], a["nodes"] + a["links"]):
        key = "weight" if "weight" in x else "influence"
        assert x[key] == pytest.approx(y[key], rel=1e-5, abs=1e-7)
    assert e["metadata"]["node_threshold"] == 0.8
    # the same options as stored change nothing (never pruned twice); the JSON read back is that graph
    assert export(f"{path}:graph", "-o", tmp_path / "c", "--slug", "s", *args) == 0
    assert strip_time(json.loads((tmp_path / "c" / "s.json").read_text())) == a
    from attrgraph.graph.neuronpedia import export_json

    back = load_json(tmp_path / "a" / "s.json")
    d = strip_time(json.loads(export_json(back, tmp_path / "d", slug="s").path.read_text()))
    assert d["nodes"] == a["nodes"] and d["links"] == a["links"]
    with pytest.raises(Exception, match="already pruned"):
        prune_graph(back)

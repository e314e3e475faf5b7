"""load_pt and `attrgraph convert`: graphs circuit-tracer saved with `Graph.to_pt`, read here.

Expected values from circuit-tracer itself, on the graph.pt its harness run wrote
(`../shared/peer/ct_graph.py --out`): the adjacency and node arrays it saved beside the file
(`adjacency.npy`, `active_features.npy`, `selected_features.npy`, in its documented node order),
and what circuit-tracer's own `Graph.from_pt`, `prune_graph` and `compute_graph_scores` make of the
same file (peer venv). The refusals are checked on files made here by torch.save."""

import json
import pickle
import shutil
import zipfile

import numpy as np
import pytest
import torch

from attrgraph.bundled.paths import BUNDLED
from attrgraph.cli import main
from attrgraph.errors import ExportError, ExportWarning, GraphFileError, PromptWarning
from attrgraph.graph.circuit_tracer_pt import load_pt, save_pt
from attrgraph.graph.prune import prune_graph
from attrgraph.graph.scores import compute_graph_scores
from attrgraph.graph.store import load_graph
from tests.attrgraph.peer_frontend import peer_case, run_peer

CT_PRUNE = r"""
import json, sys
from circuit_tracer.graph import Graph, compute_graph_scores, prune_graph
g = Graph.from_pt(sys.argv[1])
replacement, completeness = compute_graph_scores(g)
out = {"replacement": replacement, "completeness": completeness}
for node_threshold, edge_threshold in json.loads(sys.argv[2]):
    r = prune_graph(g, node_threshold, edge_threshold)
    out[f"{node_threshold} {edge_threshold}"] = [r.node_mask.nonzero().flatten().tolist(), int(r.edge_mask.sum())]
print(json.dumps(out))
"""
THRESHOLDS = [(0.8, 0.98), (0.6, 0.9)]
CASES = {
    "gpt2-plt": "--arch gpt2 --transcoder plt --n-layers 2 --d-model 64 --d-transcoder 128 --prompt-len 6 --seed 1",
    "gemma2-clt-partial": "--arch gemma2 --transcoder clt --n-layers 3 --d-model 64 --d-transcoder 96 "
    "--prompt-len 7 --seed 2 --max-feature-nodes 20",
}


_RUNS: dict = {}


def harness_run(name: str, tmp_path_factory):
    """The harness folder of CASES[name], run once per session."""
    if name not in _RUNS:
        _RUNS[name] = peer_case(tmp_path_factory.mktemp(name), CASES[name])
    return _RUNS[name]


@pytest.fixture(scope="module", params=sorted(CASES))
def case(request, tmp_path_factory):
    return harness_run(request.param, tmp_path_factory)


def ct_order(g, d) -> np.ndarray:
    """circuit-tracer's index of each of our nodes, from its saved arrays and documented order
    (selected features, errors `layer * n_pos + pos`, tokens, logits)."""
    af, sel = np.load(d / "active_features.npy"), np.load(d / "selected_features.npy")
    n_pos, L = len(np.load(d / "input_tokens.npy")), int(g.meta["n_layers"])
    feat = {tuple(af[s].tolist()): i for i, s in enumerate(sel.tolist())}
    n, idx = g.nodes, []
    for i in range(g.n_nodes):
        kind, layer, pos = n.kind[i], int(n.layer[i]), int(n.position[i])
        if kind == "feature":
            idx.append(feat[(layer, pos, int(n.feature[i]))])
        elif kind == "error":
            idx.append(len(sel) + layer * n_pos + pos)
        elif kind == "embedding":
            idx.append(len(sel) + L * n_pos + pos)
        else:
            idx.append(
                len(sel) + L * n_pos + n_pos + int(np.flatnonzero(n.kind == "logit").tolist().index(i))
            )
    return np.array(idx)


def test_the_graph_circuit_tracer_saved_node_for_node(case):
    with pytest.warns(PromptWarning, match=r"prompt tokens are shown as \[id\]"):
        g = load_pt(case / "graph.pt")
    ref = np.load(case / "adjacency.npy")
    idx = ct_order(g, case)
    assert sorted(idx.tolist()) == list(range(len(ref)))  # every node of theirs, once
    np.testing.assert_array_equal(g.dense(), ref[np.ix_(idx, idx)])
    feats = g.nodes.kind == "feature"
    af, sel = np.load(case / "active_features.npy"), np.load(case / "selected_features.npy")
    values = np.load(case / "activation_values.npy")
    by_key = {tuple(af[s].tolist()): values[s] for s in sel.tolist()}
    keys = zip(g.nodes.layer[feats], g.nodes.position[feats], g.nodes.feature[feats])
    np.testing.assert_array_equal(g.nodes.activation[feats], [by_key[tuple(map(int, k))] for k in keys])
    np.testing.assert_array_equal(g.prompt_ids, np.load(case / "input_tokens.npy"))
    np.testing.assert_array_equal(g.logit_tokens, np.load(case / "logit_token_ids.npy"))
    np.testing.assert_allclose(g.logit_probs, np.load(case / "logit_probabilities.npy"), rtol=1e-7)
    meta = json.loads((case / "meta.json").read_text())
    assert g.meta["circuit_tracer_active_features"] == len(af)
    assert g.meta.get("circuit_tracer_explored_features") == (len(sel) if len(sel) < len(af) else None)
    assert g.meta["embedding"] == "token" and g.meta["n_layers"] == meta["cfg_kwargs"]["n_layers"]


@pytest.fixture(scope="module")
def circuit_tracers(case) -> dict:
    """circuit-tracer's prune_graph (at each of THRESHOLDS) and compute_graph_scores of the file."""
    return run_peer(CT_PRUNE, case / "graph.pt", json.dumps(THRESHOLDS))


@pytest.mark.parametrize("thresholds", THRESHOLDS)
def test_pruned_and_scored_as_circuit_tracer_prunes_and_scores_it(case, circuit_tracers, thresholds):
    """Our prune_graph (circuit-tracer's rule, the default) keeps the nodes its prune_graph keeps
    on the same file, with as many edges, and the scores are its compute_graph_scores'."""
    nodes, edges = circuit_tracers[" ".join(map(str, thresholds))]
    with pytest.warns(PromptWarning):
        g = load_pt(case / "graph.pt")
    idx = ct_order(g, case)
    pruned = prune_graph(g, *thresholds)
    kept = np.flatnonzero(np.isin(idx, nodes))
    assert pruned.n_nodes == len(nodes) == len(kept)
    assert pruned.n_edges == edges
    np.testing.assert_array_equal(pruned.dense(), g.dense()[np.ix_(kept, kept)] * (pruned.dense() != 0))
    scores = compute_graph_scores(g)
    assert scores.replacement == pytest.approx(circuit_tracers["replacement"], abs=1e-6)
    assert scores.completeness == pytest.approx(circuit_tracers["completeness"], abs=1e-6)


def test_token_strings_come_from_the_tokenizer_given(case):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(case / "tokenizer"))
    g = load_pt(case / "graph.pt", tokenizer=tok)
    assert g.prompt_tokens == [tok.decode([i]) for i in np.load(case / "input_tokens.npy").tolist()]
    # the LogitTarget strings circuit-tracer stored: its tokenizer's decoding of each target
    assert g.logit_strings == [tok.decode([i]) for i in g.logit_tokens.tolist()]


def test_convert_stores_it_for_the_other_commands(case, tmp_path, capsys):
    out = tmp_path / "g.h5"
    rc = main(["convert", str(case / "graph.pt"), "-o", str(out), "--tokenizer", str(case / "tokenizer")])
    assert rc == 0
    printed = capsys.readouterr().out
    g = load_graph(out, "graph")
    assert (
        f"wrote {out}:/graphs/graph: {g.n_nodes} nodes, {g.n_edges} edges, {g.n_features} features" in printed
    )
    np.testing.assert_array_equal(
        g.dense(), np.load(case / "adjacency.npy")[np.ix_(ct_order(g, case), ct_order(g, case))]
    )
    assert main(["show", str(out)]) == 0
    shown = capsys.readouterr().out
    assert "NaN" not in shown and "scores: replacement" in shown
    explored = g.meta.get("circuit_tracer_explored_features")
    said = (
        f": {explored} of {g.meta['circuit_tracer_active_features']} active features explored"
        if explored
        else ""
    )
    model_name = json.loads((case / "meta.json").read_text())["cfg_kwargs"]["model_name"]
    assert f"  built by circuit-tracer (model {model_name}, transcoders " in shown
    assert said in shown
    assert (
        main(
            [
                "export",
                str(out),
                "--node-threshold",
                "0.8",
                "--edge-threshold",
                "0.98",
                "-o",
                str(tmp_path / "s"),
            ]
        )
        == 0
    )


# ----------------------------------------------------------------------------- refusals
def saved(tmp_path, data, name="g.pt"):
    path = tmp_path / name
    torch.save(data, path)
    return path


class Payload:
    """A pickle that would run code when loaded unsafely: it creates a file."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_nothing_in_the_file_runs(tmp_path):
    ran = tmp_path / "ran"
    path = saved(tmp_path, {"adjacency_matrix": torch.zeros(2, 2), "cfg": Payload(ran)})
    with pytest.raises(GraphFileError, match="holds objects other than circuit-tracer's graph") as e:
        load_pt(path)
    assert not ran.exists() and "\n" not in str(e.value)


def good(n_pos=2, n_layers=1, n_logits=1) -> dict:
    n = n_layers * n_pos + n_pos + n_logits
    return {
        "input_string": "a b",
        "input_tokens": torch.tensor([1, 2][:n_pos]),
        "active_features": torch.zeros(0, 3, dtype=torch.long),
        "selected_features": torch.zeros(0, dtype=torch.long),
        "activation_values": torch.zeros(0),
        "adjacency_matrix": torch.zeros(n, n),
        "logit_targets": torch.tensor([3]),
        "logit_probabilities": torch.tensor([0.5]),
        "vocab_size": 10,
        "cfg": _cfg(n_layers),
        "scan": "x",
    }


def _cfg(n_layers):
    from transformer_lens import HookedTransformerConfig

    return HookedTransformerConfig(n_layers=n_layers, d_model=4, n_ctx=8, d_head=2, d_vocab=10, act_fn="relu")


def test_an_older_file_with_a_transformer_lens_config_and_token_ids(tmp_path):
    with pytest.warns(PromptWarning):
        g = load_pt(saved(tmp_path, good()))
    assert g.n_nodes == 5 and list(g.logit_tokens) == [3] and g.logit_strings == ["[3]"]


@pytest.mark.parametrize(
    "edit, says",
    [
        (lambda d: d.pop("adjacency_matrix"), "lacks ['adjacency_matrix']"),
        (lambda d: d.update(adjacency_matrix=torch.zeros(4, 4)), "adjacency_matrix is (4, 4), not [5, 5]"),
        (lambda d: d.update(selected_features=torch.tensor([3])), "is (5, 5), not [6, 6]"),
        (
            lambda d: d.update(logit_probabilities=torch.tensor([0.5, 0.2])),
            "logit_probabilities holds 2 values",
        ),
        (
            lambda d: d.update(input_tokens=torch.tensor([1.0, 2.0])),
            "input_tokens has shape (2,) and dtype float32",
        ),
        (lambda d: d.update(logit_targets="x"), "logit_targets is not a list of (token_str, vocab_idx)"),
        (lambda d: d.update(adjacency_matrix=None), "adjacency_matrix is NoneType, not a 2-d tensor"),
        (
            lambda d: d.update(activation_values=torch.zeros(2, 2)),
            "activation_values is (2, 2), not a 1-d tensor",
        ),
    ],
)
def test_files_that_are_not_one_graph_are_one_line(tmp_path, edit, says):
    data = good()
    edit(data)
    with pytest.raises(GraphFileError) as e:
        load_pt(saved(tmp_path, data))
    assert says in str(e.value) and "\n" not in str(e.value)


def test_damaged_and_foreign_files(tmp_path):
    path = saved(tmp_path, good())
    cut = tmp_path / "cut.pt"
    cut.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])
    text = tmp_path / "text.pt"
    text.write_text("not a graph")
    old = tmp_path / "old.pt"
    with open(old, "wb") as f:
        pickle.dump({"a": 1}, f)
    for p, says in [
        (cut, "is not a torch.save file"),
        (text, "is not a torch.save file"),
        (old, "is not a torch.save file"),
        (tmp_path / "none.pt", "does not exist"),
    ]:
        with pytest.raises(GraphFileError, match=says):
            load_pt(p)
    assert not zipfile.is_zipfile(cut)


def record_start(path, suffix: str) -> int:
    """The offset of the first byte of the archive record whose name ends with `suffix` (the local
    header's fixed 30 bytes, then its name and extra field, as the zip format lays them out)."""
    import struct

    with zipfile.ZipFile(path) as z:
        info = next(i for i in z.infolist() if i.filename.endswith(suffix))
    raw = path.read_bytes()
    name_len, extra_len = struct.unpack("<HH", raw[info.header_offset + 26 : info.header_offset + 30])
    return info.header_offset + 30 + name_len + extra_len


def test_a_changed_byte_in_a_record_is_refused_by_its_checksum(tmp_path):
    """torch reads a memory-mapped record without checking it: one changed byte of the adjacency
    would be another graph. The CRC-32 torch.save wrote for each record (zip format) refuses it;
    a file written without checksums (`set_crc32_options(False)`: CRC 0) is read unchecked."""
    data = good()
    data["adjacency_matrix"][4, 0] = 0.25  # the logit from the first error node
    path = saved(tmp_path, data)
    with pytest.warns(PromptWarning):
        assert load_pt(path).n_edges == 1
    raw = bytearray(path.read_bytes())
    with zipfile.ZipFile(path) as z:  # the adjacency's record: the one holding 0.25
        name = next(i.filename for i in z.infolist() if np.float32(0.25).tobytes() in z.read(i))
    start = record_start(path, name)
    at = start + bytes(raw[start:]).index(np.float32(0.25).tobytes())
    raw[at + 3] ^= 0x01  # 0.25 becomes another float
    bad = tmp_path / "bad.pt"
    bad.write_bytes(bytes(raw))
    with pytest.raises(GraphFileError, match=r"is damaged \(Bad CRC-32 for file") as e:
        load_pt(bad)
    assert "\n" not in str(e.value)
    before = torch.serialization.get_crc32_options()
    try:
        torch.serialization.set_crc32_options(False)
        plain = saved(tmp_path, data, "plain.pt")
    finally:
        torch.serialization.set_crc32_options(before)
    with zipfile.ZipFile(plain) as z:
        assert {i.CRC for i in z.infolist()} == {0}
    with pytest.warns(PromptWarning):
        assert load_pt(plain).dense()[4, 2] == 0.25  # the logit, from the first error node


def test_an_edge_from_a_later_node_is_damage(tmp_path):
    """No graph circuit-tracer builds has an edge into a node from one after it in node order (a
    token's row is zero in its graphs); such a file is refused as damaged, not left to the influence
    solve's error about node order."""
    data = good()
    data["adjacency_matrix"][2, 4] = 1.0  # into the first token node, from the logit
    with pytest.raises(GraphFileError, match=r"an edge into node 2 from node 4.*the file is damaged") as e:
        load_pt(saved(tmp_path, data))
    assert "\n" not in str(e.value)


def test_byte_flips_load_the_same_graph_or_raise_graph_file_error(tmp_path_factory):
    """Every 5th byte of the graph.pt circuit-tracer's own to_pt wrote (about 2,000 flips), each loaded
    in a worker process (benchmarks/byte_flips.py): none may load another graph, raise another
    exception, crash or hang."""
    from benchmarks.byte_flips import fuzz

    path = harness_run("gemma2-clt-partial", tmp_path_factory) / "graph.pt"
    results = fuzz(path, list(range(0, path.stat().st_size, 5)), timeout=120)  # a guard against hangs
    bad = [r for r in results if r["outcome"] not in ("same", "ours")]
    assert not bad, bad[:5]
    ours = [r["detail"] for r in results if r["outcome"] == "ours"]
    assert len(ours) > 0.5 * len(results) and all(
        "\n" not in d and d.startswith("GraphFileError: ") for d in ours
    )


@pytest.mark.parametrize(
    "args, says",
    [
        (["{d}/g.txt", "-o", "{d}/o.h5"], "is neither a .pt graph"),
        (["{d}/g.pt", "-o", "{d}"], "is a folder; pass a file name"),
        (["{d}/g.json", "-o", "{d}/o.h5", "--tokenizer", "x"], "--tokenizer is for .pt graphs"),
        (["{d}/g.pt", "-o", "{d}/o.h5", "--tokenizer", "{d}/nope"], "--tokenizer {d}/nope is no tokenizer"),
        (["{d}/g.pt", "-o", "{d}/o.h5", "--name", "a/b"], "graph name 'a/b' is empty, '.' or contains '/'"),
        (["{d}/g.pt", "-o", "{d}/o.h5", "--model", "default"], "--model is for writing a .pt"),
        (["{d}/g.h5", "-o", "{d}/o.pt", "--name", "x"], "--tokenizer and --name are for reading a graph"),
    ],
)
def test_convert_refusals_are_one_line(tmp_path, capsys, args, says):
    saved(tmp_path, good())
    (tmp_path / "g.txt").write_text("x")
    (tmp_path / "g.json").write_text("{}")
    assert main(["convert", *(a.format(d=tmp_path) for a in args)]) == 2
    err = capsys.readouterr().err.strip()
    assert says.format(d=tmp_path) in err and "\n" not in err
    assert not (tmp_path / "o.h5").exists()


# ------------------------------------------------------------------------------------ write
CT_READ = r"""
import json, sys
import numpy as np
from circuit_tracer.graph import Graph, compute_graph_scores
g = Graph.from_pt(sys.argv[1])
np.save(sys.argv[2], g.adjacency_matrix.numpy())
replacement, completeness = compute_graph_scores(g)
print(json.dumps({"active_features": g.active_features.tolist(), "selected": g.selected_features.tolist(),
                  "activations": g.activation_values.tolist(), "targets": [list(t) for t in g.logit_targets],
                  "n_layers": g.cfg.n_layers, "d_model": g.cfg.d_model, "scan": g.scan,
                  "replacement": replacement, "completeness": completeness}))
"""


def test_circuit_tracer_reads_our_graph_as_its_own(tmp_path_factory, tmp_path):
    """Our graph of the harness's weights (its conventions: BOS excluded, W_E[token] embeddings),
    written by save_pt and read by circuit-tracer's own Graph.from_pt: its adjacency is the one
    circuit-tracer computed itself (4e-7 of the largest edge), with the same features, activations
    and targets, and its compute_graph_scores gives ours."""
    from attrgraph.bundled.loading import load_model
    from attrgraph.engine.attribute import attribute
    from transcoders.formats import load_transcoders

    d = harness_run("gpt2-plt", tmp_path_factory)
    model, tc = load_model(d), load_transcoders(d / "transcoders")
    g = attribute(
        model, tc, np.load(d / "input_tokens.npy"), exclude_bos=True, embedding="token", progress=False
    )
    path = save_pt(g, tmp_path / "sub" / "ours.pt", model, scan="toy-plt")
    assert [p.name for p in path.parent.iterdir()] == ["ours.pt"]  # no temporary left
    theirs = run_peer(CT_READ, path, tmp_path / "adjacency.npy")
    ref = np.load(d / "adjacency.npy")
    got = np.load(tmp_path / "adjacency.npy")
    assert got.shape == ref.shape and np.abs(got - ref).max() <= 4e-7 * np.abs(ref).max()
    np.testing.assert_array_equal(theirs["active_features"], np.load(d / "active_features.npy"))
    np.testing.assert_allclose(theirs["activations"], np.load(d / "activation_values.npy"), rtol=1e-6)
    assert [t[1] for t in theirs["targets"]] == np.load(d / "logit_token_ids.npy").tolist()
    assert (theirs["n_layers"], theirs["d_model"], theirs["scan"]) == (2, 64, "toy-plt")
    scores = compute_graph_scores(g)
    assert scores.replacement == pytest.approx(theirs["replacement"], abs=1e-6)
    assert scores.completeness == pytest.approx(theirs["completeness"], abs=1e-6)


def small_graph():
    from tests.attrgraph.graph.test_neuronpedia import D_VOCAB, N_LAYERS, layered_graph

    return layered_graph(6), _cfg_of(N_LAYERS, D_VOCAB)


def _cfg_of(n_layers, d_vocab):
    from transformer_lens import HookedTransformerConfig

    return HookedTransformerConfig(
        n_layers=n_layers, d_model=4, n_ctx=8, d_head=2, d_vocab=d_vocab, act_fn="relu"
    )


def test_written_and_read_back(tmp_path):
    """save_pt then load_pt: every node and edge of the graph, and the zero error nodes save_pt adds
    where the graph has none (here the graph has them all), with tokens, targets and activations."""
    g, cfg = small_graph()
    g.meta["embedding"] = "token"
    path = save_pt(g, tmp_path / "g.pt", cfg)
    with pytest.warns(PromptWarning):
        h = load_pt(path)
    assert h.n_nodes == g.n_nodes
    np.testing.assert_array_equal(h.dense(), g.dense())
    for field in ("kind", "layer", "position", "feature", "token"):
        np.testing.assert_array_equal(getattr(h.nodes, field), getattr(g.nodes, field))
    feats = g.nodes.kind == "feature"
    np.testing.assert_array_equal(h.nodes.activation[feats], g.nodes.activation[feats])
    assert h.logit_strings == g.logit_strings
    np.testing.assert_array_equal(h.logit_probs, g.logit_probs)
    # a pruned graph: the nodes it lost come back as zero rows and columns
    pruned = prune_graph(g, 0.5, 0.9)
    with pytest.warns(PromptWarning):
        back = load_pt(save_pt(pruned, tmp_path / "p.pt", cfg))
    assert back.n_nodes > pruned.n_nodes and back.n_edges == pruned.n_edges
    assert compute_graph_scores(back) == pytest.approx(tuple(compute_graph_scores(pruned)), abs=1e-12)


def test_what_circuit_tracer_cannot_hold_is_refused(tmp_path):
    g, cfg = small_graph()
    attn = g.subgraph(np.arange(g.n_nodes))
    attn.nodes.site = np.where(np.isin(attn.nodes.kind, ("feature", "error")), "mlp", "").astype("<U4")
    attn.nodes.site[np.flatnonzero(attn.nodes.kind == "feature")[0]] = "attn"
    moved = g.subgraph(np.arange(g.n_nodes))
    moved.nodes.position[moved.nodes.kind == "logit"] -= 1
    for graph, model, says in [
        (attn, cfg, "holds attention-output features or errors"),
        (moved, cfg, "targets at other positions than the last"),
        (g, _cfg_of(3, 435), "built on 2 layers, the model given has 3"),
        (g, "gpt2", r"takes the graph's model \(or its config\), got a str"),
    ]:
        with pytest.raises(ExportError, match=says):
            save_pt(graph, tmp_path / "x.pt", model)
    assert not list(tmp_path.iterdir())
    for where, says in [
        (tmp_path, "is a folder; pass a file name"),
        (tmp_path / "f" / "x.pt", "cannot write into"),
    ]:
        if where != tmp_path:
            (tmp_path / "f").write_text("a file where a folder goes")
        with pytest.raises(ExportError, match=says):
            save_pt(g, where, cfg)
    g.meta["embedding"] = "token+position"  # attrgraph's default
    with pytest.warns(ExportWarning, match="token \\+ position embeddings"):
        save_pt(g, tmp_path / "w.pt", cfg)


@pytest.mark.parametrize("name, says", [("g.pt", "attrgraph.load_pt"), ("g.json", "attrgraph.load_json")])
def test_a_foreign_graph_where_ours_goes_names_convert(tmp_path, capsys, name, says):
    path = tmp_path / name
    if name.endswith(".pt"):
        saved(tmp_path, good(), name)
    else:
        path.write_text("{}")
    for command in (["show", str(path)], ["export", str(path), "-o", str(tmp_path / "s")]):
        assert main(command) == 2
        err = capsys.readouterr().err.strip()
        assert f"store it as one with `attrgraph convert {path} -o graph.h5` (from Python: {says})" in err


def test_circuit_tracers_graph_is_validated_by_interventions_on_its_model(tmp_path_factory):
    """validate_graph on the converted graph, with the harness's model and set loaded here: the
    interventions score it as they score our own graph of the same weights (the two graphs agree to
    float32 rounding, and the interventions are the same runs)."""
    from attrgraph.analysis.validate import ValidateConfig, validate_graph
    from attrgraph.bundled.loading import load_model
    from attrgraph.engine.attribute import attribute
    from transcoders.formats import load_transcoders

    d = harness_run("gpt2-plt", tmp_path_factory)
    model, tc = load_model(d), load_transcoders(d / "transcoders")
    cfg = ValidateConfig(max_features=24, n_perturbations=4)
    theirs = validate_graph(model, tc, load_pt(d / "graph.pt", tokenizer=model), cfg)
    g = attribute(
        model, tc, np.load(d / "input_tokens.npy"), exclude_bos=True, embedding="token", progress=False
    )
    ours = validate_graph(model, tc, g, cfg)
    for kind in ("influence", "activation", "direct_logit_edge"):
        assert theirs["node_to_logit"]["mean"][kind] == pytest.approx(
            ours["node_to_logit"]["mean"][kind], abs=1e-5
        )
    assert theirs["feature_to_feature"]["spearman"] == pytest.approx(
        ours["feature_to_feature"]["spearman"], abs=1e-5
    )
    assert theirs["feature_to_feature"]["n_pairs"] == ours["feature_to_feature"]["n_pairs"] > 0


def test_convert_writes_ours_for_circuit_tracer(tmp_path):
    """`attrgraph convert FILE:NAME -o OUT.pt` (the model from the graph's meta): circuit-tracer's
    own from_pt reads every edge, feature and target, and scores it as we do."""
    from attrgraph.graph.store import save_graph

    g, _ = small_graph()
    g.meta.update(model="default", embedding="token")  # the bundled model stands in for its config
    g.meta["n_layers"] = 4
    save_graph(_four_layers(g), tmp_path / "g.h5", "mine")
    assert main(["convert", f"{tmp_path / 'g.h5'}:mine", "-o", str(tmp_path / "g.pt")]) == 0
    theirs = run_peer(CT_READ, tmp_path / "g.pt", tmp_path / "adjacency.npy")
    h = load_graph(tmp_path / "g.h5", "mine")
    assert theirs["n_layers"] == 4 and len(theirs["active_features"]) == h.n_features
    assert np.count_nonzero(np.load(tmp_path / "adjacency.npy")) == h.n_edges
    scores = compute_graph_scores(h)
    assert theirs["replacement"] == pytest.approx(scores.replacement, abs=1e-6)
    assert theirs["completeness"] == pytest.approx(scores.completeness, abs=1e-6)
    # --model: a folder whose weights cannot be read (only its config.json is)
    folder = tmp_path / "model"
    shutil.copytree(BUNDLED["default"], folder)
    (folder / "model.safetensors").write_bytes(b"not weights")
    out = tmp_path / "again.pt"
    assert main(["convert", f"{tmp_path / 'g.h5'}:mine", "-o", str(out), "--model", str(folder)]) == 0
    with pytest.warns(PromptWarning):
        again, first = load_pt(out), load_pt(tmp_path / "g.pt")
    np.testing.assert_array_equal(again.dense(), first.dense())
    assert again.meta == first.meta


def _four_layers(g):
    """`g` (a 2-layer hand-built graph) with its logits moved to layer 4, as for a 4-layer model."""
    h = g.subgraph(np.arange(g.n_nodes))
    h.nodes.layer[h.nodes.kind == "logit"] = 4
    return h


def test_a_custom_target_keeps_its_label_through_circuit_tracers_virtual_index(tmp_path):
    """A target that is no token (a logit difference's direction: token -1) is written with
    circuit-tracer's virtual index vocab_size + k, which circuit-tracer itself reads as no token, and
    read back as token -1 with its label."""
    g, cfg = small_graph()
    g.meta["embedding"] = "token"
    logits = np.flatnonzero(g.nodes.kind == "logit")
    g.nodes.token[logits[1]] = -1
    g.logit_tokens[1] = -1
    g.logit_strings[1] = "logit(a) - logit(b)"
    path = save_pt(g, tmp_path / "g.pt", cfg)
    theirs = run_peer(CT_READ, path, tmp_path / "adjacency.npy")
    assert theirs["targets"][1] == ["logit(a) - logit(b)", cfg.d_vocab + 1]
    with pytest.warns(PromptWarning):
        h = load_pt(path)
    assert h.logit_tokens.tolist() == g.logit_tokens.tolist() and h.logit_strings == g.logit_strings
    np.testing.assert_array_equal(h.dense(), g.dense())

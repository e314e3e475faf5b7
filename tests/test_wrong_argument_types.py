"""A value of the wrong type for any argument of any public function (docs/bad_inputs.md, "Round 13"):
None, a number, a string, an empty list or dict, a bare object, NaN, True, a loaded graph. The rule
of ../shared/BAD_INPUTS.md is the spec: the call either works (the value means something there,
such as None for "the default") or raises the package's own error (`AttrgraphError`) in one line.
Before round 13, 448 of 1,934 such calls to attrgraph's functions (and 126 of 589 to transcoders')
raised TypeError, AttributeError, IndexError or ValueError from inside (`prune_graph(g, "0.8", 0.98)`: `'<=' not supported between instances of 'float' and
'str'`), and a loaded graph quoted in a message ran over many lines (its dataclass repr)."""

from __future__ import annotations

import inspect
import math
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

import attrgraph
import transcoders
from attrgraph.circuits.discovery import task_data
from attrgraph.circuits.edge_pruning import PruneConfig
from attrgraph.errors import AttrgraphError
from transcoders import load_transcoders

PROMPT = "Mary and John went to"
ROOT = Path(__file__).resolve().parent.parent
NOT_SWEPT = {
    "compute_dashboards": "runs over a corpus (tests/transcoders/test_dashboards.py checks its config)",
    "show": "draws in Jupyter (its arguments are checked by the viewer's tests)",
    "validate_graph": "runs interventions for every accepted value (tests/attrgraph/analysis)",
    "mean_norm_scales": "takes a model and token batches (tests/attrgraph/analysis/test_global_weights.py)",
    "norm_scales_at": "takes a ReplacementState",
    "node_biases": "takes a ReplacementModel and a built graph's targets",
}


def public_functions() -> list[str]:
    """Both packages' public functions and the classes of `CONFIGS`, as `package.name`."""
    out = []
    for package in (attrgraph, transcoders):
        names = sorted({n.split("=")[0] for names in package._EXPORTS.values() for n in names})
        out += [
            f"{package.__name__}.{n}"
            for n in names
            if (inspect.isfunction(getattr(package, n)) or n in CONFIGS) and n not in NOT_SWEPT
        ]
    return out


CONFIGS = (
    "TranscoderConfig", "DashboardConfig", "ValidateConfig", "ReplacementModel", "TranscoderSets", "GlobalWeights",
    "Supernode",
)  # fmt: skip
"""The classes a user builds with arguments (the rest are results)."""


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    """A working value of every argument name the public functions use."""
    model = attrgraph.load_model("default")
    tc = load_transcoders("default-plt")
    graph = attrgraph.prune_graph(attrgraph.attribute(model, tc, PROMPT, progress=False), 0.5, 0.9)
    d = tmp_path_factory.mktemp("args")
    attrgraph.save_graph(graph, d / "g.h5", name="g")
    feats = np.flatnonzero(graph.nodes.kind == "feature")
    key = tuple(int(getattr(graph.nodes, f)[feats[0]]) for f in ("layer", "position", "feature"))
    pairs = task_data(model, "ioi", 4)[0]
    scores = attrgraph.eap(model, pairs)
    return {
        "model": model, "transcoders": tc, "prompt": PROMPT, "graph": graph, "path": str(d / "g.h5"),
        "supernodes": [attrgraph.supernode(graph, "a", feats[:2].tolist())], "node_ids": feats[:2].tolist(),
        "name": "g", "graph_name": "g", "interventions": {key: 0.0}, "layer": key[0],
        "position": key[1], "feature": key[2], "out_dir": str(d / "out"), "slug": "s",
        "node_threshold": 0.5, "edge_threshold": 0.9, "tau": 0.5, "token": " Mary", "token_a": " Mary",
        "token_b": " John", "head": 0, "query_position": 4, "key_position": 1, "n_tokens": 2,
        "source": "pinnedIds=x", "A": graph.adjacency, "adjacency": graph.adjacency,
        "logit_weights": graph.logit_weights(), "pairs": pairs, "task": "ioi", "method": "eap",
        "scores": scores, "n": 4, "edges": 3, "steps": 2, "circuit": attrgraph.greedy(scores, 5),
        "threshold": 0.8, "hook": "blocks.1.hook_resid_post", "vector": torch.ones(model.cfg.d_model),
        "cfg": tc.cfg, "tc": tc, "coders": [tc], "sequences": model.to_tokens(PROMPT), "tokens": model.to_tokens(PROMPT),
        "which": 0, "cache": model.run_with_cache(model.to_tokens(PROMPT))[1], "name_or_path": "default-plt",
        "d": transcoders.load_dashboards(ROOT / "data/default-plt/dashboards.h5").feature(0, 0), "labels": {(0, 0): "x"},
        "kind": "plt", "n_layers": 2, "d_model": 8, "d_sae": 16, "mlp": tc, "members": [key],
    }  # fmt: skip


def wrong_values(graph) -> dict:
    return {
        "None": None, "3": 3, "'nonsense'": "nonsense", "[]": [], "{}": {}, "object()": object(),
        "nan": math.nan, "True": True, "a Graph": graph,
    }  # fmt: skip


@pytest.mark.parametrize("name", public_functions())
def test_a_wrong_value_is_accepted_or_one_line_of_ours(name, good, tmp_path, monkeypatch):
    package, name = name.split(".")
    fn = getattr(attrgraph if package == "attrgraph" else transcoders, name)
    params = [
        p
        for p in inspect.signature(fn).parameters.values()
        if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    missing = [p.name for p in params if p.default is p.empty and p.name not in good | {"config": 0}]
    assert not missing, f"{name}: no working value for {missing}; add one to the fixture"
    base = {p.name: good[p.name] for p in params if p.name in good}
    if name == "view_link":
        base["model"] = "gemma-2-2b"  # the Neuronpedia model id, not the loaded model
    if name in ("hap", "prune_edges"):
        base["config"] = PruneConfig(steps=2)
    if name.startswith("save_"):
        base["path"] = str(tmp_path / {"save_pt": "w.pt", "save_transcoders": "set"}.get(name, "w.h5"))
    if name in ("set_labels", "load_dashboards"):
        base["path"] = str(tmp_path / "dashboards.h5")
        shutil.copy(ROOT / "data/default-plt/dashboards.h5", base["path"])
    if name == "compute_coactivation":
        base["pairs"] = np.array([[0, 1]])
    monkeypatch.chdir(tmp_path)  # "nonsense" is a fine file name: save_graph writes it here
    foreign, calls = [], 0
    for p in params:
        for shown, value in wrong_values(good["graph"]).items():
            if p.default is not p.empty and value is p.default:
                continue
            if isinstance(value, attrgraph.Graph) and p.name == "graph":
                continue
            calls += 1
            try:
                fn(**(base | {p.name: value}))
            except AttrgraphError as e:
                if "\n" in str(e):
                    foreign.append(
                        f"{p.name}={shown}: {type(e).__name__} over {len(str(e).splitlines())} lines"
                    )
            except Exception as e:  # noqa: BLE001 - which ones escape is the point
                foreign.append(f"{p.name}={shown}: {type(e).__name__}: {str(e)[:120]}")
    assert calls and not foreign, f"{name}: " + "; ".join(foreign[:6])


def test_a_graph_quoted_in_a_message_is_one_line(good):
    g = good["graph"]
    assert repr(g).startswith(f"Graph({g.n_nodes} nodes: ") and "\n" not in repr(g)
    assert repr(g).endswith(f"{g.n_edges} edges; prompt '<bos>' 'Mary' 'and' 'John' 'went' 'to')")
    with pytest.raises(
        AttrgraphError, match=r"node_threshold is Graph\(\d+ nodes: .*\.\.\.; pass a fraction"
    ):
        attrgraph.prune_graph(g, g, 0.9)


@pytest.mark.parametrize(
    "call, says",
    [
        (lambda g: attrgraph.prune_graph(g["graph"], "0.8", 0.98), "node_threshold is '0.8'; pass a fraction in [0, 1]"),
        (lambda g: attrgraph.load_graph(None), "path is a NoneType (None); pass a file path (a str or pathlib.Path)."),
        (lambda g: attrgraph.error_node("1", 2), "layer is '1'; pass a whole number."),
        (lambda g: attrgraph.greedy(g["scores"], 2.5), "a circuit of 2.5 edges was asked for; pass 0 or more."),
        (lambda g: attrgraph.attribute(g["model"], g["transcoders"], PROMPT, targets=3), "targets is a int (3); pass a list of Target"),
        (lambda g: attrgraph.logit_target(None, " Mary"), "the model is a NoneType, not a TransformerLens HookedTransformer"),
        (lambda g: attrgraph.export_json(g["graph"], g["out_dir"], labels=["L0/F1"]), "labels is a list (['L0/F1']); pass a dict"),
        (lambda g: attrgraph.hierarchical_attribution(g["graph"], bias="x"), "bias is not numbers; pass one constant term per node"),
    ],
)  # fmt: skip
def test_the_sentences(good, call, says):
    with pytest.raises(AttrgraphError) as e:
        call(good)
    assert says in str(e.value) and "\n" not in str(e.value)

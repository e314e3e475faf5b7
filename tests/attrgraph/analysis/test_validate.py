"""Validation: the reported statistics on inputs whose correlations are known exactly, influence
columns equal to the dense formula, faithfulness perfect when the replacement is the model, the
report, and the CLI on the bundled model."""

import json
import math

import numpy as np
import pytest
import torch

from attrgraph.analysis.stats import spearman
from attrgraph.analysis.validate import ValidateConfig, faithfulness, influence_columns, validate_graph
from attrgraph.analysis.validation_report import summarize_results, write_report
from attrgraph.engine.attribute import attribute
from attrgraph.engine.replacement import ReplacementModel
from attrgraph.errors import ValidationError
from attrgraph.graph.graph import Graph, Nodes
from attrgraph.graph.prune import normalize_matrix
from tests.attrgraph.ag_helpers import random_graph, tiny_model, tiny_transcoders

TOKENS = [3, 17, 5, 9, 17, 5, 22, 8, 4, 11]


def test_influence_columns_equal_the_dense_formula():
    g = random_graph(3)
    A = normalize_matrix(g.adjacency).toarray()
    B = np.linalg.inv(np.eye(len(A)) - A) - np.eye(len(A))
    src = np.array([7, 9, 12])
    np.testing.assert_allclose(influence_columns(g, src), B[:, src], atol=1e-12)


def test_faithfulness_is_perfect_when_the_replacement_is_exact():
    """With MLPs that output nothing and transcoders that decode nothing, the replacement model is the
    model: every perturbation has the same effect in both (cosine 1, normalized MSE 0)."""
    model = tiny_model("gpt2", n_layers=3)
    tc = tiny_transcoders(model, "plt")
    with torch.no_grad():
        for block in model.blocks:
            block.mlp.W_out.zero_()
            block.mlp.b_out.zero_()
        tc.W_dec.zero_()
        tc.b_dec.zero_()
    rm = ReplacementModel(model, tc)
    state = rm.run(torch.tensor(TOKENS), exclude_bos=False)
    out = faithfulness(rm, state, ValidateConfig(n_perturbations=4))
    assert set(out) == {"encoder", "random", "upstream"}
    for kind in ("encoder", "random"):
        np.testing.assert_allclose(out[kind]["cosine"], 1.0, atol=1e-9)
        np.testing.assert_allclose(out[kind]["nmse"], 0.0, atol=1e-12)


# ------------------------------------------------------------------ known correlations
def _centered_ranks_x2(x: np.ndarray) -> np.ndarray:
    """2 * (average rank - mean rank): integers, ties sharing their mean rank (Spearman's ranks)."""
    x = np.asarray(x)
    order = np.argsort(x, kind="stable")
    ranks = np.empty(len(x))
    sorted_x = x[order]
    i = 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and sorted_x[j + 1] == sorted_x[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1  # ranks i+1..j+1 share their mean
        i = j + 1
    out = 2 * ranks - (len(x) + 1)
    assert np.array_equal(out, np.round(out))
    return out.astype(np.int64)


def _rank_uncorrelated(y: np.ndarray) -> np.ndarray:
    """A two-level x (1 or 2) with Spearman(x, y) = 0 exactly: x = 2 on a set of points whose centered
    ranks of y sum to 0 (every other pair of opposite centered ranks, else the points of rank 0)."""
    c = _centered_ranks_x2(y)
    x = np.ones(len(y))
    by_value: dict[int, list[int]] = {}
    for i, v in enumerate(c):
        by_value.setdefault(int(v), []).append(i)
    opposite = [v for v in sorted(by_value) if v > 0 and -v in by_value]
    for v in opposite[::2]:
        k = min(len(by_value[v]), len(by_value[-v]))
        x[by_value[v][:k]] = x[by_value[-v][:k]] = 2.0
    if not opposite:
        x[by_value.get(0, [])] = 2.0
    assert 0 < (x == 2).sum() < len(x) and c[x == 2].sum() == 0
    return x


def _loglog_uncorrelated(y: np.ndarray, seed: int = 0) -> np.ndarray:
    """Positive x with Pearson(log x, log y) = 0: log x is a random vector made orthogonal to the
    constant and to log y - mean."""
    ly = np.log(y) - np.log(y).mean()
    z = np.random.default_rng(seed).normal(size=len(y))
    z -= z.mean()
    z -= (z @ ly) / (ly @ ly) * ly
    return np.exp(z)


def test_spearman_on_known_answers():
    x = np.array([0.3, 1.0, 2.0, 5.0, 7.5, 11.0])
    assert spearman(x, x**3) == pytest.approx(1.0, abs=1e-12)
    assert spearman(x, -np.exp(x)) == pytest.approx(-1.0, abs=1e-12)
    assert spearman(x, _rank_uncorrelated(x)) == pytest.approx(0.0, abs=1e-12)
    # ties share their mean rank: y's centered ranks (0, -2, 2, 2, -2, 0) are orthogonal to x's
    assert spearman(x, [2.0, 1.0, 3.0, 3.0, 1.0, 2.0]) == pytest.approx(0.0, abs=1e-12)
    # one exchanged pair among 6 distinct ranks: 1 - 6 * 2 / (6 * 35)
    assert spearman(x, [1, 2, 3, 4, 6, 5]) == pytest.approx(1 - 12 / 210, abs=1e-12)
    assert math.isnan(spearman(x[:2], x[:2])) and math.isnan(spearman(x, np.ones(6)))


@pytest.fixture(scope="module")
def ablation_truth():
    """Ground truth for validate.py's ablations, computed here with plain TransformerLens hooks.

    Two-layer GPT-2-style model, PLT; sources: the active layer-0 features at the last 3 positions.
    Ablating a source over [0, 1] (the node-to-logit windows 1 and 99 and the feature-to-feature
    range [0, 0 + 2], both clipped to the last layer) with attention patterns and norm scales frozen
    is: layer 0's MLP output minus a_s W_dec[s] at the source's position, layer 1's MLP output held
    at its clean value. From that run: KL(clean || ablated) at the last position, and each layer-1
    feature's activation relu(x W_enc + b_enc) on the MLP's input x (ln2's output, weight and bias
    included)."""
    model = tiny_model("gpt2", n_layers=2)
    tc = tiny_transcoders(model, "plt")
    rm = ReplacementModel(model, tc)
    state = rm.run(torch.tensor(TOKENS), exclude_bos=False)
    L, P, _ = state.acts.shape
    tokens = torch.tensor(TOKENS)[None]
    frozen = [(n, lambda x, hook, v=v: v.expand(x.shape)) for n, v in state.frozen.items()]
    ln2 = model.blocks[1].ln2

    def run(edit=None):
        got = {}
        hooks = frozen + [("blocks.1.ln2.hook_normalized", lambda x, hook: got.setdefault("x", x))]
        if edit is not None:
            p, f = edit
            a, dec = state.acts[0, p, f], tc.W_dec[0, f].detach().double()

            def sub(x, hook):
                x = x.clone()
                x[:, p] -= a * dec
                return x

            y1 = state.y_out[1][None]
            hooks += [("blocks.0.hook_mlp_out", sub), ("blocks.1.hook_mlp_out", lambda x, hook: y1.to(x))]
        with torch.no_grad(), model.hooks(fwd_hooks=hooks):
            logits = model(tokens)[0, -1].double()
            x = got["x"][0] * ln2.w + ln2.b  # what blocks.1.mlp receives
            acts = torch.relu(x.double() @ tc.W_enc[1].double() + tc.b_enc[1].double())
        return logits.log_softmax(-1), acts.numpy()

    clean, acts1 = run()
    np.testing.assert_allclose(acts1, state.acts[1].numpy(), atol=1e-12)  # the hooks are the model
    sources = [(p, f) for p in range(P - 3, P) for f in np.flatnonzero(state.acts[0, p] > 0)]
    targets = [(p, f) for p in range(P - 3, P) for f in np.flatnonzero(acts1[p] > 0)]
    kl, effect = [], {}
    for s in sources:
        logp, after = run(s)
        kl.append(float((clean.exp() * (clean - logp)).sum()))
        for t in targets:
            if t[0] >= s[0]:
                effect[s, t] = abs(after[t] - acts1[t]) / acts1[t]
    return model, tc, state, sources, targets, np.array(kl), effect


def _synthetic_graph(state, sources, targets, influence, activation, logit_edge, pair_weight):
    """A graph on the sources (layer 0), the targets (layer 1), one embedding and one logit node:
    the node-to-logit predictors are given per source; `adjacency[t, s] = pair_weight[s, t]` with the
    embedding filling every target row up to 1, so that normalization leaves the weights as they are
    and, with no feature-to-feature path longer than one edge, `B[t, s] = pair_weight[s, t]`."""
    P = state.acts.shape[1]
    n_s, n_t = len(sources), len(targets)
    n = 1 + n_s + n_t + 1
    layer = [-1] + [0] * n_s + [1] * n_t + [2]
    pos = [0] + [p for p, _ in sources] + [p for p, _ in targets] + [P - 1]
    feat = [-1] + [f for _, f in sources] + [f for _, f in targets] + [-1]
    act = [1.0, *activation, *(state.acts[1, p, f].item() for p, f in targets), 1.0]
    infl = np.concatenate([[np.nan], influence, np.zeros(n_t), [np.nan]])
    A = np.zeros((n, n))
    for (s, t), w in pair_weight.items():
        A[1 + n_s + targets.index(t), 1 + sources.index(s)] = w
    A[1 + n_s : 1 + n_s + n_t, 0] = 1.0 - A[1 + n_s : 1 + n_s + n_t].sum(1)
    A[-1, 1 : 1 + n_s] = np.asarray(logit_edge) / 0.5  # direct logit edge = p * |A[logit, s]|
    nodes = Nodes(
        kind=np.array(["embedding"] + ["feature"] * (n_s + n_t) + ["logit"]),
        layer=np.array(layer),
        position=np.array(pos),
        feature=np.array(feat),
        activation=np.array(act),
        token=np.array([TOKENS[0]] + [-1] * (n_s + n_t) + [7]),
        influence=infl,
    )
    graph = Graph(nodes, A, np.array(TOKENS), [str(t) for t in TOKENS], np.array([7]), np.array([0.5]))
    np.testing.assert_array_equal(normalize_matrix(graph.adjacency).toarray()[1 + n_s : -1], A[1 + n_s : -1])
    return graph


@pytest.mark.parametrize("rotation", [0, 1, 2])
def test_reported_statistics_on_known_correlations(ablation_truth, rotation):
    """validate_graph's node-to-logit log-log Pearsons are +1, -1 and 0 for predictors built as
    KL^2, 1/KL and a log-orthogonal vector of the independently computed ablation KLs (each predictor
    takes every role across the rotations), and its feature-to-feature Spearman is +1, -1 or 0 for
    graph influences that rank the pairs as the independently computed ablation effects do, in
    reverse, or uncorrelated in rank; the report's summary quotes the same numbers."""
    model, tc, state, sources, targets, kl, effect = ablation_truth
    assert len(sources) > 20 and len(effect) > 300 and kl.min() > 0
    built = {1.0: kl**2, -1.0: 1 / kl, 0.0: _loglog_uncorrelated(kl)}
    roles = np.roll([1.0, -1.0, 0.0], rotation)
    predictors = dict(zip(("influence", "activation", "direct_logit_edge"), (built[r] for r in roles)))

    pairs = list(effect)
    eff = np.array([effect[k] for k in pairs])
    dense = np.unique(eff, return_inverse=True)[1] + 1  # 1..K, ties shared
    ff_rho = [1.0, -1.0, 0.0][rotation]
    if ff_rho == 1.0:
        level = dense
    elif ff_rho == -1.0:
        level = dense.max() + 1 - dense
    else:
        level = _rank_uncorrelated(eff)
    # multiples of 2^-20 well below 1 / n_sources: every target row sums to exactly 1 with its filler
    weight = dict(zip(pairs, level * 2.0**-20))
    graph = _synthetic_graph(state, sources, targets, *predictors.values(), weight)

    cfg = ValidateConfig(max_features=len(sources), windows=(1, 99), n_perturbations=0)
    res = validate_graph(model, tc, graph, cfg)
    n2l, ff = res["node_to_logit"], res["feature_to_feature"]
    assert n2l["n_features"] == len(sources)
    np.testing.assert_allclose(np.sort(n2l["_scatter"]["kl"]), np.sort(kl), rtol=1e-6)
    for name, r in zip(predictors, roles):
        for w in ("1", "99"):
            assert n2l["windows"][w][name] == pytest.approx(r, abs=1e-5), (name, w)
        assert n2l["mean"][name] == pytest.approx(r, abs=1e-5), name
    assert ff["n_pairs"] == len(pairs) and ff["n_sources"] == len(sources)
    np.testing.assert_allclose(np.sort(ff["_scatter"]["effect"]), np.sort(eff), rtol=1e-9, atol=1e-12)
    assert ff["spearman"] == pytest.approx(ff_rho, abs=1e-9)

    summary = summarize_results([res])
    assert summary["feature_to_feature_spearman_mean"] == pytest.approx(ff_rho, abs=1e-9)
    assert summary["feature_to_feature_spearman_pooled"] == pytest.approx(ff_rho, abs=1e-9)
    for name, r in zip(predictors, roles):
        assert summary["node_to_logit_loglog_pearson"][name] == pytest.approx(r, abs=1e-5)


def test_validate_graph_and_report(tmp_path):
    """End to end on a real attribution graph: the graph predicts its ablations (measured on this
    CLT: log-log Pearson 0.94 influence, 0.91 direct logit edge, Spearman 0.73; over PLT and CLT
    with model seeds 0-2 the lowest were 0.80, 0.79 and 0.69), and the report quotes the numbers."""
    model = tiny_model("gpt2", n_layers=3)
    tc = tiny_transcoders(model, "clt")
    graph = attribute(model, tc, TOKENS, exclude_bos=False)
    cfg = ValidateConfig(max_features=30, n_perturbations=3, windows=(0, 99))
    res = validate_graph(model, tc, graph, cfg)
    n2l = res["node_to_logit"]
    assert n2l["n_features"] == 30 and set(n2l["windows"]) == {"0", "99"}
    assert n2l["mean"]["influence"] > 0.75 and n2l["mean"]["direct_logit_edge"] > 0.75
    assert -1 <= n2l["mean"]["activation"] <= 1
    assert np.all(np.array(n2l["_scatter"]["kl"]) >= 0) and max(n2l["_scatter"]["kl"]) > 0
    ff = res["feature_to_feature"]
    assert ff["n_pairs"] > 50 and ff["spearman"] > 0.6
    # effects are real: ablating a source changes some downstream activation
    assert max(ff["_scatter"]["effect"]) > 0
    for v in res["faithfulness"].values():
        assert all(-1 - 1e-9 <= c <= 1 + 1e-9 for c in v["cosine"] if not math.isnan(c))
    summary = write_report([res, res], ["a", "b"], tmp_path, stem="validate")
    for f in (
        "validate.json",
        "validate.md",
        "validate_node_to_logit.png",
        "validate_feature_to_feature.png",
        "validate_faithfulness.png",
    ):
        assert (tmp_path / f).stat().st_size > 0
    assert json.loads((tmp_path / "validate.json").read_text())["summary"]["n_graphs"] == 2
    assert summary["feature_to_feature_spearman_mean"] == pytest.approx(ff["spearman"])


@pytest.mark.slow
@pytest.mark.bundled("default", "default-plt")
def test_validate_cli_on_the_bundled_model(tmp_path):
    """`attrgraph build` then `attrgraph validate` on the bundled model and its PLT."""
    from attrgraph.cli import main

    path = tmp_path / "g.h5"
    prompt = "When Mary and John went to the store , John gave a drink to"
    assert main(["build", prompt, "-o", str(path), "--transcoders", "default-plt", "--json"]) == 0
    out = tmp_path / "report"
    assert (
        main(["validate", str(path), "-o", str(out), "--max-features", "10", "--n-perturbations", "2"]) == 0
    )
    summary = json.loads((out / "validate.json").read_text())["summary"]
    assert summary["n_graphs"] == 1 and (out / "validate_faithfulness.png").exists()


def test_validate_a_graph_with_attention_features():
    """MLP-site features are ablated (attention outputs held inside the range); a graph with
    attention features needs the sets that built it."""
    from tests.attrgraph.ag_helpers import tiny_attn_saes

    model = tiny_model("gpt2", n_layers=3)
    sets = [tiny_transcoders(model, "plt"), tiny_attn_saes(model)]
    graph = attribute(model, sets, TOKENS, exclude_bos=False)
    cfg = ValidateConfig(max_features=20, n_perturbations=2, windows=(0, 99))
    res = validate_graph(model, sets, graph, cfg)
    assert res["node_to_logit"]["n_features"] == 20 and res["feature_to_feature"]["n_pairs"] > 10
    assert res["node_to_logit"]["mean"]["influence"] > 0.5
    with pytest.raises(ValidationError, match="built with an attention SAE set, and none was passed"):
        validate_graph(model, sets[0], graph, cfg)
    with pytest.raises(ValidationError, match="built without an attention SAE set, and one was passed"):
        validate_graph(model, sets, attribute(model, sets[0], TOKENS, exclude_bos=False), cfg)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
@pytest.mark.parametrize("gain", [False, True])
def test_encoder_perturbation_raises_the_pre_activation_by_delta(arch, gain):
    """Faithfulness step 3 (a): the vector added at `hook_resid_mid` raises its feature's pre-activation
    by `delta` with ln2's scale frozen, read through the frozen model and the set's own `encode_layer`;
    also for a set whose encoder is not a plain `W_enc` (reading `W_enc` it moved by delta / g)."""
    from attrgraph.analysis.validate import encoder_perturbation
    from attrgraph.engine.frozen import frozen_forward
    from tests.attrgraph.ag_helpers import gain_encoder_transcoders
    from transcoders.sites import MLP_INPUT, mlp_input

    model = tiny_model(arch, n_layers=3)
    tc = gain_encoder_transcoders(model) if gain else tiny_transcoders(model, "plt")
    state = ReplacementModel(model, tc).run(torch.tensor(TOKENS), exclude_bos=False)
    for l, p, f in ((1, 4, 3), (2, 7, 11)):
        vec = encoder_perturbation(model, tc, state, l, p, f, 0.7)

        def add(x, hook, vec=vec, p=p):
            x = x.clone()
            x[:, p] += vec
            return x

        h = []
        for hooks in ([], [(f"blocks.{l}.hook_resid_mid", add)]):
            name = MLP_INPUT.format(layer=l)
            with (
                torch.no_grad(),
                frozen_forward(model, tc.cfg, state.frozen, capture=[name], hooks=hooks) as got,
            ):
                model(state.tokens[None])
                h.append(float(tc.encode_layer(mlp_input(model, got, l)[0, p].to(tc.dtype), l)[f]))
        assert h[1] - h[0] == pytest.approx(0.7, rel=1e-5)

"""Global (virtual) weights: the exactness contract against the attribution engine's edges, and
hand-checkable properties. Expected values come from the engine (a different code path: a backward
through the frozen TransformerLens model) or from brute-force products of the model's weights."""

import numpy as np
import pytest
import torch

from attrgraph.analysis.global_weights import GlobalWeights, norm_scales_at, virtual_weights
from attrgraph.engine.attribute import attribute
from attrgraph.engine.replacement import ReplacementModel
from attrgraph.errors import OptionError
from tests.attrgraph.ag_helpers import (
    ARCHS,
    BLOCK_ARCHS,
    gain_encoder_transcoders,
    tiny_attn_saes,
    tiny_model,
    tiny_transcoders,
)

TOKENS = torch.tensor([3, 7, 1, 12, 5])


def _graph(arch, kind):
    """kind "gain": a PLT whose encoder is not a plain W_enc (`gain_encoder_transcoders`)."""
    model = tiny_model(arch, n_layers=3)
    mlp = gain_encoder_transcoders(model) if kind == "gain" else tiny_transcoders(model, kind)
    sets = [mlp, tiny_attn_saes(model)]
    rm = ReplacementModel(model, sets)
    graph = attribute(model, rm, TOKENS, exclude_bos=False, max_n_logits=3)
    return model, sets, rm, graph


def _edges_on_residual_path(graph, position_rule):
    """(target, source) pairs of feature nodes where the residual stream is the only path (an
    attention set replaces every attention output; the sets have no skip): MLP targets at the
    source's position, attention targets at position 0 (every head's pattern there is 1)."""
    n = graph.nodes
    feats = np.nonzero(n.kind == "feature")[0]
    out = []
    for t in feats:
        for s in feats:
            if s >= t or n.position[s] != n.position[t]:
                continue
            if n.site[t] == "attn" and not position_rule(n.position[t]):
                continue
            out.append((t, s))
    return out


@pytest.mark.parametrize(
    "arch, kind",
    [(a, k) for a in ARCHS + BLOCK_ARCHS for k in ("plt", "clt")] + [("gpt2", "gain"), ("gemma2", "gain")],
)
def test_edge_equals_activation_times_virtual_weight_at_frozen_scales(arch, kind, one_torch_thread):
    model, sets, rm, graph = _graph(arch, kind)
    state = rm.run(TOKENS, exclude_bos=False)
    A = graph.adjacency.toarray() if hasattr(graph.adjacency, "toarray") else graph.adjacency
    n = graph.nodes
    pairs = _edges_on_residual_path(graph, lambda p: p == 0)
    by_pos = {p: GlobalWeights(model, sets, norm_scales_at(state, p)) for p in range(len(TOKENS))}
    checked = {"mlp": 0, "attn": 0}
    worst = 0.0
    for t, s in pairs:
        gw = by_pos[int(n.position[t])]
        v = gw.virtual_weight(
            (str(n.site[s]), int(n.layer[s]), int(n.feature[s])),
            (str(n.site[t]), int(n.layer[t]), int(n.feature[t])),
        )
        expected = float(n.activation[s]) * v
        scale = np.abs(A[t]).max() + 1e-12
        worst = max(worst, abs(A[t, s] - expected) / scale)
        checked[str(n.site[t])] += 1
    assert checked["mlp"] > 20 and checked["attn"] > 0, checked
    assert worst < 1e-6, worst


@pytest.mark.parametrize("arch", ["gpt2", "gemma2"])
def test_logit_edges_of_last_position_features_equal_demeaned_vocab_weights(arch, one_torch_thread):
    model, sets, rm, graph = _graph(arch, "clt")
    state = rm.run(TOKENS, exclude_bos=False)
    last = len(TOKENS) - 1
    gw = GlobalWeights(model, sets, norm_scales_at(state, last))
    n = graph.nodes
    A = graph.adjacency.toarray()
    feats = np.nonzero((n.kind == "feature") & (n.position == last))[0]
    logits = np.nonzero(n.kind == "logit")[0]
    assert len(feats) > 5 and len(logits) > 0
    for s in feats:
        w = gw.vocab_weights(str(n.site[s]), int(n.layer[s]), int(n.feature[s])).numpy()
        w = w - w.mean()  # the graph's logit nodes are demeaned logits
        for t in logits:
            expected = float(n.activation[s]) * w[int(n.token[t])]
            assert A[t, s] == pytest.approx(expected, rel=1e-6, abs=1e-9 * np.abs(A[t]).max())


def test_clt_decoders_into_every_layer_between_add_up():
    """Brute force with the raw weights (no scales): a CLT feature of layer 0 into an MLP feature of
    layer 2 is (dec^0 + dec^1) . P(w_ln2 * enc), gpt2 (LayerNorm: P centers)."""
    model = tiny_model("gpt2", n_layers=3)
    tc = tiny_transcoders(model, "clt")
    gw = GlobalWeights(model, tc)
    dec = tc.W_dec[0][4].detach()
    enc = tc.W_enc[2][:, 9].detach() * model.blocks[2].ln2.w.detach()
    enc = enc - enc.mean()
    expected = float((dec[0] + dec[1]) @ enc)
    assert gw.virtual_weight(("mlp", 0, 4), ("mlp", 2, 9)) == pytest.approx(expected, rel=1e-12)
    out = virtual_weights(model, tc, ("mlp", 0, 4))
    row = (out.layer == 2) & (out.feature == 9)
    assert out.weight[row][0] == pytest.approx(expected, rel=1e-12)
    # no feature of its own layer, nor an earlier one, is reached
    assert set(out.layer.tolist()) == {1, 2}
    assert gw.virtual_weight(("mlp", 2, 9), ("mlp", 0, 4)) == 0.0


def test_input_and_output_forms_agree_and_top_k_is_the_strongest():
    model = tiny_model("llama", n_layers=3)
    sets = [tiny_transcoders(model, "clt"), tiny_attn_saes(model)]
    gw = GlobalWeights(model, sets, {"blocks.2.ln2.hook_scale": 3.0})
    inp = gw.input_weights("mlp", 2, 5)
    for s, l, f, w in zip(inp.site, inp.layer, inp.feature, inp.weight):
        if f in (0, 7):
            assert gw.output_weights(s, int(l), int(f)).weight[
                (gw.output_weights(s, int(l), int(f)).layer == 2)
                & (gw.output_weights(s, int(l), int(f)).site == "mlp")
                & (gw.output_weights(s, int(l), int(f)).feature == 5)
            ][0] == pytest.approx(w, rel=1e-12)
    top = virtual_weights(model, sets, ("mlp", 2, 5), direction="input", top_k=10)
    assert len(top) == 10
    assert np.abs(top.weight).min() >= np.sort(np.abs(inp.weight))[-10]
    # input sources: attention layers 0-2 and MLP layers 0-1, every feature of each
    assert len(inp) == 3 * sets[1].cfg.d_sae + 2 * sets[0].cfg.d_sae


def test_bad_requests_raise_one_line_errors():
    model = tiny_model("gpt2", n_layers=2)
    tc = tiny_transcoders(model, "plt")
    with pytest.raises(OptionError, match="attention set"):
        virtual_weights(model, tc, ("attn", 0, 1))
    with pytest.raises(OptionError, match="layer"):
        virtual_weights(model, tc, ("mlp", 5, 1))
    with pytest.raises(OptionError, match="direction"):
        virtual_weights(model, tc, ("mlp", 0, 1), direction="both")
    with pytest.raises(OptionError, match="features per layer"):
        virtual_weights(model, tc, ("mlp", 0, 10_000))


def test_feature_connections_json_is_plain_and_marks_used_pairs():
    import json

    from attrgraph.analysis.global_weights import feature_connections_json

    model = tiny_model("gpt2", n_layers=3)
    sets = [tiny_transcoders(model, "clt"), tiny_attn_saes(model)]
    gw = GlobalWeights(model, sets)
    got = feature_connections_json(gw, ("mlp", 1, 3), k=4, n_both=lambda s, t: int(s[2] % 2 == 0))
    json.dumps(got)
    assert len(got["input"]) == 4 and len(got["output"]) == 4
    for r in got["input"]:
        assert r["used"] == (r["feature"] % 2 == 0)
    assert all(r["used"] is False for r in got["output"])  # the source (feature 3) is odd
    strongest = gw.input_weights("mlp", 1, 3).top(1)
    assert got["input"][0]["weight"] == pytest.approx(float(strongest.weight[0]))

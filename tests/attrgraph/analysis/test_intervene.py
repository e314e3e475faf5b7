"""Interventions: guaranteed direct effects, iterative patching as the replacement's fixed point,
supernode keys, steered generation, and the errors a user sees."""

import numpy as np
import pytest
import torch

from attrgraph.analysis.intervene import Add, Scale, SetTo, attn_feature, error_node, generate, intervene
from attrgraph.engine.attribute import attribute
from attrgraph.engine.replacement import ReplacementModel
from attrgraph.errors import InterventionError
from attrgraph.graph.supernodes import supernode
from tests.attrgraph.ag_helpers import tiny_attn_saes, tiny_model, tiny_transcoders

TOKENS = [3, 17, 5, 9, 17, 5, 22, 8]


def _setup(kind="plt", skip=False, n_layers=3):
    model = tiny_model("gpt2", n_layers=n_layers)
    tc = tiny_transcoders(model, kind, skip)
    return model, tc


@pytest.mark.parametrize("kind,skip", [("plt", False), ("plt", True), ("clt", False)])
def test_constrained_patching_reproduces_direct_edges(kind, skip):
    """Ablating a source with constrained patching over [l_s, l_t] under frozen attention changes the
    target's pre-activation by exactly minus the graph edge (the appendix's guaranteed effects)."""
    model, tc = _setup(kind, skip)
    graph = attribute(model, tc, TOKENS, exclude_bos=False)
    n, A = graph.nodes, graph.dense()
    clean = intervene(model, tc, TOKENS, {})
    rng = np.random.default_rng(0)
    feats = np.flatnonzero(n.kind == "feature")
    targets = [t for t in feats if n.layer[t] == 2]
    checked = 0
    for t in rng.choice(targets, 4, replace=False):
        lt, pt, ft = int(n.layer[t]), int(n.position[t]), int(n.feature[t])
        sources = [s for s in np.flatnonzero(A[t]) if n.kind[s] in ("feature", "error") and n.layer[s] < lt]
        for s in rng.choice(sources, min(6, len(sources)), replace=False):
            ls, ps = int(n.layer[s]), int(n.position[s])
            key = (ls, ps, int(n.feature[s])) if n.kind[s] == "feature" else error_node(ls, ps)
            out = intervene(model, tc, TOKENS, {key: 0.0}, layers=(ls, lt))
            change = float(out.pre_acts[lt, pt, ft] - clean.pre_acts[lt, pt, ft])
            assert change == pytest.approx(-A[t, s], rel=1e-6, abs=1e-9)
            checked += 1
    assert checked >= 8


def test_no_intervention_reproduces_the_model():
    model, tc = _setup("clt", True)
    logits = model(torch.tensor([TOKENS]))[0]
    for mode in ("constrained", "iterative"):
        for freeze in (True, False):
            out = intervene(model, tc, TOKENS, {}, mode=mode, layers=(0, 2), freeze_attention=freeze)
            torch.testing.assert_close(out.logits, logits, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(out.probs.sum(-1), torch.ones(len(TOKENS), dtype=out.probs.dtype))


@pytest.mark.parametrize("kind,skip", [("plt", True), ("clt", False)])
def test_iterative_patching_is_the_replacement_fixed_point(kind, skip):
    """Iterative patching over every layer equals the frozen local replacement model with features
    recomputed layer by layer (n_layers rounds of `ReplacementModel.forward`)."""
    model, tc = _setup(kind, skip)
    edits = {(0, 2, 3): Scale(-2.0), (1, 5, 7): SetTo(1.5), error_node(0, 4): Scale(0.5)}
    out = intervene(model, tc, TOKENS, edits, mode="iterative", layers=(0, 2))

    rm = ReplacementModel(model, tc)
    state = rm.run(torch.tensor(TOKENS), exclude_bos=False)
    errors = state.errors.clone()
    errors[0, 4] *= 0.5

    def with_edits(acts):
        acts = acts.clone()
        acts[0, 2, 3] *= -2.0
        acts[1, 5, 7] = 1.5
        return acts

    acts = with_edits(state.acts)
    for _ in range(model.cfg.n_layers):
        ref = rm.forward(state, acts=acts, errors=errors)
        acts = with_edits(ref.pre_acts.transpose(0, 1).relu().transpose(0, 1))
    torch.testing.assert_close(out.logits, ref.logits, rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(out.acts, acts, rtol=1e-8, atol=1e-8)
    # and the knock-on effects are real: constrained patching over the same range differs
    con = intervene(model, tc, TOKENS, edits, mode="constrained", layers=(0, 2))
    assert (con.logits - out.logits).abs().max() > 1e-4


def test_constrained_and_iterative_agree_on_a_single_layer():
    model, tc = _setup("plt", True)
    edits = {(1, 3, 4): Add(0.7), (1, None, 2): Scale(0.0)}
    a = intervene(model, tc, TOKENS, edits, mode="constrained", layers=(1, 1))
    b = intervene(model, tc, TOKENS, edits, mode="iterative", layers=(1, 1))
    torch.testing.assert_close(a.logits, b.logits, rtol=1e-9, atol=1e-9)
    assert torch.all(a.acts[1, :, 2] == 0)


def test_supernode_key_equals_its_members():
    model, tc = _setup("plt")
    graph = attribute(model, tc, TOKENS, exclude_bos=False)
    feats = np.flatnonzero(graph.nodes.kind == "feature")[:3]
    sn = supernode(graph, "group", feats)
    by_sn = intervene(model, tc, TOKENS, {sn: Scale(-1.0)})
    keys = {
        (int(graph.nodes.layer[i]), int(graph.nodes.position[i]), int(graph.nodes.feature[i])): Scale(-1.0)
        for i in feats
    }
    by_keys = intervene(model, tc, TOKENS, keys)
    torch.testing.assert_close(by_sn.logits, by_keys.logits)
    assert (by_sn.logits - intervene(model, tc, TOKENS, {}).logits).abs().max() > 1e-6


def test_steered_generation():
    """Greedy steering equals a plain forward with the edit written into the MLP by hand: setting
    features 0-5 of layer 2 to 20 everywhere adds `(20 - a) @ W_dec` to the last MLP's output
    (iterative patching of the last layer, attention live, errors kept)."""
    model, tc = _setup("plt")
    steer = {(2, None, f): SetTo(20.0) for f in range(6)}

    def add_the_edit(mlp, inputs, out):
        acts = (inputs[0] @ tc.W_enc[2] + tc.b_enc[2]).relu()
        return out + (20.0 - acts[..., :6]) @ tc.W_dec[2][:6]

    def greedy(n_steered, n_tokens=5):
        seq = TOKENS[:4]
        for i in range(n_tokens):
            handle = model.blocks[2].mlp.register_forward_hook(add_the_edit) if i < n_steered else None
            with torch.no_grad():
                seq = seq + [int(model(torch.tensor([seq]))[0, -1].argmax())]
            if handle is not None:
                handle.remove()
        return seq

    # the steered forward itself, at every position, to float64 precision
    handle = model.blocks[2].mlp.register_forward_hook(add_the_edit)
    with torch.no_grad():
        want = model(torch.tensor([TOKENS]))[0]
    handle.remove()
    got = intervene(model, tc, TOKENS, steer, mode="iterative", freeze_attention=False).logits
    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)

    plain, steered, held_two = greedy(0), greedy(5), greedy(2)
    assert plain != steered and held_two not in (plain, steered)  # the edit changes what is generated
    assert generate(model, tc, TOKENS[:4], {}, n_tokens=5).tolist() == plain
    assert generate(model, tc, TOKENS[:4], steer, n_tokens=5).tolist() == steered
    assert generate(model, tc, TOKENS[:4], steer, n_tokens=5, hold=2).tolist() == held_two
    assert generate(model, tc, TOKENS[:4], steer, n_tokens=5, hold=0).tolist() == plain
    # a vanishing temperature samples the argmax
    assert generate(model, tc, TOKENS[:4], steer, n_tokens=5, temperature=1e-4, seed=3).tolist() == steered


def test_sampling_follows_the_tempered_softmax():
    """At temperature 0.5 the first new token's frequencies over 200 seeds match softmax(logits / 0.5)
    (top token p = 0.72 there, against 0.24 at temperature 1), within 0.1 (three standard errors)."""
    model, tc = _setup("plt")
    with torch.no_grad():
        p = torch.softmax(model(torch.tensor([TOKENS[:4]]))[0, -1].double() / 0.5, -1)
    n = 200
    counts = torch.zeros_like(p)
    for seed in range(n):
        counts[int(generate(model, tc, TOKENS[:4], {}, n_tokens=1, temperature=0.5, seed=seed)[-1])] += 1
    assert (counts / n - p).abs().max() <= 0.1


def test_errors_are_specific():
    model, tc = _setup("plt")
    with pytest.raises(InterventionError, match="outside layers"):
        intervene(model, tc, TOKENS, {(0, 1, 1): 0.0}, layers=(1, 2))
    with pytest.raises(InterventionError, match="vector"):
        intervene(model, tc, TOKENS, {error_node(0, 1): 3.0})
    with pytest.raises(InterventionError, match="feature 999"):
        intervene(model, tc, TOKENS, {(0, 1, 999): 0.0})
    with pytest.raises(InterventionError, match="not a"):
        intervene(model, tc, TOKENS, {"L0F1": 0.0})
    with pytest.raises(InterventionError, match="mode"):
        intervene(model, tc, TOKENS, {}, mode="sideways")


@pytest.mark.parametrize("arch", ["gpt2", "gemma2"])
def test_constrained_patching_reproduces_direct_edges_with_attention_features(arch):
    """With [mlp_set, attn_set]: ablating any feature or error of either site over [l_s, l_t]
    changes a target of either site by minus its graph edge (attention outputs in the range are
    patched like the MLP outputs)."""
    model = tiny_model(arch, n_layers=3)
    sets = [tiny_transcoders(model, "plt", True), tiny_attn_saes(model)]
    graph = attribute(model, sets, TOKENS, exclude_bos=False)
    n, A = graph.nodes, graph.dense()
    clean = intervene(model, sets, TOKENS, {})
    torch.testing.assert_close(clean.logits, model(torch.tensor([TOKENS]))[0], rtol=1e-9, atol=1e-9)
    rng = np.random.default_rng(0)
    rank = 2 * n.layer + (n.site != "attn")
    targets = np.flatnonzero((n.kind == "feature") & (n.layer == 2))
    seen = set()
    for t in rng.choice(targets, 6, replace=False):
        lt, pt, ft, st = int(n.layer[t]), int(n.position[t]), int(n.feature[t]), n.site[t]
        sources = [s for s in np.flatnonzero(A[t]) if n.kind[s] in ("feature", "error") and rank[s] < rank[t]]
        for s in rng.choice(sources, min(6, len(sources)), replace=False):
            ls, ps, ss = int(n.layer[s]), int(n.position[s]), str(n.site[s])
            if n.kind[s] == "error":
                key = error_node(ls, ps, ss)
            else:
                key = attn_feature(ls, ps, int(n.feature[s])) if ss == "attn" else (ls, ps, int(n.feature[s]))
            out = intervene(model, sets, TOKENS, {key: 0.0}, layers=(ls, lt))
            after, before = (o.attn_pre_acts if st == "attn" else o.pre_acts for o in (out, clean))
            change = float(after[lt, pt, ft] - before[lt, pt, ft])
            assert change == pytest.approx(-A[t, s], rel=1e-6, abs=1e-9)
            seen.add((str(n.kind[s]), ss, st))
    assert {("feature", "attn", "mlp"), ("feature", "attn", "attn")} <= seen
    assert {("error", "attn", "mlp"), ("error", "attn", "attn")} & seen


def test_steering_an_attention_feature_iteratively():
    """Iterative patching with an attention edit equals the frozen replacement model (both sites'
    features recomputed layer by layer) with that edit."""
    model = tiny_model("llama", n_layers=2)
    sets = [tiny_transcoders(model, "plt"), tiny_attn_saes(model)]
    rm = ReplacementModel(model, sets)
    state = rm.run(torch.tensor(TOKENS), exclude_bos=False)
    l = 1
    p, f = (state.attn_acts[l] > 0).nonzero()[0].tolist()
    out = intervene(model, rm, TOKENS, {attn_feature(l, p, f): Scale(3.0)}, mode="iterative", layers=(0, 1))
    acts, attn_acts = state.acts.clone(), state.attn_acts.clone()
    attn_acts[l, p, f] *= 3.0
    ref = rm.forward(state, acts=acts, attn_acts=attn_acts)
    for _ in range(2 * model.cfg.n_layers):
        acts = ref.pre_acts.transpose(0, 1).relu().transpose(0, 1)
        attn_acts = ref.attn_pre_acts.transpose(0, 1).relu().transpose(0, 1)
        attn_acts[l, p, f] *= 3.0
        ref = rm.forward(state, acts=acts, attn_acts=attn_acts)
    torch.testing.assert_close(out.logits, ref.logits, rtol=1e-8, atol=1e-8)
    assert (out.logits - model(torch.tensor([TOKENS]))[0]).abs().max() > 1e-4
    with pytest.raises(InterventionError, match="no attention set"):
        intervene(model, sets[0], TOKENS, {attn_feature(0, 1, 2): 0.0})
    with pytest.raises(InterventionError, match="attention SAEs have 20 per layer"):
        intervene(model, rm, TOKENS, {attn_feature(0, 1, 20): 0.0})

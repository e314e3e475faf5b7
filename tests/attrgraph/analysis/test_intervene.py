"""Interventions: guaranteed direct effects, iterative patching as the replacement's fixed point,
supernode keys, steered generation, and the errors a user sees."""

import numpy as np
import pytest
import torch

from attrgraph.analysis.intervene import Add, Scale, SetTo, error_node, generate, intervene
from attrgraph.engine.attribute import attribute
from attrgraph.engine.replacement import ReplacementModel
from attrgraph.errors import InterventionError
from attrgraph.graph.supernodes import supernode
from tests.attrgraph.ag_helpers import tiny_model, tiny_transcoders
from transcoders.activations import apply_activation

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
        acts = with_edits(apply_activation(ref.pre_acts.transpose(0, 1), "relu").transpose(0, 1))
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
    model, tc = _setup("plt")
    plain = generate(model, tc, TOKENS[:4], {}, n_tokens=5)
    ref = TOKENS[:4]
    for _ in range(5):
        ref = ref + [int(model(torch.tensor([ref]))[0, -1].argmax())]
    assert plain.tolist() == ref
    steer = {(2, None, f): SetTo(20.0) for f in range(6)}
    held = generate(model, tc, TOKENS[:4], steer, n_tokens=5)
    assert held.tolist() != ref
    assert generate(model, tc, TOKENS[:4], steer, n_tokens=5, hold=0).tolist() == ref
    s1 = generate(model, tc, TOKENS[:4], steer, n_tokens=5, temperature=1.0, seed=3)
    assert s1.tolist() == generate(model, tc, TOKENS[:4], steer, n_tokens=5, temperature=1.0, seed=3).tolist()


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

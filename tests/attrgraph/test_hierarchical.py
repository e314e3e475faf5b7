"""Hierarchical attribution: Theorem 3.1 to 1e-5, agreement with the same algorithm on the full
graph, a finite-difference check of leaf attributions, and the roots it accepts."""

import math

import numpy as np
import pytest
import torch
from ag_helpers import tiny_model, tiny_transcoders

from attrgraph.attribute import attribute
from attrgraph.errors import TargetError
from attrgraph.hierarchical import attribute_hierarchical, hierarchical_attribution, result_from_graph
from attrgraph.replacement import ReplacementModel
from attrgraph.store import load_graph, save_graph
from attrgraph.targets import logit_difference

TOKENS = torch.tensor([0, 5, 9, 3, 17, 22, 5, 9, 31, 2])


@pytest.fixture(scope="module", params=[("plt", True), ("clt", False)])
def setup(request):
    kind, skip = request.param
    model = tiny_model("gpt2", n_layers=3)
    rm = ReplacementModel(model, tiny_transcoders(model, kind, skip))
    full = attribute(model, rm, TOKENS, exclude_bos=True, max_n_logits=1)
    return model, rm, full


def independent_bias_attribution(rm, g, root_vector=None):
    """Leaves of kind (c) from biases measured by the frozen model with every source set to zero
    (the exactness contract's `bias_t`), not from `value - sum of edges`."""
    state = rm.run(TOKENS, exclude_bos=True)
    z = rm.forward(
        state, torch.zeros_like(state.acts), torch.zeros_like(state.errors), torch.zeros_like(state.embed)
    )
    n, attr = g.nodes, np.asarray(g.meta["attribution"])
    f = n.kind == "feature"
    bias = z.pre_acts[n.layer[f], n.position[f], n.feature[f]].double().numpy()
    grad = attr[f] / n.activation[f].astype(np.float64)
    root = g.meta["root_index"]
    if n.kind[root] == "feature":
        grad[np.flatnonzero(f) == root] = 1.0
        return float(grad @ bias)
    last = z.logits[-1].double()
    return float(grad @ bias + last @ root_vector.double())


def theorem(g, rm=None, root_vector=None):
    """root value, leaves (embeddings + errors + bias), detached total, from a hierarchical graph;
    with `rm`, the bias leaves come from the zero-source forward (an independent measurement)."""
    m, kinds = g.meta, g.nodes.kind
    attr = np.asarray(m["attribution"])
    bias = m["bias_attribution"] if rm is None else independent_bias_attribution(rm, g, root_vector)
    if rm is not None:
        assert bias == pytest.approx(m["bias_attribution"], rel=1e-6, abs=1e-9)
    leaves = attr[(kinds == "embedding") | (kinds == "error")].sum() + bias
    return m["root_value"], leaves, m["detached_attribution"]


def demeaned(model, tok):
    v = torch.full((model.cfg.d_vocab,), -1.0 / model.cfg.d_vocab, dtype=torch.float64)
    v[tok] += 1
    return v


def test_theorem_3_1_without_detaching(setup):
    model, rm, full = setup
    g = attribute_hierarchical(model, rm, TOKENS, tau=-math.inf, exclude_bos=True)
    root, leaves, detached = theorem(g, rm, demeaned(model, int(g.logit_tokens[0])))
    assert detached == 0.0 and abs(root) > 0.1
    assert abs(leaves - root) <= 1e-5 * abs(root)
    # the root is the model's demeaned logit of its most likely token
    last = rm.run(TOKENS, exclude_bos=True).logits[-1].double()
    assert root == pytest.approx(float(last.max() - last.mean()), rel=1e-9)


@pytest.mark.parametrize("quantile", [0.5, 0.9])
def test_theorem_3_1_with_detaching_and_graph_version(setup, quantile):
    model, rm, full = setup
    everything = hierarchical_attribution(full, -math.inf)
    feats = full.nodes.kind == "feature"
    tau = float(np.quantile(everything.attribution[feats], quantile))
    g = attribute_hierarchical(model, rm, TOKENS, tau=tau, exclude_bos=True)
    root, leaves, detached = theorem(g, rm, demeaned(model, int(g.logit_tokens[0])))
    assert g.meta["n_detached"] > 0 and detached != 0.0
    assert abs(leaves + detached - root) <= 1e-5 * abs(root)
    assert g.n_features < full.n_features
    # the same algorithm on the full graph keeps the same features with the same attributions
    ref = hierarchical_attribution(full, tau)
    kept = ref.kept & feats
    key = lambda n, m: set(zip(n.layer[m], n.position[m], n.feature[m]))  # noqa: E731
    assert key(full.nodes, kept) == key(g.nodes, g.nodes.kind == "feature")
    np.testing.assert_allclose(
        np.asarray(g.meta["attribution"])[g.nodes.kind == "feature"],
        ref.attribution[kept],
        rtol=1e-6,
        atol=1e-9,
    )
    assert ref.detached_attribution == pytest.approx(detached, rel=1e-6)
    assert ref.leaf_sum(full.nodes.kind) == pytest.approx(root - detached, rel=1e-5)
    # every kept feature passed the threshold; the graph's rows are exactly the full graph's rows
    assert (np.asarray(g.meta["attribution"])[g.nodes.kind == "feature"] >= tau).all()


def test_hierarchical_keeps_more_than_standard_at_equal_size_is_measurable(setup):
    """Standard attribution = one pass, then threshold; both obey the identity on their kept set."""
    _, _, full = setup
    one = hierarchical_attribution(full, -math.inf)
    feats = full.nodes.kind == "feature"
    tau = float(np.quantile(one.attribution[feats], 0.8))
    standard = hierarchical_attribution(full, keep=one.attribution >= tau)
    assert abs(
        standard.leaf_sum(full.nodes.kind) + standard.detached_attribution - standard.root_value
    ) <= 1e-5 * abs(standard.root_value)


def linearized_root(rm, state, errors, embed, vec):
    """The root through the linear graph: active features follow their pre-activations (a = pre)."""
    active = state.acts > 0
    acts = state.acts.clone()
    for _ in range(rm.cfg.n_layers + 1):
        out = rm.forward(state, acts, errors, embed)
        acts = torch.where(active, out.pre_acts, torch.zeros_like(acts))
    logits = rm.forward(state, acts, errors, embed).logits[-1]
    return float(logits.double() @ vec.double())


def test_leaf_attribution_equals_finite_difference(setup):
    model, rm, _ = setup
    g = attribute_hierarchical(model, rm, TOKENS, tau=-math.inf, exclude_bos=True)
    state = rm.run(TOKENS, exclude_bos=True)
    tok = int(g.logit_tokens[0])
    vec = torch.full((model.cfg.d_vocab,), -1.0 / model.cfg.d_vocab, dtype=torch.float64)
    vec[tok] += 1
    base = linearized_root(rm, state, state.errors, state.embed, vec)
    assert base == pytest.approx(g.meta["root_value"], rel=1e-8)
    attr, n = np.asarray(g.meta["attribution"]), g.nodes
    for i in [int(np.flatnonzero(n.kind == "error")[k]) for k in (0, 7)] + [3]:
        errors, embed = state.errors.clone(), state.embed.clone()
        l, p = int(n.layer[i]), int(n.position[i])
        if n.kind[i] == "error":
            errors[l, p] *= 2
        else:
            embed[p] *= 2
        effect = linearized_root(rm, state, errors, embed, vec) - base
        assert effect == pytest.approx(attr[i], rel=1e-6, abs=1e-9)


def test_other_roots_and_storage(setup, tmp_path):
    model, rm, full = setup
    diff = logit_difference(model, 5, 9)
    g = attribute_hierarchical(model, rm, TOKENS, tau=0.0, root=diff, exclude_bos=True)
    root, leaves, detached = theorem(g, rm, diff.vector)
    assert abs(leaves + detached - root) <= 1e-5 * max(abs(root), 1e-3)
    n = full.nodes
    top = np.flatnonzero((n.kind == "feature") & (n.layer == 2))[0]
    feat = (int(n.layer[top]), int(n.position[top]), int(n.feature[top]))
    g = attribute_hierarchical(model, rm, TOKENS, tau=-math.inf, root=feat, exclude_bos=True)
    root, leaves, detached = theorem(g, rm)
    assert root == pytest.approx(float(n.activation[top]), rel=1e-6)
    assert abs(leaves - root) <= 1e-5 * abs(root)
    assert (g.nodes.kind != "logit").all() and g.nodes.kind[g.meta["root_index"]] == "feature"
    save_graph(g, tmp_path / "h.h5")
    back = result_from_graph(load_graph(tmp_path / "h.h5"))
    assert back.root_value == pytest.approx(root) and len(back.attribution) == g.n_nodes
    with pytest.raises(TargetError, match="not active"):
        attribute_hierarchical(model, rm, TOKENS, root=(0, 0, 0), exclude_bos=True)


@pytest.mark.bundled("default", "default-plt")
def test_theorem_3_1_on_the_bundled_model():
    from attrgraph.loading import load_model
    from attrgraph.tasks import ioi_pairs
    from transcoders import load_transcoders

    model = load_model("default")
    rm = ReplacementModel(model, load_transcoders("default-plt"))
    ex = ioi_pairs(1, seed=3)[0]
    target = logit_difference(model, ex.meta["io"], ex.meta["s"])
    tokens = model.to_tokens(ex.prompt)[0]
    g = attribute_hierarchical(model, rm, tokens, tau=0.01, root=target)
    state = rm.run(tokens, exclude_bos=g.meta["exclude_bos"])
    z = rm.forward(
        state, torch.zeros_like(state.acts), torch.zeros_like(state.errors), torch.zeros_like(state.embed)
    )
    n, attr = g.nodes, np.asarray(g.meta["attribution"])
    f = n.kind == "feature"
    grad = attr[f] / n.activation[f].astype(np.float64)
    bias = grad @ z.pre_acts[n.layer[f], n.position[f], n.feature[f]].double().numpy() + float(
        z.logits[-1].double() @ target.vector.double()
    )
    leaves = attr[(n.kind == "embedding") | (n.kind == "error")].sum() + bias + g.meta["detached_attribution"]
    root = g.meta["root_value"]
    assert g.meta["n_detached"] > 0 and abs(leaves - root) <= 1e-5 * abs(root)


def test_direction_root_at_a_hook_keeps_the_identity(setup):
    from attrgraph.targets import direction

    model, rm, _ = setup
    v = torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    root = direction("blocks.1.hook_resid_post", 6, v)
    g = attribute_hierarchical(model, rm, TOKENS, tau=-math.inf, root=root, exclude_bos=True)
    root_value, leaves, detached = theorem(g)
    assert detached == 0.0 and (g.nodes.layer[g.nodes.kind == "feature"] <= 1).all()
    assert abs(leaves - root_value) <= 1e-5 * abs(root_value)


def test_attribute_dispatches_hierarchical(setup):
    from attrgraph.attribute import attribute as attribute_

    model, rm, _ = setup
    g = attribute_(model, rm, TOKENS, method="hierarchical", tau=0.05, exclude_bos=True)
    h = attribute_hierarchical(model, rm, TOKENS, tau=0.05, exclude_bos=True)
    assert g.meta["method"] == "hierarchical" and g.n_nodes == h.n_nodes
    np.testing.assert_allclose(g.meta["attribution"], h.meta["attribution"], rtol=1e-9)

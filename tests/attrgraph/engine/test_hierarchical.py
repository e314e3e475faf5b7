"""Hierarchical attribution: Theorem 3.1 with the bias leaves measured from the model's bias
parameters (not inferred from the edges, so a wrong edge or traversal breaks it), agreement with
the same algorithm on the full graph, hierarchical vs standard thresholding on a graph whose
answer is known, a finite-difference check of leaf attributions, and the roots it accepts."""

import math

import numpy as np
import pytest
import torch

from attrgraph.engine.attribute import attribute
from attrgraph.engine.hierarchical import (
    attribute_hierarchical,
    hierarchical_attribution,
    node_biases,
    result_from_graph,
)
from attrgraph.engine.replacement import ReplacementModel
from attrgraph.engine.targets import logit_difference
from attrgraph.errors import GraphError, TargetError
from attrgraph.graph.prune import normalize_matrix, prune_graph
from attrgraph.graph.store import load_graph, save_graph
from attrgraph.graph.supernodes import NodeKey
from tests.attrgraph.ag_helpers import graph_from_dense, tiny_attn_saes, tiny_model, tiny_transcoders

TOKENS = torch.tensor([0, 5, 9, 3, 17, 22, 5, 9, 31, 2])


@pytest.fixture(scope="module", params=[("plt", True), ("clt", False)])
def setup(request):
    kind, skip = request.param
    model = tiny_model("gpt2", n_layers=3)
    rm = ReplacementModel(model, tiny_transcoders(model, kind, skip))
    full = attribute(model, rm, TOKENS, exclude_bos=True, max_n_logits=1)
    return model, rm, full


def bias_through_parameters(rm, state, g, read):
    """`bias_attribution` measured from the model's own biases, independently of the edges and of
    the library's zero-source forward. The frozen replacement model is linear in its sources and
    in every additive constant jointly, so for `F = root + sum_{kept u} grad_u pre_u` (grad_u =
    attr_u / a_u) the constant part is `sum_b b . dF/db` over the bias parameters (LayerNorm, b_V,
    b_O, b_U, b_enc) plus `c . dF/dc` for the fixed MLP outputs `c`: b_dec at included positions,
    the recorded output minus skip at excluded ones. `read(logits, captured, pre)` is the root."""
    n, attr = g.nodes, np.asarray(g.meta["attribution"])
    f = np.flatnonzero(n.kind == "feature")
    root = g.meta["root_index"]
    f = f[f != root]
    lpf = (n.layer[f], n.position[f], n.feature[f])
    grad = torch.tensor(attr[f]) / state.acts[lpf].double()  # a_v in float64, not the stored float32
    named = [
        p
        for name, p in list(rm.model.named_parameters()) + list(rm.tc.named_parameters())
        if name.split(".")[-1] in ("b", "b_Q", "b_K", "b_V", "b_O", "b_U", "b_enc")
    ]
    hooks = tuple(getattr(read, "hooks", ()))
    with torch.enable_grad(), rm.frozen(state, rm.constant(state), probes=True, capture=hooks) as run:
        logits = rm.model(state.tokens[None])[0]
        x = torch.stack([r[0] for r in run.reads]).transpose(0, 1).to(rm.tc.dtype)
        pre = rm.tc.encode(x).transpose(0, 1)
        F = read(logits, {k: v[0] for k, v in run.captured.items()}, pre) + (pre[lpf].double() * grad).sum()
        grads = torch.autograd.grad(F, named + run.write_probes, allow_unused=True)
    total = sum(float((p.detach().double() * d).sum()) for p, d in zip(named, grads) if d is not None)
    k = state.n_excluded
    for l, d in enumerate(grads[len(named) :]):
        if d is None:  # a root below the last layer does not read the last writes
            continue
        total += float((rm.tc.b_dec[l].detach().double() * d[0, k:]).sum())
        total += float(((state.y_out - state.skip)[l, :k].double() * d[0, :k]).sum())
    return total


def read_logits(vector, position=-1):
    return lambda logits, captured, pre: logits[position].double() @ vector.double()


def read_feature(l, p, f):
    return lambda logits, captured, pre: pre[l, p, f].double()


def read_hook(hook, position, vector):
    read = lambda logits, captured, pre: captured[hook][position].double() @ vector.double()  # noqa: E731
    read.hooks = (hook,)
    return read


def theorem(g, rm, read, rel=1e-9):
    """Theorem 3.1 on a graph from `attribute_hierarchical`: the library's bias leaves equal the
    ones measured from the parameters; returns (root value, leaves, detached)."""
    m, kinds = g.meta, g.nodes.kind
    state = rm.run(torch.as_tensor(g.prompt_ids), exclude_bos=m["exclude_bos"], embedding=m["embedding"])
    assert m["bias_attribution"] == pytest.approx(
        bias_through_parameters(rm, state, g, read), rel=rel, abs=1e-12
    )
    attr = np.asarray(m["attribution"])
    leaves = attr[(kinds == "embedding") | (kinds == "error")].sum() + m["bias_attribution"]
    assert m["theorem_residual"] == pytest.approx(
        m["root_value"] - leaves - m["detached_attribution"], abs=1e-12
    )
    return m["root_value"], leaves, m["detached_attribution"]


def demeaned(model, tok):
    v = torch.full((model.cfg.d_vocab,), -1.0 / model.cfg.d_vocab, dtype=torch.float64)
    v[tok] += 1
    return v


def test_theorem_3_1_without_detaching(setup):
    model, rm, full = setup
    g = attribute_hierarchical(model, rm, TOKENS, tau=-math.inf, exclude_bos=True)
    root, leaves, detached = theorem(g, rm, read_logits(demeaned(model, int(g.logit_tokens[0]))))
    assert detached == 0.0 and abs(root) > 0.1 and abs(g.meta["bias_attribution"]) > 1e-3
    assert abs(leaves - root) <= 1e-9 * abs(root)
    # the root is the model's demeaned logit of its most likely token
    last = rm.run(TOKENS, exclude_bos=True).logits[-1].double()
    assert root == pytest.approx(float(last.max() - last.mean()), rel=1e-9)


def test_influence_is_the_dense_formula_and_prunes_as_computing_it(setup):
    """The influence filled in on the nodes equals `((I - A)^-1 - I)^T w` (dense inverse) and is
    prune_graph's own numbers: pruning with it gives bit for bit the graph pruning without it."""
    model, rm, full = setup
    g = attribute_hierarchical(model, rm, TOKENS, tau=0.0, exclude_bos=True)
    A = normalize_matrix(g.adjacency).toarray()
    dense = (np.linalg.inv(np.eye(g.n_nodes) - A) - np.eye(g.n_nodes)).T @ g.logit_weights()
    np.testing.assert_allclose(g.nodes.influence, dense, rtol=1e-10, atol=1e-14)
    a, b = prune_graph(g, 0.7, 0.9, influence=g.nodes.influence), prune_graph(g, 0.7, 0.9)
    assert 0 < a.n_features < g.n_features
    np.testing.assert_array_equal(a.nodes.feature, b.nodes.feature)
    np.testing.assert_array_equal(a.adjacency.toarray(), b.adjacency.toarray())
    np.testing.assert_array_equal(a.nodes.influence, b.nodes.influence)


@pytest.mark.parametrize("quantile", [0.5, 0.9])
def test_theorem_3_1_with_detaching_and_graph_version(setup, quantile):
    model, rm, full = setup
    bias = node_biases(rm, full)
    everything = hierarchical_attribution(full, -math.inf, bias=bias)
    kinds = full.nodes.kind
    assert abs(everything.theorem_residual(kinds)) <= 1e-5 * abs(everything.root_value)  # float32 edges
    feats = kinds == "feature"
    tau = float(np.quantile(everything.attribution[feats], quantile))
    g = attribute_hierarchical(model, rm, TOKENS, tau=tau, exclude_bos=True)
    root, leaves, detached = theorem(g, rm, read_logits(demeaned(model, int(g.logit_tokens[0]))))
    assert abs(leaves + detached - root) <= 1e-9 * abs(root)
    assert g.meta["n_detached"] > 0 and abs(detached) > 1e-3
    assert g.n_features < full.n_features
    # the same algorithm on the full graph keeps the same features with the same attributions
    ref = hierarchical_attribution(full, tau, bias=bias)
    kept = ref.kept & feats
    key = lambda n, m: set(zip(n.layer[m], n.position[m], n.feature[m]))  # noqa: E731
    assert key(full.nodes, kept) == key(g.nodes, g.nodes.kind == "feature")
    np.testing.assert_allclose(
        np.asarray(g.meta["attribution"])[g.nodes.kind == "feature"],
        ref.attribution[kept],
        rtol=1e-6,
        atol=1e-9,
    )
    np.testing.assert_allclose(np.asarray(g.meta["bias"])[g.nodes.kind == "feature"], bias[kept], rtol=1e-12)
    assert ref.detached_attribution == pytest.approx(detached, rel=1e-6)
    assert ref.bias_attribution == pytest.approx(g.meta["bias_attribution"], rel=1e-6)
    assert abs(ref.theorem_residual(kinds)) <= 1e-5 * abs(root)
    # every kept feature passed the threshold
    assert (np.asarray(g.meta["attribution"])[g.nodes.kind == "feature"] >= tau).all()


def hand_graph():
    """Embedding X; layer-0 features D, E; layer-1 features K, S; root R (node values a, biases b):
        D = X (a 1)                       E = X (a 1)
        K = 0.5 D + 0.0625 E + 0.4375 X (a 1)
        S = 8 E - 7.5 X + 0.5 (a 1)       R = K + 0.0625 S + 0.25 X + 0.6875 (value 2)
    One pass: attr K 1, S 0.0625, D 0.5, E 0.0625 + 8 * 0.0625 = 0.5625 (mostly through S)."""
    kinds = ["embedding", "feature", "feature", "feature", "feature", "logit"]
    X, D, E, K, S, R = range(6)
    A = np.zeros((6, 6))
    A[D, X] = A[E, X] = 1.0
    A[K, [D, E, X]] = 0.5, 0.0625, 0.4375
    A[S, [E, X]] = 8.0, -7.5
    A[R, [K, S, X]] = 1.0, 0.0625, 0.25
    bias = np.array([0, 0, 0, 0, 0.5, 0.6875])
    g = graph_from_dense(kinds, A, layers=[-1, 0, 0, 1, 1, 2])
    g.nodes.activation[:] = [1.0, 1.0, 1.0, 1.0, 1.0, 2.0]
    return g, bias


def test_hierarchical_recovers_more_than_standard_at_equal_size():
    """Standard attribution thresholds the one-pass attribution; hierarchical detaches during the
    pass. On `hand_graph` the answer is known: E's one-pass attribution (0.5625) comes through S,
    which neither method keeps. With room for two features standard keeps {K, E} and recovers
    2 - 0.0625 (S) - 0.5 (D) = 1.4375 of the root; hierarchical (tau 0.25) sees E at 0.0625, keeps
    {K, D} and recovers 2 - 0.0625 (S) - 0.0625 (E) = 1.875. At the same tau standard keeps E too."""
    g, bias = hand_graph()
    kinds = g.nodes.kind
    names = np.array(list("XDEKSR"))
    one = hierarchical_attribution(g, bias=bias)
    np.testing.assert_array_equal(one.attribution[1:5], [0.5, 0.5625, 1.0, 0.0625])
    assert one.theorem_residual(kinds) == 0.0 and one.detached_attribution == 0.0
    top2 = np.isin(np.arange(6), np.argsort(-np.where(kinds == "feature", one.attribution, -np.inf))[:2])
    standard = hierarchical_attribution(g, keep=top2, bias=bias)
    hier = hierarchical_attribution(g, 0.25, bias=bias)
    assert list(names[standard.kept & (kinds == "feature")]) == ["E", "K"]
    assert list(names[hier.kept & (kinds == "feature")]) == ["D", "K"]
    assert standard.root_value - standard.detached_attribution == 1.4375
    assert hier.root_value - hier.detached_attribution == 1.875
    assert hier.attribution[2] == 0.0625  # E from its kept successor K only
    for r in (standard, hier):  # the recovered share is the leaves' sum (Theorem 3.1, biases given)
        assert r.theorem_residual(kinds) == 0.0
    same_tau = hierarchical_attribution(g, keep=one.attribution >= 0.25, bias=bias)
    assert list(names[same_tau.kept & (kinds == "feature")]) == ["D", "E", "K"]
    assert same_tau.root_value - same_tau.detached_attribution == 1.9375
    # a wrong bias is not absorbed: the identity shows it
    wrong = bias.copy()
    wrong[4] += 1.0
    assert hierarchical_attribution(g, bias=wrong).theorem_residual(kinds) == -0.0625


def test_bias_inputs_are_checked(setup):
    model, rm, full = setup
    with pytest.raises(GraphError, match="one constant term per node"):
        hierarchical_attribution(full, bias=np.zeros(3))
    with pytest.raises(GraphError, match="one target per logit node"):
        node_biases(rm, full, [logit_difference(model, 5, 9)] * 2)
    diff = logit_difference(model, 5, 9)
    g = attribute(model, rm, TOKENS, exclude_bos=True, targets=[diff])
    with pytest.raises(GraphError, match="custom targets"):
        node_biases(rm, g)
    with pytest.raises(GraphError, match="how it was built"):
        node_biases(rm, hand_graph()[0])
    # with its target, the logit difference's constant term: its value less its incoming edges
    value, edges = float(g.nodes.activation[-1]), float(g.adjacency[[-1]].sum())
    assert node_biases(rm, g, [diff])[-1] == pytest.approx(value - edges, rel=1e-5)


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
    root, leaves, detached = theorem(g, rm, read_logits(diff.vector))
    assert abs(root) > 0.1 and abs(leaves + detached - root) <= 1e-9 * abs(root)
    n = full.nodes
    top = np.flatnonzero((n.kind == "feature") & (n.layer == 2))[0]
    feat = (int(n.layer[top]), int(n.position[top]), int(n.feature[top]))
    g = attribute_hierarchical(model, rm, TOKENS, tau=-math.inf, root=feat, exclude_bos=True)
    root, leaves, detached = theorem(g, rm, read_feature(*feat))
    assert root == pytest.approx(float(n.activation[top]), rel=1e-6)
    assert abs(leaves - root) <= 1e-9 * abs(root)
    assert (g.nodes.kind != "logit").all() and g.nodes.kind[g.meta["root_index"]] == "feature"
    save_graph(g, tmp_path / "h.h5")
    back = result_from_graph(load_graph(tmp_path / "h.h5"))
    assert back.root_value == pytest.approx(root) and len(back.attribution) == g.n_nodes
    with pytest.raises(TargetError, match="not active"):
        attribute_hierarchical(model, rm, TOKENS, root=(0, 0, 0), exclude_bos=True)


@pytest.mark.bundled("default", "default-plt")
def test_theorem_3_1_on_the_bundled_model():
    from attrgraph.bundled.loading import load_model
    from attrgraph.bundled.tasks import ioi_pairs
    from transcoders import load_transcoders

    model = load_model("default")
    rm = ReplacementModel(model, load_transcoders("default-plt"))
    ex = ioi_pairs(1, seed=3)[0]
    target = logit_difference(model, ex.meta["io"], ex.meta["s"])
    tokens = model.to_tokens(ex.prompt)[0]
    g = attribute_hierarchical(model, rm, tokens, tau=0.01, root=target)
    root, leaves, detached = theorem(g, rm, read_logits(target.vector), rel=1e-4)  # float32 model
    assert g.meta["n_detached"] > 0 and abs(leaves + detached - root) <= 1e-5 * abs(root)


def test_direction_root_at_a_hook_keeps_the_identity(setup):
    from attrgraph.engine.targets import direction

    model, rm, _ = setup
    v = torch.randn(model.cfg.d_model, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    root = direction("blocks.1.hook_resid_post", 6, v)
    g = attribute_hierarchical(model, rm, TOKENS, tau=-math.inf, root=root, exclude_bos=True)
    root_value, leaves, detached = theorem(g, rm, read_hook(root.hook, 6, v))
    assert detached == 0.0 and (g.nodes.layer[g.nodes.kind == "feature"] <= 1).all()
    assert abs(leaves - root_value) <= 1e-9 * abs(root_value)


def test_attribute_dispatches_hierarchical(setup):
    from attrgraph.engine.attribute import attribute as attribute_

    model, rm, _ = setup
    g = attribute_(model, rm, TOKENS, method="hierarchical", tau=0.05, exclude_bos=True)
    h = attribute_hierarchical(model, rm, TOKENS, tau=0.05, exclude_bos=True)
    assert g.meta["method"] == "hierarchical" and g.n_nodes == h.n_nodes
    np.testing.assert_allclose(g.meta["attribution"], h.meta["attribution"], rtol=1e-9)


def test_theorem_3_1_with_attention_features():
    """With attention features a layer's MLP features are visited before its attention features
    (which feed them); the measured bias leaves close Theorem 3.1 on the model and on the graph."""
    model = tiny_model("llama", n_layers=3)
    rm = ReplacementModel(model, [tiny_transcoders(model, "plt", True), tiny_attn_saes(model)])
    g = attribute_hierarchical(model, rm, TOKENS, tau=-math.inf, exclude_bos=True)
    root = g.meta["root_value"]
    assert abs(root) > 0.1 and abs(g.meta["theorem_residual"]) <= 1e-9 * abs(root)
    n = g.nodes
    assert n.mask("feature", "attn").sum() > 10 and n.mask("error", "attn").sum() > 0
    full = attribute(model, rm, TOKENS, exclude_bos=True, max_n_logits=1)
    res = hierarchical_attribution(full, -math.inf, bias=node_biases(rm, full))
    assert abs(res.theorem_residual(full.nodes.kind)) <= 1e-5 * abs(res.root_value)  # float32 edges
    # the same attribution on the kept features of both sites
    key = {
        (k, l, p, f, s): i
        for i, (k, l, p, f, s) in enumerate(
            zip(*(getattr(full.nodes, a) for a in ("kind", "layer", "position", "feature", "site")))
        )
    }
    mine = np.flatnonzero(n.kind == "feature")
    theirs = [key[(n.kind[i], n.layer[i], n.position[i], n.feature[i], n.site[i])] for i in mine]
    np.testing.assert_allclose(
        np.asarray(g.meta["attribution"])[mine], res.attribution[theirs], rtol=1e-4, atol=1e-6 * abs(root)
    )
    # with detaching
    tau = float(np.quantile(res.attribution[full.nodes.kind == "feature"], 0.7))
    g = attribute_hierarchical(model, rm, TOKENS, tau=tau, exclude_bos=True)
    assert g.meta["n_detached"] > 0 and abs(g.meta["theorem_residual"]) <= 1e-9 * abs(root)
    # roots of both sites: an attention feature, and an MLP feature fed by its layer's attention features
    state = rm.run(TOKENS, exclude_bos=True)
    fa = np.flatnonzero(full.nodes.mask("feature", "attn") & (full.nodes.layer == 2))[-1]
    node = NodeKey(
        "feature",
        int(full.nodes.layer[fa]),
        int(full.nodes.position[fa]),
        int(full.nodes.feature[fa]),
        "attn",
    )
    ga = attribute_hierarchical(model, rm, TOKENS, tau=-math.inf, root=node, exclude_bos=True)
    assert ga.meta["root_value"] == pytest.approx(
        float(state.attn_pre_acts[node.layer, node.position, node.feature])
    )
    assert abs(ga.meta["theorem_residual"]) <= 1e-9 * abs(ga.meta["root_value"])
    assert (ga.nodes.layer[ga.nodes.kind == "feature"][:-1] < 2).all()  # nothing of its own layer feeds it
    fm = np.flatnonzero(full.nodes.mask("feature", "mlp") & (full.nodes.layer == 2))[-1]
    feat = (int(full.nodes.layer[fm]), int(full.nodes.position[fm]), int(full.nodes.feature[fm]))
    gm = attribute_hierarchical(model, rm, TOKENS, tau=-math.inf, root=feat, exclude_bos=True)
    assert abs(gm.meta["theorem_residual"]) <= 1e-9 * abs(gm.meta["root_value"])
    assert (gm.nodes.mask("feature", "attn") & (gm.nodes.layer == 2)).any()
    with pytest.raises(GraphError, match="built with an attention SAE set, and none was passed"):
        node_biases(ReplacementModel(model, rm.tc), full)
    with pytest.raises(TargetError, match="attn feature"):
        attribute_hierarchical(model, rm, TOKENS, root=NodeKey("feature", 0, 0, 0, "attn"), exclude_bos=True)

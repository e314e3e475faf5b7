"""The blocks of issue 32 end to end, each on a tiny random model (ag_helpers.BLOCK_ARCHS): Qwen3
(QK-norm, grouped-query attention), Gemma-3 (QK-norm, sliding-window and global layers, norms
before and after each sublayer) and a parallel attention + MLP block (GPT-J / GPT-NeoX / Pythia).

Expected values come from outside the code under test: the frozen replacement model run with one
source doubled (edges), the real model with constrained patching (guaranteed direct effects),
TransformerLens's own attention scores (QK), a replacement that is the model by construction
(faithfulness), the corrupted run / finite differences of single-edge patching (EAP), and for
component circuits on grouped-query attention, the same model with its key/value heads repeated
into multi-head attention."""

import copy
import math

import numpy as np
import pytest
import torch

from attrgraph.analysis.intervene import error_node, intervene
from attrgraph.analysis.qk import attention_score, qk_attribution
from attrgraph.analysis.validate import ValidateConfig, faithfulness, validate_graph
from attrgraph.circuits.eap import example_scores
from attrgraph.circuits.graph import ComponentGraph
from attrgraph.circuits.pairs import last_logits, metric
from attrgraph.circuits.patching import record_run, run_edges
from attrgraph.engine.attribute import attribute
from attrgraph.engine.replacement import ReplacementModel
from attrgraph.errors import UnsupportedModelError
from tests.attrgraph.ag_helpers import BLOCK_ARCHS, tiny_attn_saes, tiny_model, tiny_transcoders
from tests.attrgraph.circuits.circuit_helpers import make_pairs
from tests.attrgraph.engine.test_attribute import TOKENS, check_contracts, check_contracts_with_attention

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("arch", BLOCK_ARCHS)
@pytest.mark.parametrize("kind,skip", [("plt", True), ("clt", False)])
def test_exactness_on_both_engines(arch, kind, skip):
    """Contracts 1-3 on every node type, on the autograd engine and the linear one, which agree."""
    model = tiny_model(arch)
    rm = ReplacementModel(model, tiny_transcoders(model, kind, skip))
    state = rm.run(TOKENS, exclude_bos=True)
    graphs = {
        b: attribute(model, rm, TOKENS, batch_size=32, exclude_bos=True, backend=b)
        for b in ("autograd", "linear")
    }
    for graph in graphs.values():
        assert graph.n_features > 100
        check_contracts(graph, rm, state, rtol=1e-6)
    np.testing.assert_allclose(graphs["linear"].dense(), graphs["autograd"].dense(), rtol=0, atol=1e-12)


@pytest.mark.parametrize("arch", BLOCK_ARCHS)
def test_exactness_with_attention_features_on_both_engines(arch):
    model = tiny_model(arch)
    rm = ReplacementModel(model, [tiny_transcoders(model, "plt", True), tiny_attn_saes(model)])
    state = rm.run(TOKENS, exclude_bos=True)
    graphs = {
        b: attribute(model, rm, TOKENS, batch_size=32, exclude_bos=True, backend=b)
        for b in ("autograd", "linear")
    }
    for graph in graphs.values():
        assert (graph.nodes.site == "attn").sum() > 20
        check_contracts_with_attention(graph, rm, state, rtol=1e-6)
    np.testing.assert_allclose(graphs["linear"].dense(), graphs["autograd"].dense(), rtol=0, atol=1e-12)


@pytest.mark.parametrize("arch", BLOCK_ARCHS)
def test_constrained_patching_reproduces_direct_edges(arch):
    """On the real model: ablating a source with constrained patching over [l_s, l_t] under frozen
    attention moves the target's pre-activation by minus the graph edge (the appendix)."""
    model = tiny_model(arch, n_layers=3)
    tc = tiny_transcoders(model, "plt", True)
    tokens = TOKENS.tolist()
    graph = attribute(model, tc, tokens, exclude_bos=False)
    n, A = graph.nodes, graph.dense()
    clean = intervene(model, tc, tokens, {})
    rng = np.random.default_rng(0)
    checked = 0
    for t in rng.choice(np.flatnonzero((n.kind == "feature") & (n.layer == 2)), 3, replace=False):
        lt, pt, ft = int(n.layer[t]), int(n.position[t]), int(n.feature[t])
        sources = [s for s in np.flatnonzero(A[t]) if n.kind[s] in ("feature", "error") and n.layer[s] < lt]
        for s in rng.choice(sources, min(4, len(sources)), replace=False):
            ls, ps = int(n.layer[s]), int(n.position[s])
            key = (ls, ps, int(n.feature[s])) if n.kind[s] == "feature" else error_node(ls, ps)
            out = intervene(model, tc, tokens, {key: 0.0}, layers=(ls, lt))
            change = float(out.pre_acts[lt, pt, ft] - clean.pre_acts[lt, pt, ft])
            assert change == pytest.approx(-A[t, s], rel=1e-6, abs=1e-9)
            checked += 1
    assert checked >= 8


@pytest.mark.parametrize("arch", BLOCK_ARCHS)
def test_qk_pairs_sum_to_the_models_own_score(arch):
    """QK attribution splits the score TransformerLens computes (`hook_attn_scores`: after QK-norm and
    rotary) exactly, on a local (sliding-window) layer and a global one."""
    model = tiny_model(arch, n_layers=2)
    tc = tiny_transcoders(model, "plt", True)
    tokens = TOKENS.tolist()
    for layer, head, i, j in [(0, 1, 7, 6), (1, 3, 6, 2), (1, 0, 5, 5)]:
        qk = qk_attribution(model, tc, tokens, layer, head, i, j, exclude_bos=True)
        score = attention_score(model, tokens, layer, head, i, j)
        assert math.isfinite(score) and abs(score) > 1e-3
        assert qk.pairs().sum() == pytest.approx(score, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("arch", BLOCK_ARCHS)
def test_validation_runs_and_is_perfect_when_the_replacement_is_the_model(arch):
    """MLPs that output nothing and transcoders that decode nothing make the replacement model the
    model: every perturbation has the same effect in both (cosine 1, normalized MSE 0)."""
    model = tiny_model(arch, n_layers=3)
    tc = tiny_transcoders(model, "plt")
    graph = attribute(model, tc, TOKENS, exclude_bos=False)
    res = validate_graph(model, tc, graph, ValidateConfig(max_features=10, n_perturbations=2, windows=(0,)))
    assert res["feature_to_feature"]["n_pairs"] > 0 and res["node_to_logit"]["n_features"] == 10
    with torch.no_grad():
        for block in model.blocks:
            block.mlp.W_out.zero_()
            block.mlp.b_out.zero_()
        tc.W_dec.zero_()
        tc.b_dec.zero_()
    rm = ReplacementModel(model, tc)
    out = faithfulness(rm, rm.run(TOKENS, exclude_bos=False), ValidateConfig(n_perturbations=3))
    for kind in ("encoder", "random"):
        np.testing.assert_allclose(out[kind]["cosine"], 1.0, atol=1e-9)
        np.testing.assert_allclose(out[kind]["nmse"], 0.0, atol=1e-12)


def test_eap_on_a_parallel_block_equals_single_edge_patching():
    """Component circuits on a parallel block: its MLP reads resid_pre, so no head of its own layer
    feeds it; patching every edge is the corrupted run, and EAP scores are finite differences."""
    model = tiny_model("pythia", d_vocab=50)
    pairs = make_pairs()
    g = ComponentGraph.from_model(model)
    assert g.parallel and not g.valid[g.up_head(1, 0), g.down_mlp(1)] and g.valid[g.up_mlp(0), g.down_mlp(1)]
    corr = record_run(model, pairs.corrupt)
    with torch.no_grad():
        torch.testing.assert_close(
            run_edges(model, pairs.clean).logits, model(pairs.clean), rtol=0, atol=1e-12
        )
        zero = torch.zeros(g.n_up, g.n_down, dtype=torch.float64)
        torch.testing.assert_close(
            run_edges(model, pairs.clean, corrupt=corr, keep=zero).logits,
            model(pairs.corrupt),
            rtol=0,
            atol=1e-12,
        )
    per_example = example_scores(model, pairs).resid.sum(1)

    def score(**kw):
        with torch.no_grad():
            return metric(last_logits(run_edges(model, pairs.clean, **kw).logits, pairs.last), pairs)

    m0, eps = score(), 1e-6
    for u, d in [
        (0, g.down_head(0, 0, 1)),
        (g.up_head(0, 1), g.down_mlp(1)),
        (g.up_mlp(0), g.down_mlp(1)),
        (g.up_mlp(1), g.down_logits),
    ]:
        keep = torch.ones(g.n_up, g.n_down, dtype=torch.float64)
        keep[u, d] = 1 - eps
        fd = (score(corrupt=corr, keep=keep) - m0) / eps
        torch.testing.assert_close(fd, per_example[:, u, d], rtol=1e-4, atol=1e-7)


def _multi_head_twin(model):
    """The same model with each key/value head repeated for the query heads of its group
    (`n_key_value_heads=None`): multi-head attention, which the component graph covered before."""
    from transformer_lens import HookedTransformer

    cfg = copy.deepcopy(model.cfg)
    cfg.n_key_value_heads = None
    twin = HookedTransformer(cfg)
    rep = model.cfg.n_heads // model.cfg.n_key_value_heads
    state = {}
    for name, w in model.state_dict().items():
        leaf = name.rsplit(".", 1)[-1]
        if leaf in ("_W_K", "_W_V", "_b_K", "_b_V"):  # GroupedQueryAttention's [n_kv_heads, ...]
            name, w = name[: -len(leaf)] + leaf[1:], w.repeat_interleave(rep, dim=0)
        state[name] = w
    twin.load_state_dict(state, strict=True)
    return twin


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_component_circuits_on_grouped_query_attention_are_those_of_its_multi_head_twin(arch):
    """Grouped-query attention (Llama-3, Qwen3: 2 key/value heads for 4 query heads) computes what
    its multi-head twin computes; the component graph gives both the same edges and scores (residual
    and cross-position), and patching every edge is the corrupted run, as on any model."""
    model = tiny_model(arch, d_vocab=50)
    twin = _multi_head_twin(model)
    pairs = make_pairs()
    torch.testing.assert_close(model(pairs.clean), twin(pairs.clean), rtol=0, atol=1e-12)
    g = ComponentGraph.from_model(model)
    assert g == ComponentGraph.from_model(twin) and g.n_heads == 4
    ours, want = (example_scores(m, pairs, cross_position=True) for m in (model, twin))
    assert want.resid.abs().max() > 0.1 and want.attn.abs().max() > 0.01
    torch.testing.assert_close(ours.resid, want.resid, rtol=0, atol=1e-12)
    torch.testing.assert_close(ours.attn, want.attn, rtol=0, atol=1e-12)
    corr = record_run(model, pairs.corrupt)
    assert corr.k.shape[2:4] == (2, 4) and corr.v.shape[2:4] == (2, 4)  # [layer, query head]
    with torch.no_grad():
        zero = torch.zeros(g.n_up, g.n_down, dtype=torch.float64)
        got = run_edges(model, pairs.clean, corrupt=corr, keep=zero).logits
    torch.testing.assert_close(got, model(pairs.corrupt), rtol=0, atol=1e-12)
    assert not model.cfg.ungroup_grouped_query_attention  # the flag is restored


def test_eap_on_grouped_query_attention_equals_single_edge_patching():
    """On a grouped-query model, each EAP score is the finite difference of patching that edge alone,
    the k and v edges of two query heads that share a key/value head included (each changes its own
    head's key or value only), and the cross-position edges of PEAP too."""
    model = tiny_model("llama", d_vocab=50)
    pairs = make_pairs()
    g = ComponentGraph.from_model(model)
    corr = record_run(model, pairs.corrupt)
    ex = example_scores(model, pairs, cross_position=True)
    per_example = ex.resid.sum(1)

    def score(**kw):
        with torch.no_grad():
            return metric(last_logits(run_edges(model, pairs.clean, **kw).logits, pairs.last), pairs)

    m0, eps = score(), 1e-6
    for u, d in [
        (g.up_head(0, 1), g.down_head(1, 1, 0)),  # heads 0 and 1 share key/value head 0
        (g.up_head(0, 1), g.down_head(1, 1, 1)),
        (g.up_mlp(0), g.down_head(1, 2, 0)),
        (g.up_mlp(0), g.down_head(1, 2, 1)),
        (0, g.down_head(0, 1, 3)),
    ]:
        keep = torch.ones(g.n_up, g.n_down, dtype=torch.float64)
        keep[u, d] = 1 - eps
        fd = (score(corrupt=corr, keep=keep) - m0) / eps
        torch.testing.assert_close(fd, per_example[:, u, d], rtol=1e-4, atol=1e-7)
    assert not torch.allclose(
        per_example[:, 0, g.down_head(1, 1, 0)], per_example[:, 0, g.down_head(1, 1, 1)]
    )
    for h in (0, 1):  # a value edge is a first-order term (as test_eap.py checks on multi-head models)
        ak = torch.ones(1, 2, 4, 3, 7, 7, dtype=torch.float64)
        ak[0, 1, h, 2, 6, 3] = 1 - eps
        fd = (score(corrupt=corr, attn_keep=ak) - m0) / eps
        torch.testing.assert_close(fd, ex.attn[:, 1, h, 2, 6, 3], rtol=1e-4, atol=1e-7)
    # a key edge is (z*_t - z_t) . grad_z M with z*_t from patching that key alone (PEAP eqs. 4-6)
    run = run_edges(model, pairs.clean, corrupt=corr)
    grad = torch.autograd.grad(metric(last_logits(run.logits, pairs.last), pairs).sum(), run.results[1])[0]
    with torch.no_grad():
        clean = run_edges(model, pairs.clean).results[1]
    for h in (0, 1):
        ak = torch.ones(1, 2, 4, 3, 7, 7, dtype=torch.float64)
        ak[0, 1, h, 1, 6, 2] = 0
        with torch.no_grad():
            patched = run_edges(model, pairs.clean, corrupt=corr, attn_keep=ak).results[1]
        assert not (patched[:, :, 1 - h] - clean[:, :, 1 - h]).any()  # the other head of its group
        want = ((patched[:, 6, h] - clean[:, 6, h]) * grad[:, 6, h]).sum(-1)
        torch.testing.assert_close(ex.attn[:, 1, h, 1, 6, 2], want, rtol=1e-6, atol=1e-10)
    # patching head 0's key input leaves head 1's key (same key/value head) as it was
    keep = torch.ones(g.n_up, g.n_down, dtype=torch.float64)
    keep[:, g.down_head(1, 1, 0)] = 0
    with torch.no_grad():
        k = run_edges(model, pairs.clean, corrupt=corr, keep=keep, record=True).acts.k[:, :, 1]
    clean_k = record_run(model, pairs.clean).k[:, :, 1]
    assert (k[:, :, 0] - clean_k[:, :, 0]).abs().max() > 1e-3
    torch.testing.assert_close(k[:, :, 1:], clean_k[:, :, 1:], rtol=0, atol=0)


@pytest.mark.parametrize(
    "arch,why",
    [("gemma2", "normalises after each sublayer"), ("gemma3", "normalises after each sublayer")],
)
def test_component_circuits_refuse_what_they_do_not_model(arch, why):
    with pytest.raises(UnsupportedModelError, match=why):
        ComponentGraph.from_model(tiny_model(arch))


def test_qk_attribution_refuses_qk_norm_without_rotary():
    """TransformerLens has no hook after a QK-norm when there is no rotary embedding: `attn.hook_q`
    fires before the norm, so splitting it would not add up to the score; it is refused instead."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    from attrgraph.errors import QKError

    cfg = dict(n_layers=2, d_model=16, n_heads=4, d_head=4, d_mlp=64, d_vocab=40, n_ctx=32, act_fn="gelu")
    model = HookedTransformer(HookedTransformerConfig(**cfg, use_qk_norm=True, seed=0, dtype=torch.float64))
    with pytest.raises(QKError, match="no hook after the QK-norm"):
        qk_attribution(model, tiny_transcoders(model, "plt"), TOKENS.tolist(), 1, 0, 5, 3)


def test_post_norm_blocks_fall_back_to_the_exact_autograd_engine():
    """OLMo-2 runs ln1 / ln2 after their sublayer; the linear engine's walk assumes them before, and
    gave edges that broke contract 1. The default backend now takes autograd there, which is exact."""
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(
        n_layers=2, d_model=16, n_heads=4, d_head=4, d_mlp=64, d_vocab=40, n_ctx=32, act_fn="silu",
        normalization_type="RMS", positional_embedding_type="rotary", rotary_dim=4, gated_mlp=True,
        original_architecture="Olmo2ForCausalLM", seed=0, dtype=torch.float64,
    )  # fmt: skip
    model = HookedTransformer(cfg)
    rm = ReplacementModel(model, tiny_transcoders(model, "plt", True))
    graph = attribute(model, rm, TOKENS, batch_size=32, exclude_bos=True)
    assert graph.meta["backend"] == "autograd"
    check_contracts(graph, rm, rm.run(TOKENS, exclude_bos=True), rtol=1e-6)

"""Attribution: the exactness contract (DESIGN.md 1-3) on tiny random models of each architecture,
fast path vs reference path, custom targets, and bad input."""

import re
import warnings

import numpy as np
import pytest
import torch

from attrgraph.bundled.paths import BUNDLED
from attrgraph.engine.attribute import attribute
from attrgraph.engine.replacement import ReplacementModel
from attrgraph.engine.sources import to_tokens
from attrgraph.engine.targets import Target, direction, logit_difference, logit_target
from attrgraph.errors import OptionError, PromptError, PromptWarning, TargetError
from attrgraph.graph.graph import NODE_ORDER
from tests.attrgraph.ag_helpers import ARCHS, TRANSCODERS, tiny_attn_saes, tiny_model, tiny_transcoders

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TOKENS = torch.tensor([0, 5, 9, 3, 17, 22, 5, 9])


def zero_source_forward(rm, state):
    """The frozen model with every graph source set to zero: the targets' biases."""
    return rm.forward(
        state, torch.zeros_like(state.acts), torch.zeros_like(state.errors), torch.zeros_like(state.embed)
    )


def target_values(graph, state, out):
    """(pre-activation of every feature node, demeaned logit of every logit node) from a forward output."""
    n = graph.nodes
    f = n.kind == "feature"
    pre = out.pre_acts[n.layer[f], n.position[f], n.feature[f]].double().cpu().numpy()
    last = out.logits[-1].double()
    logit = (last[graph.logit_tokens] - last.mean()).cpu().numpy()
    return pre, logit


def check_contracts(graph, rm, state, rtol, n_fd=4, seed=0):
    A = graph.dense().astype(np.float64)
    n = graph.nodes
    f, lg = n.kind == "feature", n.kind == "logit"
    pre, logit = target_values(graph, state, rm.forward(state))
    bias_pre, bias_logit = target_values(graph, state, zero_source_forward(rm, state))
    # contract 1: incoming edges + bias == pre-activation
    np.testing.assert_allclose(A[f].sum(1) + bias_pre, pre, rtol=0, atol=rtol * np.abs(pre).max())
    # contract 2: the same for the demeaned logits
    np.testing.assert_allclose(A[lg].sum(1) + bias_logit, logit, rtol=0, atol=rtol * np.abs(logit).max())
    # contract 3: an edge equals the finite-difference effect of its source (doubling it)
    rng = np.random.default_rng(seed)
    for kind in ("feature", "error", "embedding"):
        for s in rng.choice(np.flatnonzero(n.kind == kind), size=n_fd, replace=False):
            acts, errors, embed = state.acts.clone(), state.errors.clone(), state.embed.clone()
            l, p = int(n.layer[s]), int(n.position[s])
            if kind == "feature":
                acts[l, p, n.feature[s]] *= 2
            elif kind == "error":
                errors[l, p] *= 2
            else:
                embed[p] *= 2
            new_pre, new_logit = target_values(graph, state, rm.forward(state, acts, errors, embed))
            effect = np.concatenate([new_pre - pre, new_logit - logit])
            column = np.concatenate([A[f, s], A[lg, s]])
            scale = max(np.abs(A).max(), 1e-12)
            np.testing.assert_allclose(effect, column, rtol=0, atol=rtol * scale)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kind,skip", TRANSCODERS)
def test_exactness_contract_float64(arch, kind, skip):
    model = tiny_model(arch)
    rm = ReplacementModel(model, tiny_transcoders(model, kind, skip))
    graph = attribute(model, rm, TOKENS, batch_size=32, exclude_bos=True)
    assert graph.n_features > 20 and graph.adjacency.dtype == np.float64
    check_contracts(graph, rm, rm.run(TOKENS, exclude_bos=True), rtol=1e-6)


def test_exactness_contract_with_a_literal_read_hook():
    """Transcoders reading `hook_resid_mid` (released Gemma/Llama sets) instead of the MLP input."""
    model = tiny_model("gemma2")
    tc = tiny_transcoders(model, "plt", True)
    tc.cfg = type(tc.cfg)(**dict(tc.cfg.to_dict(), input_hook="blocks.{layer}.hook_resid_mid"))
    rm = ReplacementModel(model, tc)
    graph = attribute(model, rm, TOKENS, batch_size=32, exclude_bos=True)
    check_contracts(graph, rm, rm.run(TOKENS, exclude_bos=True), rtol=1e-6)


def test_exactness_contract_of_a_matryoshka_batchtopk_set():
    """Matryoshka BatchTopK (issue 33) runs per token as BatchTopK does once trained, `h * (h > threshold)`
    with a threshold per layer (here 0.05, as one estimated in training would be): its graph keeps the
    contract like every other set's."""
    import dataclasses

    from transcoders.plt import PerLayerTranscoder

    model = tiny_model("gpt2")
    relu = tiny_transcoders(model)
    cfg = dataclasses.replace(relu.cfg, activation="matryoshka_batchtopk", k=6, matryoshka_widths=(8, 16))
    tc = PerLayerTranscoder(cfg).to(model.cfg.dtype)
    with torch.no_grad():
        for name, p in relu.named_parameters():
            tc.get_parameter(name).copy_(p)
        tc.threshold.fill_(0.05)
    rm = ReplacementModel(model, tc.eval())
    graph = attribute(model, rm, TOKENS, batch_size=32, exclude_bos=True)
    assert graph.n_features > 10
    check_contracts(graph, rm, rm.run(TOKENS, exclude_bos=True), rtol=1e-6)


def test_exactness_contract_of_a_gated_set():
    """A gated set (issue 33; Rajamanoharan et al. 2024) with its gate frozen at the recorded value is
    linear in its magnitude pre-activation `x @ (W_enc * exp(r_mag)) + b_mag`: the graph's targets are
    those, and the contract holds as for every other set. Gate biases, log-scales and magnitude biases
    are random, so that gate and magnitude paths differ (some features have a positive magnitude and a
    shut gate)."""
    import dataclasses

    from transcoders.plt import PerLayerTranscoder

    model = tiny_model("gpt2")
    relu = tiny_transcoders(model)
    tc = PerLayerTranscoder(dataclasses.replace(relu.cfg, activation="gated")).to(model.cfg.dtype)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for name, p in relu.named_parameters():
            tc.get_parameter(name).copy_(p)
        for p in (tc.b_enc, tc.r_mag, tc.b_mag):
            p.copy_(0.3 * torch.randn(p.shape, generator=g))
    rm = ReplacementModel(model, tc.eval())
    state = rm.run(TOKENS, exclude_bos=True)
    on = state.acts != 0
    torch.testing.assert_close(state.acts[on], state.pre_acts[on])  # active: a = pi_mag
    assert bool(((state.pre_acts > 0) & ~on)[:, 1:].any())  # some shut gates over positive magnitudes
    graph = attribute(model, rm, TOKENS, batch_size=32, exclude_bos=True)
    assert graph.n_features > 10
    check_contracts(graph, rm, state, rtol=1e-6)


def test_exactness_contract_float32_with_position_zero_included(device):
    model = tiny_model("gpt2", torch.float32)
    rm = ReplacementModel(model.to(device), tiny_transcoders(model, "clt").to(device))
    graph = attribute(model, rm, TOKENS, exclude_bos=False)
    assert (graph.nodes.position[graph.nodes.kind == "feature"] == 0).any()
    check_contracts(graph, rm, rm.run(TOKENS, exclude_bos=False), rtol=1e-4)


def test_node_order_and_layout():
    model = tiny_model("gpt2")
    tc = tiny_transcoders(model)
    g = attribute(model, tc, TOKENS, exclude_bos=True, max_n_logits=4, desired_logit_prob=0.99)
    kinds = g.nodes.kind.tolist()
    assert [k for i, k in enumerate(kinds) if i == 0 or kinds[i - 1] != k] == list(NODE_ORDER)
    n_pos, L = len(TOKENS), model.cfg.n_layers
    assert (g.nodes.kind == "embedding").sum() == n_pos
    assert (g.nodes.kind == "error").sum() == L * (n_pos - 1)  # no error nodes at the excluded BOS
    f = g.nodes.kind == "feature"
    assert (g.nodes.position[f] > 0).all() and (g.nodes.activation[f] > 0).all()
    keys = np.stack([g.nodes.layer[f], g.nodes.position[f], g.nodes.feature[f]], 1)
    assert (np.diff(keys[:, 0] * 10**6 + keys[:, 1] * 10**3 + keys[:, 2]) > 0).all()
    assert len(g.logit_tokens) == 4 and np.all(np.diff(g.logit_probs) <= 0)
    # strictly lower-triangular: every edge from a lower to a higher index
    coo = g.adjacency.tocoo()
    assert (coo.col < coo.row).all()
    assert np.all(g.nodes.influence >= 0)


def test_batch_size_does_not_change_the_graph():
    model = tiny_model("llama")
    tc = tiny_transcoders(model, "plt", True)
    a = attribute(model, tc, TOKENS, batch_size=1)
    b = attribute(model, tc, TOKENS, batch_size=1000)
    np.testing.assert_allclose(a.dense(), b.dense(), rtol=1e-12, atol=1e-14)


def test_logit_selection_by_probability():
    model = tiny_model("gpt2")
    tc = tiny_transcoders(model)
    with torch.no_grad():
        probs = torch.softmax(model(TOKENS[None])[0, -1], -1).sort(descending=True).values
    g = attribute(model, tc, TOKENS, max_n_logits=40, desired_logit_prob=0.5)
    k = int((probs.cumsum(0) < 0.5).sum()) + 1
    assert len(g.logit_tokens) == k
    np.testing.assert_allclose(g.logit_probs, probs[:k].numpy(), rtol=1e-6)
    assert len(attribute(model, tc, TOKENS, max_n_logits=2).logit_tokens) == 2


def test_embedding_modes_differ_only_in_embedding_columns():
    model = tiny_model("gpt2")
    tc = tiny_transcoders(model)
    a = attribute(model, tc, TOKENS, embedding="token+position").dense()
    b = attribute(model, tc, TOKENS, embedding="token").dense()
    n_pos = len(TOKENS)
    np.testing.assert_allclose(a[:, n_pos:], b[:, n_pos:], rtol=1e-12, atol=1e-14)
    assert not np.allclose(a[:, :n_pos], b[:, :n_pos])


def test_custom_targets_logit_difference_and_direction():
    model = tiny_model("gemma2")
    rm = ReplacementModel(model, tiny_transcoders(model, "clt"))
    base = attribute(model, rm, TOKENS, max_n_logits=2, desired_logit_prob=1.0)
    a, b = (int(t) for t in base.logit_tokens)
    diff = attribute(model, rm, TOKENS, targets=[logit_difference(model, a, b)])
    rows = base.dense()[base.nodes.kind == "logit"]
    np.testing.assert_allclose(diff.dense()[-1, :-1], (rows[0] - rows[1])[:-2], rtol=1e-10, atol=1e-12)
    # a direction in the residual stream before layer 1 at position 4: edges + bias == value
    v = torch.randn(model.cfg.d_model, dtype=torch.float64)
    g = attribute(model, rm, TOKENS, targets=[direction("blocks.1.hook_resid_pre", 4, v)])
    state = rm.run(TOKENS)
    with (
        torch.no_grad(),
        rm.frozen(
            state,
            rm.constant(state, torch.zeros_like(state.acts), torch.zeros_like(state.errors)),
            embed=torch.zeros_like(state.embed),
            capture=("blocks.1.hook_resid_pre",),
        ) as run,
    ):
        rm.model(TOKENS[None])
        bias = float(run.captured["blocks.1.hook_resid_pre"][0, 4] @ v)
    value = g.nodes.activation[-1]
    assert g.nodes.layer[-1] == 1 and g.nodes.position[-1] == 4
    np.testing.assert_allclose(g.dense()[-1].sum() + bias, value, rtol=1e-6)  # value stored as float32
    # nothing at a later position or layer feeds it
    src = g.dense()[-1] != 0
    assert (g.nodes.position[src] <= 4).all() and (g.nodes.layer[src] < 1).all()
    with pytest.raises(TargetError):
        attribute(model, rm, TOKENS, targets=[direction("blocks.9.hook_nope", 0, v)])


def test_bad_prompts_are_refused_before_work():
    model = tiny_model("gpt2")
    tc = tiny_transcoders(model)
    with pytest.raises(PromptError, match="0 tokens"):
        attribute(model, tc, [])
    with pytest.raises(PromptError, match="empty"):
        attribute(model, tc, "   ")
    with pytest.raises(PromptError, match="context is 32"):
        attribute(model, tc, torch.zeros(33, dtype=torch.long))


def test_options_that_do_not_apply_to_the_method_are_refused():
    model = tiny_model("gpt2")
    tc = tiny_transcoders(model)
    target = logit_difference(model, 1, 2)
    cases = [
        (dict(tau=0.1), "does not take tau .*method='hierarchical'"),
        (dict(max_feature_nodes=8), "does not take max_feature_nodes .*method='adaptive'"),
        (dict(method="hierarchical", max_n_logits=3), "does not take max_n_logits"),
        (dict(method="hierarchical", progress=True), "does not take progress"),
        (dict(method="hierarchical", targets=[target, target]), "one root; got 2 targets"),
        (dict(method="adaptive", targets=[target], max_feature_nodes=8), "does not take targets"),
        (dict(method="adaptive"), "needs max_feature_nodes"),
        (dict(method="greedy"), "method is 'greedy'"),
        (dict(batch_size=0), "batch_size is 0"),
    ]
    for kwargs, message in cases:
        with pytest.raises(OptionError, match=message):
            attribute(model, tc, TOKENS, **kwargs)
    # the same options are taken by the method they belong to
    g = attribute(model, tc, TOKENS, method="hierarchical", tau=0.0, targets=[target], exclude_bos=True)
    assert g.meta["method"] == "hierarchical"


# ------------------------------------------------------------------ attention features (site "attn")
def zero_forward_with_attention(rm, state):
    z = torch.zeros_like
    return rm.forward(
        state, z(state.acts), z(state.errors), z(state.embed), z(state.attn_acts), z(state.attn_errors)
    )


def values_with_attention(graph, out):
    """(pre-activation of every feature node in node order, demeaned logits) from a forward output."""
    n = graph.nodes
    f = n.kind == "feature"
    pre = np.zeros(int(f.sum()))
    attn = n.site[f] == "attn"
    for mine, table in ((attn, out.attn_pre_acts), (~attn, out.pre_acts)):
        idx = np.flatnonzero(f)[mine]
        pre[mine] = table[n.layer[idx], n.position[idx], n.feature[idx]].double().numpy()
    last = out.logits[-1].double()
    return pre, (last[graph.logit_tokens] - last.mean()).numpy()


def check_contracts_with_attention(graph, rm, state, rtol, n_fd=3, seed=0):
    """Contracts 1-3 for every node kind and site: MLP and attention features, both error kinds."""
    A = graph.dense().astype(np.float64)
    n = graph.nodes
    f, lg = n.kind == "feature", n.kind == "logit"
    pre, logit = values_with_attention(graph, rm.forward(state))
    bias_pre, bias_logit = values_with_attention(graph, zero_forward_with_attention(rm, state))
    for site in ("attn", "mlp"):  # contract 1 per site
        m = n.site[f] == site
        assert m.sum() > 5, f"too few {site} features to test"
        np.testing.assert_allclose(
            A[f][m].sum(1) + bias_pre[m], pre[m], rtol=0, atol=rtol * np.abs(pre).max()
        )
    np.testing.assert_allclose(A[lg].sum(1) + bias_logit, logit, rtol=0, atol=rtol * np.abs(logit).max())
    rng = np.random.default_rng(seed)
    scale = max(np.abs(A).max(), 1e-12)
    for kind, site in (
        ("feature", "attn"),
        ("error", "attn"),
        ("feature", "mlp"),
        ("error", "mlp"),
        ("embedding", ""),
    ):
        cand = np.flatnonzero((n.kind == kind) & (n.site == site))
        for s in rng.choice(cand, size=n_fd, replace=False):
            src = dict(
                acts=state.acts.clone(),
                errors=state.errors.clone(),
                embed=state.embed.clone(),
                attn_acts=state.attn_acts.clone(),
                attn_errors=state.attn_errors.clone(),
            )
            l, p = int(n.layer[s]), int(n.position[s])
            if kind == "embedding":
                src["embed"][p] *= 2
            elif kind == "feature":
                src["attn_acts" if site == "attn" else "acts"][l, p, n.feature[s]] *= 2
            else:
                src["attn_errors" if site == "attn" else "errors"][l, p] *= 2
            new_pre, new_logit = values_with_attention(graph, rm.forward(state, **src))
            effect = np.concatenate([new_pre - pre, new_logit - logit])
            np.testing.assert_allclose(effect, np.concatenate([A[f, s], A[lg, s]]), rtol=0, atol=rtol * scale)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kind,skip", TRANSCODERS)
def test_exactness_contract_with_attention_features(arch, kind, skip):
    model = tiny_model(arch)
    rm = ReplacementModel(model, [tiny_transcoders(model, kind, skip), tiny_attn_saes(model)])
    graph = attribute(model, rm, TOKENS, batch_size=32, exclude_bos=True)
    n = graph.nodes
    assert ((n.kind == "error") & (n.site == "attn")).sum() == model.cfg.n_layers * (len(TOKENS) - 1)
    # an attention feature feeds an MLP feature of its own layer and position
    A = graph.dense()
    attn_f, mlp_f = np.flatnonzero(n.mask("feature", "attn")), np.flatnonzero(n.mask("feature", "mlp"))
    same = [
        (t, s)
        for t in mlp_f
        for s in attn_f
        if n.layer[t] == n.layer[s] and n.position[t] == n.position[s] and A[t, s] != 0
    ]
    assert same
    coo = graph.adjacency.tocoo()
    assert (coo.col < coo.row).all()
    check_contracts_with_attention(graph, rm, rm.run(TOKENS, exclude_bos=True), rtol=1e-6)


def test_exactness_with_attention_float32_position_zero_included():
    model = tiny_model("gemma2", torch.float32)
    rm = ReplacementModel(model, [tiny_transcoders(model, "clt"), tiny_attn_saes(model)])
    graph = attribute(model, rm, TOKENS, exclude_bos=False, backend="linear")
    assert (graph.nodes.position[graph.nodes.mask("feature", "attn")] == 0).any()
    check_contracts_with_attention(graph, rm, rm.run(TOKENS, exclude_bos=False), rtol=1e-4)


def test_attention_set_reproduces_the_logits_and_graphs_without_it_are_unchanged():
    model = tiny_model("llama")
    tc, sae = tiny_transcoders(model, "plt", True), tiny_attn_saes(model)
    rm = ReplacementModel(model, (tc, sae))
    state = rm.run(TOKENS)
    ref = model(TOKENS[None])[0]
    assert (rm.forward(state).logits - ref).abs().max() <= 1e-10 * ref.abs().max()
    moved = rm.forward(state, attn_errors=torch.zeros_like(state.attn_errors)).logits
    assert (moved - ref).abs().max() > 1e-4 * ref.abs().max()  # the attention errors close the gap
    plain = attribute(model, tc, TOKENS)
    again = attribute(model, [tc], TOKENS)
    assert (plain.adjacency != again.adjacency).nnz == 0 and (
        plain.nodes.site[plain.nodes.kind == "feature"] == "mlp"
    ).all()
    both = attribute(model, rm, TOKENS)
    assert (
        both.meta["attn_transcoder_hooks"] == "blocks.{layer}.hook_attn_out -> blocks.{layer}.hook_attn_out"
    )
    assert "attn_transcoder_fingerprint" in both.meta and "attn_transcoder_fingerprint" not in plain.meta
    assert both.n_nodes > plain.n_nodes


@pytest.mark.bundled("default", "default-plt")
def test_bundled_model_contract_float32():
    from attrgraph.bundled.loading import load_model
    from transcoders.formats import load_transcoders

    model = load_model("default")
    rm = ReplacementModel(model, load_transcoders(str(BUNDLED["default-plt"])))
    prompt = "When Mary and John went to the store , John gave a drink to"
    graph = attribute(model, rm, prompt, batch_size=256)
    assert graph.n_features > 0
    check_contracts(
        graph,
        rm,
        rm.run(torch.as_tensor(graph.prompt_ids), exclude_bos=graph.meta["exclude_bos"]),
        rtol=1e-4,
        n_fd=3,
    )


# ------------------------------------------------------------------ prompts from a user (to_tokens)
@pytest.fixture(scope="module")
def worded_model(model_dir):
    """A tiny model with the bundled word-level tokenizer (unknown words become <unk>), n_ctx 32."""
    from attrgraph.bundled.loading import load_model

    return load_model(model_dir)


def test_prompt_that_is_not_utf8_is_refused(worded_model):
    with pytest.raises(PromptError, match=r"not valid UTF-8: byte 0xe9 at character 3 \(after 'caf'\)"):
        to_tokens(worded_model, "caf\udce9 au lait")  # the argv bytes b"caf\xe9 au lait"
    with pytest.raises(PromptError, match=r"lone surrogate U\+D800 at character 5"):
        to_tokens(worded_model, "Mary \ud800")
    with pytest.raises(PromptError, match="not valid UTF-8"):
        attribute(worded_model, tiny_transcoders(worded_model), "caf\udce9")


def test_unknown_words_warn_with_their_share_and_strict_refuses(worded_model):
    with pytest.warns(PromptWarning, match=r"^2 of 2 prompt tokens \(100%\) .* 'zxqv', 'blorf';"):
        tokens = to_tokens(worded_model, "zxqv blorf")
    unk = worded_model.tokenizer.unk_token_id
    assert tokens.tolist() == [worded_model.tokenizer.bos_token_id, unk, unk]
    with pytest.warns(PromptWarning, match=r"^1 of 4 prompt tokens \(25%\) .*: 'zxqv';"):
        to_tokens(worded_model, "Mary zxqv went to")
    with pytest.raises(PromptError, match=r"2 of 2 prompt tokens \(100%\) .*: 'zxqv', 'blorf'"):
        to_tokens(worded_model, "zxqv blorf", strict=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # known words: no warning
        assert len(to_tokens(worded_model, "When Mary and John went", strict=True)) == 6


def test_prompt_longer_than_the_context_is_refused_or_truncated(worded_model):
    words = ["the"] * 35 + ["store", "bank", "gift", "cup"]
    full = worded_model.to_tokens(" ".join(words), truncate=False)[0]
    assert len(full) == 40 and worded_model.cfg.n_ctx == 32
    with pytest.raises(PromptError, match="prompt has 40 tokens but the model's context is 32"):
        to_tokens(worded_model, " ".join(words))
    with pytest.warns(
        PromptWarning, match=r"dropped the last 8 tokens \('the the the the store bank gift cup'\)"
    ):
        tokens = to_tokens(worded_model, " ".join(words), truncate=True)
    assert tokens.tolist() == full[:32].tolist()
    with pytest.raises(PromptError, match="40 tokens but the model's context is 32"):
        to_tokens(worded_model, full)  # ids too


def test_target_tokens_unknown_out_of_range_or_bool_are_named_errors(worded_model):
    """An unknown word would otherwise be the `<unk>` logit; an id past the vocabulary a bare
    IndexError; `True` (JSON true) token id 1. Each is a TargetError naming what was passed."""
    tc = tiny_transcoders(worded_model)
    d_vocab = worded_model.cfg.d_vocab_out
    assert worded_model.to_single_token(" zxqv") == worded_model.tokenizer.unk_token_id  # the trap
    for bad, words in [
        (" zxqv", "target word ' zxqv' is not in this model's vocabulary"),
        (d_vocab, f"target token id {d_vocab} is outside this model's vocabulary"),
        (-1, "target token id -1 is outside"),
        (True, "target token True is a bool"),
    ]:
        with pytest.raises(TargetError, match=re.escape(words)):
            logit_target(worded_model, bad)
        with pytest.raises(TargetError, match=re.escape(words)):
            logit_difference(worded_model, " Mary", bad)
        with pytest.raises(TargetError, match=re.escape(words)):
            logit_difference(worded_model, bad, " Mary")
    # known words and ids in range still work, the unknown token itself may be asked for by name
    assert logit_target(worded_model, " Mary").token == worded_model.to_single_token(" Mary")
    assert logit_target(worded_model, d_vocab - 1).token == d_vocab - 1
    assert logit_target(worded_model, "<unk>").token == worded_model.tokenizer.unk_token_id
    # attribute(targets=...): a bare word or id, or a hand-made Target past the vocabulary
    for bad, words in [
        (" zxqv", "target ' zxqv' is a str, not a Target"),
        (5, "target 5 is a int, not a Target"),
        (Target("far", torch.zeros(d_vocab), token=d_vocab), "names token id"),
    ]:
        with pytest.raises(TargetError, match=re.escape(words)):
            attribute(worded_model, tc, "When Mary and John went to", targets=[bad])

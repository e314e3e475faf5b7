"""QK attribution: the pair contributions sum to the model's attention score, and each source's
query-side part is its finite-difference effect on the query vector."""

import numpy as np
import pytest
import torch

from attrgraph.analysis.qk import attention_score, qk_attribution
from attrgraph.engine.replacement import ReplacementModel
from attrgraph.errors import QKError
from tests.attrgraph.ag_helpers import tiny_model, tiny_transcoders

TOKENS = [3, 17, 5, 9, 17, 5, 22, 8]


@pytest.mark.parametrize(
    "arch,kind,skip", [("gpt2", "plt", False), ("gpt2", "clt", True), ("llama", "plt", True)]
)
def test_pair_contributions_sum_to_the_score(arch, kind, skip):
    model = tiny_model(arch, n_layers=3)
    tc = tiny_transcoders(model, kind, skip)
    for layer, head, i, j in [(2, 1, 7, 4), (1, 3, 5, 5), (2, 0, 6, 0)]:
        qk = qk_attribution(model, tc, TOKENS, layer, head, i, j, exclude_bos=True)
        score = attention_score(model, TOKENS, layer, head, i, j)
        assert qk.score == pytest.approx(score, rel=1e-9, abs=1e-12)
        assert qk.pairs().sum() == pytest.approx(score, rel=1e-9, abs=1e-12)
        assert qk.query_marginals().sum() == pytest.approx(score, rel=1e-9, abs=1e-12)
        assert qk.key_marginals().sum() == pytest.approx(score, rel=1e-9, abs=1e-12)
        # nothing after the query (or key) position and nothing at or above the head's layer gets credit
        q_rows = np.abs(qk.Q[:-1]).sum(1) > 0
        assert np.all(qk.keys[:-1][q_rows, 1] <= i) and np.all(qk.keys[:-1][q_rows, 0] < layer)
        k_rows = np.abs(qk.K[:-1]).sum(1) > 0
        assert np.all(qk.keys[:-1][k_rows, 1] <= j)
        top = qk.top_pairs(5)
        assert len(top) == 5 and abs(top[0][2]) >= abs(top[-1][2])
        assert abs(top[0][2]) == pytest.approx(np.abs(qk.pairs()).max())


def test_feature_part_of_the_query_is_its_finite_difference():
    """Q[s] for a feature equals the change of q_i in the frozen replacement when a_s goes to 0."""
    model = tiny_model("gpt2", n_layers=3)
    tc = tiny_transcoders(model, "clt", False)
    layer, head, i, j = 2, 2, 7, 3
    qk = qk_attribution(model, tc, TOKENS, layer, head, i, j, exclude_bos=True)
    rm = ReplacementModel(model, tc)
    state = rm.run(torch.tensor(TOKENS), exclude_bos=True)
    name = f"blocks.{layer}.attn.hook_q"

    def q_of(acts):
        with torch.no_grad(), rm.frozen(state, rm.constant(state, acts=acts), capture=(name,)) as run:
            model(state.tokens[None])
        return run.captured[name][0, i, head].numpy()

    base = q_of(state.acts)
    rows = [r for r in range(len(qk.labels) - 1) if qk.keys[r, 2] >= 0 and np.abs(qk.Q[r]).sum() > 0][:5]
    assert rows
    for r in rows:
        l, p, f = qk.keys[r]
        acts = state.acts.clone()
        acts[l, p, f] = 0
        np.testing.assert_allclose(base - q_of(acts), qk.Q[r], rtol=1e-7, atol=1e-10)


def test_bad_heads_and_positions_are_refused():
    model = tiny_model("gpt2", n_layers=2)
    tc = tiny_transcoders(model)
    with pytest.raises(QKError, match="does not exist"):
        qk_attribution(model, tc, TOKENS, 5, 0, 3, 2)
    with pytest.raises(QKError, match="causal"):
        qk_attribution(model, tc, TOKENS, 1, 0, 2, 5)


@pytest.mark.parametrize("arch", ["gpt2", "llama"])
def test_qk_attribution_with_attention_features(arch):
    """With [mlp_set, attn_set], attention features and errors below the head are query- and
    key-side sources: the pairs sum to the model's score, each attention feature's part of q is
    its finite-difference effect, and the bias row is the query with every source at zero."""
    from tests.attrgraph.ag_helpers import tiny_attn_saes

    model = tiny_model(arch, n_layers=3)
    sets = [tiny_transcoders(model, "plt", True), tiny_attn_saes(model)]
    layer, head, i, j = 2, 1, 7, 4
    qk = qk_attribution(model, sets, TOKENS, layer, head, i, j, exclude_bos=True)
    score = attention_score(model, TOKENS, layer, head, i, j)
    assert qk.pairs().sum() == pytest.approx(score, rel=1e-9, abs=1e-12)
    attn_rows = np.flatnonzero((qk.sites == "attn") & (qk.keys[:, 2] >= 0))
    assert len(attn_rows) and np.abs(qk.Q[attn_rows]).sum() > 0 and np.abs(qk.K[attn_rows]).sum() > 0
    assert np.all(qk.keys[attn_rows[np.abs(qk.Q[attn_rows]).sum(1) > 0], 0] < layer)
    top = [a for pair in qk.top_pairs(50) for a in pair[:2]]
    assert any(label.startswith("A") for label in top)
    rm = ReplacementModel(model, sets)
    state = rm.run(torch.tensor(TOKENS), exclude_bos=True)
    name = [
        n for n in (f"blocks.{layer}.attn.hook_rot_q", f"blocks.{layer}.attn.hook_q") if n in model.hook_dict
    ][0]

    def q_of(**sources):
        attn = rm.attn_constant(state, sources.get("attn_acts"), sources.get("attn_errors"))
        constant = rm.constant(state, sources.get("acts"), sources.get("errors"))
        with (
            torch.no_grad(),
            rm.frozen(
                state, constant, capture=(name,), embed=sources.get("embed"), attn_constant=attn
            ) as run,
        ):
            model(state.tokens[None])
        return run.captured[name][0, i, head].numpy()

    base = q_of()
    for r in [r for r in attn_rows if np.abs(qk.Q[r]).sum() > 0][:4]:
        l, p, f = qk.keys[r]
        attn_acts = state.attn_acts.clone()
        attn_acts[l, p, f] = 0
        np.testing.assert_allclose(base - q_of(attn_acts=attn_acts), qk.Q[r], rtol=1e-7, atol=1e-10)
    z = torch.zeros_like
    zero = q_of(
        acts=z(state.acts),
        errors=z(state.errors),
        embed=z(state.embed),
        attn_acts=z(state.attn_acts),
        attn_errors=z(state.attn_errors),
    )
    np.testing.assert_allclose(qk.Q[-1], zero, rtol=1e-7, atol=1e-9)

"""The fast linear backward equals the reference autograd backward, row for row (equivalence test)."""

import numpy as np
import pytest
import torch

from attrgraph.engine import batch_plan
from attrgraph.engine.autograd_rows import backward_rows
from attrgraph.engine.linear_backward import linear_rows, unsupported_reason
from attrgraph.engine.replacement import ReplacementModel
from attrgraph.engine.sources import Injection, build_sources, feature_injections
from attrgraph.engine.targets import select_logit_targets
from tests.attrgraph.ag_helpers import (
    ARCHS,
    BLOCK_ARCHS,
    TRANSCODERS,
    tiny_attn_saes,
    tiny_model,
    tiny_transcoders,
)

TOKENS = torch.tensor([0, 5, 9, 3, 17, 22, 5, 9, 31, 2])


def injections_for(rm, state):
    feats = build_sources(rm, state).features
    inj = [
        Injection(rm.tc.encoder_vectors(int(l), torch.tensor([int(f)]))[0].detach(), int(p), layer=int(l))
        for l, p, f in feats.tolist()
    ]
    n = len(state.tokens)
    for t in select_logit_targets(state.logits[-1], 5, 0.99):
        inj.append(Injection(t.vector, n - 1, logits=True))
    d_vocab = state.logits.shape[-1]
    inj.append(
        Injection(
            torch.randn(d_vocab, generator=torch.Generator().manual_seed(0)).to(state.logits), 3, logits=True
        )
    )
    return inj


@pytest.mark.parametrize("arch", ARCHS + BLOCK_ARCHS)
@pytest.mark.parametrize("kind,skip", TRANSCODERS)
@pytest.mark.parametrize("exclude_bos", [True, False])
def test_linear_rows_equal_autograd_rows(arch, kind, skip, exclude_bos):
    model = tiny_model(arch)
    rm = ReplacementModel(model, tiny_transcoders(model, kind, skip))
    state = rm.run(TOKENS, exclude_bos=exclude_bos)
    sources = build_sources(rm, state)
    inj = injections_for(rm, state)
    assert unsupported_reason(rm, inj) is None
    ref = backward_rows(rm, state, sources, inj, batch_size=16).toarray()
    stats = {}
    fast = linear_rows(rm, state, sources, inj, batch_size=7, stats=stats).toarray()
    assert ref.shape == fast.shape and np.abs(ref).max() > 0
    np.testing.assert_allclose(fast, ref, rtol=0, atol=1e-9 * np.abs(ref).max())
    assert stats["flops"] > 0


def test_linear_rows_float32_one_batch_per_target():
    model = tiny_model("gpt2", torch.float32)
    rm = ReplacementModel(model, tiny_transcoders(model, "clt", True))
    state = rm.run(TOKENS)
    sources = build_sources(rm, state)
    inj = injections_for(rm, state)
    ref = backward_rows(rm, state, sources, inj).toarray()
    fast = linear_rows(rm, state, sources, inj, batch_size=1).toarray()
    np.testing.assert_allclose(fast, ref, rtol=0, atol=1e-5 * np.abs(ref).max())


def test_custom_hook_targets_are_refused():
    model = tiny_model("gpt2")
    rm = ReplacementModel(model, tiny_transcoders(model))
    state = rm.run(TOKENS)
    inj = [Injection(torch.ones(16, dtype=torch.float64), 2, hook="blocks.1.hook_resid_pre")]
    assert "hook" in unsupported_reason(rm, inj)
    with pytest.raises(NotImplementedError, match="autograd"):
        linear_rows(rm, state, build_sources(rm, state), inj)


def test_attribute_backends_agree_end_to_end():
    from attrgraph.engine.attribute import attribute

    model = tiny_model("gemma2", torch.float32)
    rm = ReplacementModel(model, tiny_transcoders(model, "plt", True))
    ref = attribute(model, rm, TOKENS, backend="autograd")
    fast = attribute(model, rm, TOKENS, backend="linear")
    assert fast.meta["backend"] == "linear" and ref.n_nodes == fast.n_nodes
    scale = np.abs(ref.adjacency).max()
    assert np.abs(fast.adjacency - ref.adjacency).max() <= 1e-5 * scale
    np.testing.assert_allclose(fast.nodes.influence, ref.nodes.influence, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("kind", ["plt", "clt"])
def test_batches_split_by_working_set_give_the_same_rows(kind, monkeypatch):

    model = tiny_model("gpt2")
    rm = ReplacementModel(model, tiny_transcoders(model, kind, True))
    state = rm.run(TOKENS)
    sources = build_sources(rm, state)
    inj = injections_for(rm, state)
    whole = linear_rows(rm, state, sources, inj, batch_size=len(inj)).toarray()
    monkeypatch.setattr(batch_plan, "WORK_BYTES", 1)
    monkeypatch.setattr(batch_plan, "MIN_ROWS", 2)
    stats = {}
    split = linear_rows(rm, state, sources, inj, batch_size=len(inj), stats=stats).toarray()
    np.testing.assert_allclose(split, whole, rtol=0, atol=1e-12 * np.abs(whole).max())
    assert stats["seconds_backward"] > 0


@pytest.mark.parametrize("arch", ARCHS + BLOCK_ARCHS)
@pytest.mark.parametrize("kind,skip", TRANSCODERS)
@pytest.mark.parametrize("exclude_bos", [True, False])
def test_linear_rows_equal_autograd_rows_with_attention_features(arch, kind, skip, exclude_bos):
    model = tiny_model(arch)
    rm = ReplacementModel(model, [tiny_transcoders(model, kind, skip), tiny_attn_saes(model)])
    state = rm.run(TOKENS, exclude_bos=exclude_bos)
    sources = build_sources(rm, state)
    assert sources.attn.any() and (~sources.attn).any()
    inj = feature_injections(rm, sources.features, sources.attn) + injections_for(rm, state)[-3:]
    assert {j.site for j in inj} == {"attn", "mlp"}
    ref = backward_rows(rm, state, sources, inj, batch_size=16).toarray()
    fast = linear_rows(rm, state, sources, inj, batch_size=7).toarray()
    assert ref.shape == fast.shape and np.abs(ref).max() > 0
    # attention error and feature columns are reached
    n_pos = len(TOKENS)
    c = sources.error_column(0, "attn")
    assert np.abs(ref[:, c : c + n_pos - sources.n_excluded]).max() > 0
    np.testing.assert_allclose(fast, ref, rtol=0, atol=1e-9 * np.abs(ref).max())


@pytest.mark.parametrize("kind,attn", [("plt", False), ("clt", False), ("plt", True)])
def test_batches_mixing_positions_give_the_same_rows_and_flops(kind, attn, monkeypatch):
    """Runs shorter than MIN_ROWS are merged into batches of several positions: the rows do not
    change, and neither does the flop count (only what each row needs is counted); with an
    attention set too (attention feature targets, attention write sites)."""

    model = tiny_model("llama")
    tc = tiny_transcoders(model, kind, True)
    rm = ReplacementModel(model, [tc, tiny_attn_saes(model)] if attn else tc)
    state = rm.run(TOKENS)
    sources = build_sources(rm, state)
    inj = injections_for(rm, state)
    if attn:
        inj = feature_injections(rm, sources.features, sources.attn) + inj[-3:]
    alone = {}
    one = linear_rows(rm, state, sources, inj, batch_size=1, stats=alone).toarray()
    monkeypatch.setattr(batch_plan, "MIN_ROWS", 10**6)  # every run is short: one batch per start
    mixed = {}
    merged = linear_rows(rm, state, sources, inj, batch_size=len(inj), stats=mixed).toarray()
    assert mixed["batches"] <= (2 if attn else 1) * rm.cfg.n_layers + 1 < alone["batches"]
    np.testing.assert_allclose(merged, one, rtol=0, atol=1e-12 * np.abs(one).max())
    assert mixed["flops"] == pytest.approx(alone["flops"], rel=1e-12)


def test_padded_decoder_columns_never_reach_other_columns():
    """Each position's decoders are padded to PAD_COLUMNS columns, whose products spill into the
    next positions' columns before those are written; with every group padded the most, the
    rows still equal the autograd rows."""
    import attrgraph.engine.linear_backward as lb

    model = tiny_model("gpt2")
    rm = ReplacementModel(model, tiny_transcoders(model, "clt", True))
    state = rm.run(TOKENS)
    sources = build_sources(rm, state)
    inj = injections_for(rm, state)
    ref = backward_rows(rm, state, sources, inj, batch_size=16).toarray()
    widths = {k for (_, _, c0, c1) in sources.groups for k in [c1 - c0]}
    assert max(widths) < lb.PAD_COLUMNS  # every group spills
    fast = linear_rows(rm, state, sources, inj, batch_size=5).toarray()
    np.testing.assert_allclose(fast, ref, rtol=0, atol=1e-9 * np.abs(ref).max())


@pytest.mark.parametrize("arch", ["gpt2", "gemma2"])
def test_blocked_causal_pattern_product_gives_the_same_rows(arch, monkeypatch):
    """Long prompts take the pattern product in blocks of key rows, each skipping the queries before
    it: with blocks of 2 rows on a 10-token prompt, the rows still equal the autograd rows."""
    import attrgraph.engine.linear_backward as lb

    model = tiny_model(arch)
    rm = ReplacementModel(model, tiny_transcoders(model, "plt", True))
    state = rm.run(TOKENS)
    sources = build_sources(rm, state)
    inj = injections_for(rm, state)
    ref = backward_rows(rm, state, sources, inj, batch_size=16).toarray()
    monkeypatch.setattr(lb, "TRIANGLE_ROWS", 2)
    fast = linear_rows(rm, state, sources, inj, batch_size=5).toarray()
    np.testing.assert_allclose(fast, ref, rtol=0, atol=1e-9 * np.abs(ref).max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("n", [1, 5, 8, 33])
def test_stored_patterns_rows_start_on_16_byte_boundaries(dtype, n):
    """`aligned_rows` (the stored attention patterns): the same values, rows that start every 16
    bytes (what cuBLAS's vectorized kernels need of a leading dimension), and a causal block of it
    multiplies as the contiguous matrix does."""
    from attrgraph.engine.linear_backward import aligned_rows

    t = torch.randn(3, n, n, generator=torch.Generator().manual_seed(n)).to(dtype)
    got = aligned_rows(t)
    assert got.dtype == dtype and torch.equal(got, t)
    assert got.stride(-1) == 1 and got.stride(-2) * got.element_size() % 16 == 0
    x = torch.randn(3, n, 7, generator=torch.Generator().manual_seed(1)).to(dtype)
    p = max(1, n - 1)
    assert torch.equal(torch.bmm(got[:, :p, :p], x[:, :p]), torch.bmm(t[:, :p, :p].contiguous(), x[:, :p]))

"""The sparse TopK step equals the dense one: output, losses and every gradient, with and without
dead features, skip, PLT and SAE; its pieces against their dense definitions."""

import pytest
import torch

from tests.transcoders.tc_helpers import random_set
from transcoders.losses import mse_loss, topk_aux_loss
from transcoders.sparse_topk import TopKOutput, TopKStep, dead_topk, sparse_code, supports, topk_indices

K, K_AUX = 8, 16  # random_set keeps k = 8


def trained_like(kind="plt", skip=False, d_sae=48, seed=0):
    """A TopK set with non-zero biases (and skip), so that no term vanishes by accident."""
    tc = random_set(kind, "topk", skip=skip, d_sae=d_sae, seed=seed)
    g = torch.Generator().manual_seed(seed + 7)
    with torch.no_grad():
        for p in tc.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return tc


def batch(n=40, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 2, 32, generator=g), torch.randn(n, 2, 32, generator=g)


def dense_loss(tc, x, y, dead):
    res = tc(x)
    loss = mse_loss(res.out, y)
    if dead is not None:
        loss = loss + topk_aux_loss(tc, res.pre_acts, y - res.out, dead, K_AUX) / 32
    return res, loss


def grads(tc, loss):
    tc.zero_grad(set_to_none=True)
    loss.backward()
    return {n: p.grad.clone() for n, p in tc.named_parameters()}


def dead_mask(d_sae, per_layer):
    dead = torch.zeros(2, d_sae, dtype=torch.bool)
    g = torch.Generator().manual_seed(3)
    for l, n in enumerate(per_layer):
        dead[l, torch.randperm(d_sae, generator=g)[:n]] = True
    return dead


@pytest.mark.parametrize(
    "kind, skip, dead_counts",
    [
        ("plt", False, None),  # no AuxK
        ("plt", False, (0, 0)),  # AuxK on, nothing dead: 0
        ("plt", True, (20, 30)),  # more dead than k_aux in both layers: a top-k among dead columns
        ("plt", False, (3, 9)),  # fewer than k_aux: every dead column, layer 0 padded
        ("sae", False, (15, 2)),
    ],
)
def test_sparse_step_equals_dense(kind, skip, dead_counts):
    tc = trained_like(kind, skip)
    x, y = batch()
    dead = dead_mask(tc.d_sae, dead_counts) if dead_counts else None
    res, want_loss = dense_loss(tc, x, y, dead)
    want = grads(tc, want_loss)

    step = TopKStep(tc, K_AUX)
    got = step(x, y, dead)
    loss = mse_loss(got.out, y) + got.aux_loss / 32
    have = grads(tc, loss)

    torch.testing.assert_close(got.out, res.out, atol=1e-6, rtol=1e-5)
    dense_acts = torch.zeros_like(res.acts).scatter(-1, got.indices, got.acts)
    torch.testing.assert_close(dense_acts, res.acts, atol=0, rtol=0)
    torch.testing.assert_close(loss, want_loss, atol=1e-7, rtol=1e-6)
    if dead_counts and sum(dead_counts):
        assert got.aux_loss > 0
    assert have.keys() == want.keys()
    for n in want:
        torch.testing.assert_close(have[n], want[n], atol=1e-7, rtol=1e-5, msg=lambda m, n=n: f"{n}: {m}")
    assert torch.equal(got.fired(tc.d_sae), (res.acts > 0).any(0))
    assert got.l0() == pytest.approx(float((res.acts > 0).float().sum(-1).mean()))


def test_sparse_code_equals_the_dense_products_and_its_gradients_check():
    g = torch.Generator().manual_seed(0)
    B, L, D, S, k, m = 7, 3, 5, 11, 4, 3
    x = torch.randn(B, L, D, generator=g, dtype=torch.float64, requires_grad=True)
    W_enc = torch.randn(L, D, S, generator=g, dtype=torch.float64, requires_grad=True)
    b_enc = torch.randn(L, S, generator=g, dtype=torch.float64, requires_grad=True)
    W_dec = torch.randn(L, S, D, generator=g, dtype=torch.float64, requires_grad=True)
    h = torch.einsum("bld,lds->bls", x, W_enc) + b_enc
    idx = h.detach().topk(k, dim=-1).indices
    aux_idx = torch.randint(0, S, (B, L, m), generator=g)  # repeats and overlaps with idx add up
    aux_idx[0, 0] = torch.tensor([2, 2, int(idx[0, 0, 0])])
    valid = torch.ones(1, L, m, dtype=torch.bool)
    valid[0, 1, 2] = False  # layer 1 has fewer dead features than selected

    def dense(x, W_enc, b_enc, W_dec):
        h = torch.einsum("bld,lds->bls", x, W_enc) + b_enc
        a = torch.zeros_like(h).scatter(-1, idx, h.gather(-1, idx).relu())
        a_aux = torch.zeros_like(h).scatter_add(
            -1, aux_idx, torch.where(valid, h.gather(-1, aux_idx).relu(), 0.0)
        )
        return (
            a.gather(-1, idx),
            torch.einsum("bls,lsd->bld", a, W_dec),
            torch.einsum("bls,lsd->bld", a_aux, W_dec),
        )

    def sparse(x, W_enc, b_enc, W_dec):  # h passes in detached: gradients come from sparse_code alone
        h = torch.einsum("bld,lds->bls", x, W_enc) + b_enc
        return sparse_code(x, W_enc, b_enc, W_dec, h, idx, (aux_idx, valid))

    args = (x, W_enc, b_enc, W_dec)
    for got, want in zip(sparse(*args), dense(*args), strict=True):
        torch.testing.assert_close(got, want)
    assert torch.autograd.gradcheck(sparse, args)
    w = [torch.randn(t.shape, generator=g, dtype=torch.float64) for t in dense(*args)]
    want = torch.autograd.grad(sum((t * v).sum() for t, v in zip(dense(*args), w)), args)
    got = torch.autograd.grad(sum((t * v).sum() for t, v in zip(sparse(*args), w)), args)
    for a, e in zip(got, want, strict=True):
        torch.testing.assert_close(a, e)
    acts, out, aux_out = sparse_code(x, W_enc, b_enc, W_dec, h, idx)  # without AuxK
    assert aux_out is None
    torch.testing.assert_close(out, dense(*args)[1])


def test_dead_topk_searches_dead_columns_only():
    h = torch.tensor([[[5.0, 1.0, 3.0, 2.0, 4.0], [1.0, 2.0, 3.0, 4.0, 5.0]]])
    dead = torch.tensor([[False, True, True, True, False], [True, False, False, False, False]])
    idx, valid = dead_topk(h, dead, 2)
    assert idx[0, 0].tolist() == [2, 3] and valid[0, 0].tolist() == [True, True]
    assert idx[0, 1, 0].item() == 0 and valid[0, 1].tolist() == [True, False]
    assert dead_topk(h, torch.zeros_like(dead), 2) is None


def test_supports_only_per_layer_topk():
    assert supports(random_set("plt", "topk")) and supports(random_set("sae", "topk"))
    others = [("clt", "topk"), ("plt", "batchtopk"), ("plt", "jumprelu"), ("sae", "relu")]
    assert not any(supports(random_set(kind, act)) for kind, act in others)


@pytest.mark.parametrize("shape, k", [((64, 3, 1024), 32), ((50, 2, 48), 8), ((10, 200), 7), ((10, 30), 8)])
def test_topk_indices_is_the_top_k_set(shape, k):
    h = torch.randn(shape, generator=torch.Generator().manual_seed(0))
    h[0, ..., :] = h[0, ..., :1]  # one row of ties: any k of equal value
    got = topk_indices(h, k)
    want = h.topk(k, dim=-1).indices
    assert got.shape == want.shape
    torch.testing.assert_close(
        h.gather(-1, got).sort(-1).values, h.gather(-1, want).sort(-1).values, atol=0, rtol=0
    )
    assert torch.equal(got[1:].sort(-1).values, want[1:].sort(-1).values)


@pytest.mark.parametrize("dead_counts", [None, (20, 3)])
def test_the_trainers_two_steps_agree(dead_counts):
    """trainer.py's step module, sparse (`TopKStep`) or the coder's own `train_forward`, returns the same
    loss, MSE, fired features, L0 and gradients for a TopK PLT (AuxK weighted 1/32, lambda ignored: TopK
    has no penalty). Expected: the dense definition above (`dense_loss`)."""
    from transcoders.base import LossWeights
    from transcoders.distributed import Dist
    from transcoders.trainer import CoderStep

    tc = trained_like("plt", skip=True)
    x, y = batch()
    dead = dead_mask(tc.d_sae, dead_counts) if dead_counts else None
    res, want_loss = dense_loss(tc, x, y, dead)
    want = grads(tc, want_loss)
    weights = LossWeights(auxk_coef=1 / 32 if dead is not None else 0.0)
    for sparse in (True, False):
        got = CoderStep(tc, weights, Dist(), sparse)(x, y, 0.5, dead)
        torch.testing.assert_close(got.loss, want_loss, atol=1e-7, rtol=1e-6)
        torch.testing.assert_close(got.mse, mse_loss(res.out, y), atol=1e-7, rtol=1e-6)
        assert torch.equal(got.fired, (res.acts > 0).any(0))
        assert got.l0.item() == pytest.approx((res.acts > 0).sum(-1).float().mean().item())
        have = grads(tc, got.loss)
        for n in want:
            torch.testing.assert_close(have[n], want[n], atol=1e-6, rtol=1e-5)


def test_fired_marks_features_active_for_some_token():
    """`TopKOutput.fired`, by brute force over a hand-built batch: a feature selected with activation 0
    for every token (token 0's feature 3, layer 1's feature 2) has not fired; one selected twice, once
    at 0 and once above (layer 0's feature 1), has."""
    indices = torch.tensor([[[1, 3], [2, 0]], [[1, 4], [0, 2]]])  # [batch 2, layers 2, k 2]
    acts = torch.tensor([[[0.0, 0.0], [0.0, 0.5]], [[0.7, 0.2], [0.3, 0.0]]])
    out = TopKOutput(torch.zeros(2, 2, 8), indices, acts, torch.zeros(()))
    expected = torch.zeros(2, 6, dtype=torch.bool)
    for b in range(2):
        for layer in range(2):
            for j in range(2):
                if acts[b, layer, j] > 0:
                    expected[layer, indices[b, layer, j]] = True
    assert expected.sum() == 3  # (0, 1), (0, 4), (1, 0) (twice), and nothing else
    assert torch.equal(out.fired(6), expected)

"""EAP and PEAP scores against brute-force patching of single edges (finite differences)."""

import pytest
import torch

from attrgraph.circuits.eap import eap, example_scores
from attrgraph.circuits.graph import ComponentGraph
from attrgraph.circuits.pairs import last_logits, metric
from attrgraph.circuits.patching import record_run, run_edges

EPS = 1e-6


def _metric(model, pairs, **kw):
    with torch.no_grad():
        return metric(last_logits(run_edges(model, pairs.clean, **kw).logits, pairs.last), pairs)


def test_unpatched_run_is_the_model_and_all_patched_is_the_corrupted_run(model64, pairs):
    g = ComponentGraph.from_model(model64)
    corr = record_run(model64, pairs.corrupt)
    with torch.no_grad():
        assert torch.allclose(run_edges(model64, pairs.clean).logits, model64(pairs.clean), atol=1e-12)
        zero = torch.zeros(g.n_up, g.n_down, dtype=torch.float64)
        got = run_edges(model64, pairs.clean, corrupt=corr, keep=zero).logits
        assert torch.allclose(got, model64(pairs.corrupt), atol=1e-12)
    assert not model64.cfg.use_split_qkv_input  # flags restored


def test_graph_counts_and_causal_mask(model64):
    g = ComponentGraph.from_model(model64)
    assert (g.n_up, g.n_down) == (11, 27)
    # layer-0 heads read the input only; layer-1 heads read 6 upstream nodes; m1 reads 10
    assert g.n_edges == 1 * 12 + 5 + 6 * 12 + 10 + 11
    assert not g.valid[g.up_head(1, 0), g.down_head(1, 0, 0)]
    assert g.valid[g.up_head(1, 0), g.down_mlp(1)]


def test_eap_equals_finite_difference_of_single_edge_patching(model64, pairs):
    g = ComponentGraph.from_model(model64)
    ex = example_scores(model64, pairs)
    per_example = ex.resid.sum(1)
    corr = record_run(model64, pairs.corrupt)
    m0 = _metric(model64, pairs)
    edges = [
        (0, g.down_head(0, 0, 1)),
        (g.up_head(0, 2), g.down_head(1, 1, 3)),
        (g.up_head(0, 1), g.down_mlp(0)),
        (g.up_mlp(0), g.down_head(1, 2, 0)),
        (g.up_mlp(1), g.down_logits),
    ]
    for u, d in edges:
        keep = torch.ones(g.n_up, g.n_down, dtype=torch.float64)
        keep[u, d] = 1 - EPS
        fd = (_metric(model64, pairs, corrupt=corr, keep=keep) - m0) / EPS
        assert torch.allclose(fd, per_example[:, u, d], rtol=1e-4, atol=1e-7), g.edge_name(u, d)
    # positional: one edge at one position
    t, d = 4, g.down_head(1, 2, 1)
    keep = torch.ones(7, g.n_up, g.n_down, dtype=torch.float64)
    keep[t, 0, d] = 1 - EPS
    fd = (_metric(model64, pairs, corrupt=corr, keep=keep) - m0) / EPS
    assert torch.allclose(fd, ex.resid[:, t, 0, d], rtol=1e-4, atol=1e-7)
    # non-positional scores are the mean over examples of the sum over positions
    assert torch.allclose(eap(model64, pairs).resid, per_example.mean(0))


def test_sum_identity_of_the_first_order_term(model64, pairs):
    """Moving every edge eps toward corrupted changes M by eps * (sum of all edge scores)."""
    g = ComponentGraph.from_model(model64)
    ex = example_scores(model64, pairs)
    corr = record_run(model64, pairs.corrupt)
    keep = torch.full((g.n_up, g.n_down), 1 - EPS, dtype=torch.float64)
    fd = (_metric(model64, pairs, corrupt=corr, keep=keep) - _metric(model64, pairs)) / EPS
    assert torch.allclose(fd, ex.resid.sum((1, 2, 3)), rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("slot", [0, 1, 2])
def test_cross_position_scores_match_patched_head_output(model64, pairs, slot):
    """PEAP eqs. 4-6: (z*_t - z_t) . grad_z M, with z* from a real patched forward."""
    ex = example_scores(model64, pairs, cross_position=True)
    corr = record_run(model64, pairs.corrupt)
    run = run_edges(model64, pairs.clean, corrupt=corr)
    grad = torch.autograd.grad(metric(last_logits(run.logits, pairs.last), pairs).sum(), run.results[0])[0]
    for layer, h, t, tp in [(0, 1, 6, 2), (0, 3, 5, 5), (0, 0, 6, 0)]:
        ak = torch.ones(1, 2, 4, 3, 7, 7, dtype=torch.float64)
        ak[0, layer, h, slot, t, tp] = 0
        with torch.no_grad():
            patched = run_edges(model64, pairs.clean, corrupt=corr, attn_keep=ak).results[layer]
            clean = run_edges(model64, pairs.clean).results[layer]
        changed = (patched - clean).abs().sum(-1) > 0
        assert not changed[:, [p for p in range(7) if p != t]].any()  # only the query position moves
        want = ((patched[:, t, h] - clean[:, t, h]) * grad[:, t, h]).sum(-1)
        assert torch.allclose(ex.attn[:, layer, h, slot, t, tp], want, rtol=1e-6, atol=1e-10)
    assert (ex.attn[..., torch.ones(7, 7, dtype=torch.bool).triu(1)] == 0).all()


def test_value_edge_scores_are_first_order_taylor_terms(model64, pairs):
    ex = example_scores(model64, pairs, cross_position=True)
    corr = record_run(model64, pairs.corrupt)
    ak = torch.ones(1, 2, 4, 3, 7, 7, dtype=torch.float64)
    ak[0, 1, 2, 2, 6, 3] = 1 - EPS
    fd = (_metric(model64, pairs, corrupt=corr, attn_keep=ak) - _metric(model64, pairs)) / EPS
    assert torch.allclose(fd, ex.attn[:, 1, 2, 2, 6, 3], rtol=1e-4, atol=1e-7)


def test_eap_ig_with_one_step_is_eap(model64, pairs):
    assert torch.allclose(eap(model64, pairs, ig_steps=1).resid, eap(model64, pairs).resid, atol=1e-12)
    ig = eap(model64, pairs, ig_steps=3).resid
    assert ig.shape == (11, 27) and not torch.allclose(ig, eap(model64, pairs).resid)


def test_eap_ig_is_complete_on_the_input_edges(model64, pairs):
    """IG's completeness (Hanna et al., 2024, "EAP-IG-inputs"): the input node feeds every downstream
    input, so the edges out of it sum to (z*_in - z_in) . mean_k grad_{z_in} M(alpha_k), and with
    alpha_k = k/m this is a right Riemann sum of the path integral along z*_in + alpha (z_in - z*_in),
    whose exact value is M(corrupted) - M(clean) (alpha = 0 is the corrupted run: nothing downstream
    of the input sees the tokens). The sum's error is c/m + O(1/m^2): it halves when m doubles, and
    the Richardson extrapolation 2 S_2m - S_m removes the 1/m term. Plain EAP (one gradient at the
    clean run) misses the difference by several times its size on this nonlinear model."""
    assert ComponentGraph.from_model(model64).valid[0].all()  # the input feeds every downstream input
    d = None
    sums = {}
    for m in (0, 16, 32, 64):
        ex = example_scores(model64, pairs, ig_steps=m)
        sums[m] = ex.resid[:, :, 0, :].sum((1, 2))  # every edge out of the input, every position
        d = ex.metric_corrupt - ex.metric_clean
    scale = float(d.abs().max())
    assert scale > 0.1  # the corruption moves M, so the test has something to integrate
    err = {m: sums[m] - d for m in sums}
    for m in (16, 32):
        torch.testing.assert_close(err[2 * m] / err[m], torch.full_like(d, 0.5), atol=0.01, rtol=0)
    extrapolated = 2 * sums[64] - sums[32]
    torch.testing.assert_close(extrapolated, d, atol=5e-4 * scale, rtol=0)
    assert float(err[64].abs().max()) < 0.06 * scale  # measured 0.047
    assert float(err[0].abs().max()) > 2 * scale  # plain EAP: measured 3.7

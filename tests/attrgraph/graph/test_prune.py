"""Influence and pruning: hand-built known answers, the dense formula, and properties."""

from dataclasses import replace

import numpy as np
import pytest
import scipy.sparse as sp

from attrgraph.errors import GraphError
from attrgraph.graph.prune import (
    compute_influence,
    find_threshold,
    influence_shares,
    normalize_matrix,
    prune_graph,
)
from attrgraph.graph.streamed_influence import logit_influence
from tests.attrgraph.ag_helpers import bars_finished, graph_from_dense, random_graph

# e0 -> f1 (3); f1 -> f2 (-2), e0 -> f2 (2); f2 -> logit (1), e0 -> logit (1)
CHAIN_KINDS = ["embedding", "feature", "feature", "logit"]
CHAIN = np.array(
    [
        [0, 0, 0, 0],
        [3, 0, 0, 0],
        [2, -2, 0, 0],
        [1, 0, 1, 0],
    ],
    float,
)


def dense_influence(graph):
    A = normalize_matrix(graph.adjacency).toarray()
    n = A.shape[0]
    B = np.linalg.inv(np.eye(n) - A) - np.eye(n)
    return B.T @ graph.logit_weights()


def test_normalize_rows_sum_to_one_and_empty_rows_stay_zero(make_random_graph):
    g = make_random_graph(0)
    A = normalize_matrix(g.adjacency).toarray()
    sums = A.sum(1)
    has_inputs = np.abs(g.dense()).sum(1) > 0
    np.testing.assert_allclose(sums[has_inputs], 1.0, rtol=1e-12)
    assert np.all(sums[~has_inputs] == 0)
    assert np.all(A >= 0)


def test_known_chain_influence(make_graph_from_dense):
    g = make_graph_from_dense(CHAIN_KINDS, CHAIN, layers=[-1, 0, 1, 2], logit_probs=[1.0])
    infl = compute_influence(normalize_matrix(g.adjacency), g.logit_weights())
    # f2 = 0.5 (direct), f1 = 0.5 * 0.5, e0 = 0.5 + 0.5 * 0.5 + 1 * 0.25
    np.testing.assert_allclose(infl, [1.0, 0.25, 0.5, 0.0], rtol=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_triangular_solve_equals_dense_inverse(make_random_graph, seed):
    g = make_random_graph(seed, n_feat=15 + 10 * seed)
    got = compute_influence(normalize_matrix(g.adjacency), g.logit_weights())
    np.testing.assert_allclose(got, dense_influence(g), rtol=1e-10, atol=1e-14)
    assert np.all(got >= 0)


def test_non_triangular_adjacency_is_rejected():
    A = sp.csr_array(np.array([[0.0, 1.0], [0.0, 0.0]]))
    with pytest.raises(GraphError, match="lower-triangular"):
        compute_influence(A, np.array([0.0, 1.0]))


def test_find_threshold_known_answer():
    scores = np.array([1.0, 5.0, 1.0, 3.0])
    assert find_threshold(scores, 0.75) == 3.0  # 5 + 3 = 0.8 of 10 reaches 0.75
    assert find_threshold(scores, 0.4) == 5.0
    assert find_threshold(scores, 1.0) == -np.inf
    with pytest.raises(GraphError):
        find_threshold(scores, 1.5)


def test_find_threshold_at_an_exact_tie_keeps_the_node_that_reaches_it():
    """Cumulative shares 0.4, 0.7, 0.9, 1.0: at 0.7 the second score reaches the threshold exactly,
    which counts as reached (circuit-tracer's find_threshold, `searchsorted` with side "left",
    gives 3.0; "right" would give 2.0 and keep one node more)."""
    assert find_threshold(np.array([4.0, 3.0, 2.0, 1.0]), 0.7) == 3.0
    assert find_threshold(np.array([1.0, 2.0, 3.0, 4.0]), 0.4) == 4.0


def test_known_chain_pruning(make_graph_from_dense):
    g = make_graph_from_dense(CHAIN_KINDS, CHAIN, layers=[-1, 0, 1, 2], logit_probs=[1.0])
    # influences e0 1.0, f2 0.5, f1 0.25 (total 1.75): 1.5/1.75 = 0.857 >= 0.8 drops f1 only
    p = prune_graph(g, node_threshold=0.8, edge_threshold=1.0)
    assert p.nodes.kind.tolist() == ["embedding", "feature", "logit"]
    np.testing.assert_allclose(p.dense(), [[0, 0, 0], [2, 0, 0], [1, 1, 0]])
    # recomputed on the pruned graph: f2 = 0.5, e0 = 0.5 + 0.5
    np.testing.assert_allclose(p.nodes.influence, [1.0, 0.5, 0.0])
    # equal edge scores (all 0.5) are ties: any threshold keeps all three
    assert prune_graph(g, 0.8, 0.3).n_edges == 3
    # logit reads f2 with 3 and e0 with 1: scores e0->f2 0.75, f2->logit 0.75, e0->logit 0.25
    B = CHAIN.copy()
    B[3] = [1, 0, 3, 0]
    g2 = make_graph_from_dense(CHAIN_KINDS, B, layers=[-1, 0, 1, 2], logit_probs=[1.0])
    p2 = prune_graph(g2, node_threshold=0.8, edge_threshold=0.8)
    np.testing.assert_allclose(p2.dense(), [[0, 0, 0], [2, 0, 0], [0, 3, 0]])


def test_thresholds_of_one_keep_everything(make_random_graph):
    g = make_random_graph(3, n_feat=40)
    p = prune_graph(g, node_threshold=1.0, edge_threshold=1.0, rule="appendix")
    assert p.n_nodes == g.n_nodes
    np.testing.assert_array_equal(p.dense(), g.dense())
    np.testing.assert_allclose(p.nodes.influence, dense_influence(g), rtol=1e-5, atol=1e-7)


def test_pruning_keeps_embeddings_errors_logits_and_shrinks(make_random_graph):
    g = make_random_graph(4, n_feat=60, density=0.3)
    p = prune_graph(g, rule="appendix")
    for kind in ("embedding", "error", "logit"):
        assert (p.nodes.kind == kind).sum() == (g.nodes.kind == kind).sum()
    assert p.n_features < g.n_features
    assert p.n_edges < g.n_edges
    assert np.all(p.nodes.influence >= 0)
    assert p.meta["pruned"] and p.meta["node_threshold"] == 0.8 and p.meta["prune_rule"] == "appendix"
    # every kept feature still has an outgoing edge
    out_deg = (p.dense() != 0).sum(0)
    assert np.all(out_deg[p.nodes.kind == "feature"] > 0)


def test_more_lenient_threshold_keeps_more(make_random_graph):
    g = make_random_graph(5, n_feat=60, density=0.3)
    sizes = [prune_graph(g, t, 0.98).n_features for t in (0.5, 0.8, 0.95)]
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1]


@pytest.mark.parametrize("seed", range(3))
def test_pruning_influence_equals_the_dense_formula(make_random_graph, seed):
    """prune_graph's streamed influence (streamed_influence.row_blocks, with edges inside a layer
    in these random graphs) against `(I - A)^-1 - I` with a dense inverse: the node step keeps
    exactly the features the dense influence keeps, and thresholds of 1.0 fill in the dense values."""
    g = make_random_graph(seed, n_feat=40)
    dense = dense_influence(g)
    kept = prune_graph(g, 1.0, 1.0)
    assert kept.nodes.influence.dtype == np.float64  # as computed, not rounded to float32
    np.testing.assert_allclose(kept.nodes.influence, dense, rtol=1e-10, atol=1e-14)
    is_feature = g.nodes.kind == "feature"
    cutoff = find_threshold(dense[g.nodes.kind != "logit"], 0.6)
    expect = set(np.flatnonzero(is_feature & (dense >= cutoff)).tolist())
    pruned = prune_graph(g, 0.6, 1.0)
    got = {
        int(np.flatnonzero(is_feature & (g.nodes.feature == f))[0])
        for f in pruned.nodes.feature[pruned.nodes.kind == "feature"]
    }
    assert got == expect and 0 < len(expect) < is_feature.sum()


def test_pruning_progress_shows_each_influence_pass(make_random_graph, capsys):
    prune_graph(make_random_graph(0, n_feat=60), progress=True)
    assert bars_finished(capsys.readouterr().err, "influence") == 2  # what the user sees, not redraws
    prune_graph(make_random_graph(0, n_feat=60))
    assert capsys.readouterr().err == ""


def test_pruning_sums_duplicate_entries_before_taking_magnitudes(make_graph_from_dense):
    """The chain's edge f1 -> f2 (-2) stored as two entries, -3 and +1: the known influence
    (test_known_chain_influence) is that of their sum, as normalize_matrix gives it."""
    g = make_graph_from_dense(CHAIN_KINDS, CHAIN, layers=[-1, 0, 1, 2], logit_probs=[1.0])
    indptr = np.array([0, 0, 1, 4, 6])
    indices = np.array([0, 0, 1, 1, 0, 2])
    data = np.array([3, 2, -3, 1, 1, 1], np.float32)
    g.adjacency = sp.csr_array((data, indices, indptr), shape=(4, 4))
    assert not g.adjacency.has_canonical_format
    np.testing.assert_allclose(prune_graph(g, 1.0, 1.0).nodes.influence, [1.0, 0.25, 0.5, 0.0], rtol=1e-6)


def test_pruning_a_graph_with_split_entries_equals_pruning_it_canonical(make_random_graph):
    """Every third edge stored as two entries (2x and -x): pruning keeps the same nodes and edges
    with the same influence as on the canonical graph."""
    g = make_random_graph(1, n_feat=60)
    A = g.adjacency.tocoo()
    split = np.arange(A.nnz) % 3 == 0
    rows = np.concatenate([A.row, A.row[split]])
    cols = np.concatenate([A.col, A.col[split]])
    data = np.concatenate([np.where(split, 2 * A.data, A.data), -A.data[split]])
    order = np.lexsort((cols, rows))
    indptr = np.searchsorted(rows[order], np.arange(A.shape[0] + 1))
    g_split = replace(g, adjacency=sp.csr_array((data[order], cols[order], indptr), shape=A.shape))
    assert not g_split.adjacency.has_canonical_format
    a, b = prune_graph(g, 0.7, 0.9), prune_graph(g_split, 0.7, 0.9)
    assert 0 < a.n_features < g.n_features
    for f in ("kind", "layer", "position", "feature"):
        np.testing.assert_array_equal(getattr(a.nodes, f), getattr(b.nodes, f))
    np.testing.assert_allclose(a.nodes.influence, b.nodes.influence, rtol=1e-5)
    assert abs(a.adjacency - b.adjacency).max() < 1e-5


def test_influence_and_pruning_of_a_graph_with_attention_nodes():
    """A real graph with attention features (attention before MLP within a layer): the streamed
    influence attribute stores (layer_blocks split by site) equals the dense formula, and pruning
    keeps every error node of both sites and prunes features of both sites by influence."""
    from tests.attrgraph.ag_helpers import attention_graph

    g = attention_graph()[0]
    dense = dense_influence(g)
    np.testing.assert_allclose(g.nodes.influence, dense, rtol=1e-5, atol=1e-7)
    kept = prune_graph(g, 1.0, 1.0, rule="appendix")
    np.testing.assert_allclose(kept.nodes.influence, dense, rtol=1e-6, atol=1e-9)
    pruned = prune_graph(g, 0.7, 0.95, rule="appendix")
    n, m = g.nodes, pruned.nodes
    for site in ("attn", "mlp"):
        assert m.mask("error", site).sum() == n.mask("error", site).sum()
        assert 0 < m.mask("feature", site).sum() < n.mask("feature", site).sum()
    coo = pruned.adjacency.tocoo()
    assert (coo.col < coo.row).all()


def test_given_influence_prunes_as_computing_it(make_random_graph, capsys):
    """`influence=` (attribute's pass) replaces the first pass and changes nothing else."""
    g = make_random_graph(1, n_feat=60)
    influence = logit_influence(g.adjacency, g.logit_weights()).influence
    want = prune_graph(g, 0.6, 0.9)
    capsys.readouterr()
    got = prune_graph(g, 0.6, 0.9, progress=True, influence=influence)
    assert capsys.readouterr().err.count("influence: 100%") == 1  # the node-pruned graph's only
    np.testing.assert_array_equal(got.nodes.feature, want.nodes.feature)
    np.testing.assert_array_equal(got.adjacency.toarray(), want.adjacency.toarray())
    np.testing.assert_array_equal(got.nodes.influence, want.nodes.influence)
    with pytest.raises(GraphError, match="shape"):
        prune_graph(g, influence=influence[:-1])
    with pytest.raises(GraphError, match="NaN"):
        prune_graph(g, influence=np.full(g.n_nodes, np.nan))


def reference_prune(g, node_threshold, edge_threshold, rule):
    """Steps 3-5 of prune.py written plainly on dense arrays, one node and one edge at a time:
    (kept node indices of `g`, pruned dense adjacency, influence on the kept nodes, number of
    nodes the last step removed). Influence is logit_influence's, which the tests above hold
    to the dense formula, so that everything here can be compared exactly. The rules as their
    sources state them: the appendix never prunes error nodes; circuit-tracer's `prune_graph`
    prunes them by influence and, after the edges, removes features and errors without an
    output and features without an input until none is left."""
    kind, w = g.nodes.kind, g.logit_weights()
    influence = logit_influence(g.adjacency, w).influence
    cutoff = find_threshold(influence[kind != "logit"], node_threshold)
    always = ("embedding", "logit") if rule == "circuit-tracer" else ("embedding", "logit", "error")
    nodes = [i for i in range(g.n_nodes) if kind[i] in always or influence[i] >= cutoff]
    D = g.dense()[np.ix_(nodes, nodes)]
    kind, w = kind[nodes], w[nodes]
    influence = logit_influence(sp.csr_array(D), w).influence
    score = np.zeros(D.shape)
    for t, s in zip(*np.nonzero(D)):
        row = [abs(float(x)) for x in D[t] if x != 0]  # |.| in float64, summed in column order
        score[t, s] = abs(float(D[t, s])) / sum(row) * (influence[t] + w[t])
    had_out = (D != 0).any(axis=0)
    edges = list(zip(*np.nonzero(D)))
    cutoff = find_threshold(np.array([score[t, s] for t, s in edges]), edge_threshold)
    for t, s in edges:
        if score[t, s] < cutoff:
            D[t, s] = 0.0
    keep = np.ones(len(nodes), bool)
    removed = 0
    changed = True
    while changed:  # one node at a time: the same fixed point as removing them all at once
        changed = False
        for f in np.flatnonzero(keep):
            has_out = (D[keep, f] != 0).any()
            has_in = (D[f, keep] != 0).any()
            if rule == "circuit-tracer":
                drop = kind[f] in ("feature", "error") and not has_out or kind[f] == "feature" and not has_in
            else:
                drop = kind[f] == "feature" and had_out[f] and not has_out
            if drop:
                keep[f], changed, removed = False, True, removed + 1
    kept = np.flatnonzero(keep)
    return np.asarray(nodes)[kept], D[np.ix_(kept, kept)], influence[kept], removed


@pytest.mark.parametrize("rule", ["appendix", "circuit-tracer"])
def test_pruning_equals_the_plain_reference_exactly(rule):
    """prune_graph (vectorized, streamed) against `reference_prune` on random graphs of several
    sizes, densities and thresholds (fixed seeds): the same nodes, bit for bit the same adjacency
    and influence, and the unpruned influence of every kept node; in some of the cases the last
    step removes nodes."""
    removed = 0
    for seed in range(12):
        rng = np.random.default_rng(100 + seed)
        g = random_graph(
            seed,
            n_feat=int(rng.integers(5, 70)),
            density=float(rng.uniform(0.05, 0.8)),
            n_logit=int(rng.integers(1, 4)),
        )
        full = logit_influence(g.adjacency, g.logit_weights()).influence
        for node_threshold, edge_threshold in ((0.8, 0.98), (0.6, 0.7), (1.0, 0.5), (0.5, 1.0), (0.9, 0.3)):
            got = prune_graph(g, node_threshold, edge_threshold, rule=rule)
            nodes, D, influence, n_removed = reference_prune(g, node_threshold, edge_threshold, rule)
            removed += n_removed
            for f in ("kind", "layer", "position", "feature"):
                np.testing.assert_array_equal(getattr(got.nodes, f), getattr(g.nodes, f)[nodes])
            np.testing.assert_array_equal(got.adjacency.toarray(), D)
            np.testing.assert_array_equal(got.nodes.influence, influence)
            np.testing.assert_array_equal(got.nodes.unpruned_influence, full[nodes])
            assert got.meta["prune_rule"] == rule
    assert removed > 0


# circuit-tracer's rule on a hand-built graph (our node order), every number worked out by hand:
#   F1 <- E1 (1), F1 <- E0 (1); F2 <- F1 (3), F2 <- R (1); logit <- F2 (6), F3 (2), E0 (1), R (1)
# normalized rows: logit F2 .6 F3 .2 E0 .1 R .1; F2 F1 .75 R .25; F1 E1 .5 E0 .5. Logit influence:
# F2 .6, F1 .45, E0 .1 + .225 = .325, R .1 + .15 = .25, E1 .225, F3 .2 (total 2.05); in that order
# the cumulative shares are .2927, .5122, .6707, .7927, .9024, 1.
HAND_NAMES = ["E0", "E1", "R", "F1", "F2", "F3", "logit"]
HAND_KINDS = ["embedding", "embedding", "error", "feature", "feature", "feature", "logit"]
HAND_LAYERS, HAND_POSITIONS = [-1, -1, 0, 0, 1, 1, 2], [0, 1, 1, 1, 1, 1, 1]
HAND_EDGES = {("E1", "F1"): 1, ("E0", "F1"): 1, ("F1", "F2"): 3, ("R", "F2"): 1}
HAND_EDGES |= {("F2", "logit"): 6, ("F3", "logit"): 2, ("E0", "logit"): 1, ("R", "logit"): 1}
HAND_INFLUENCE = {"E0": 0.325, "E1": 0.225, "R": 0.25, "F1": 0.45, "F2": 0.6, "F3": 0.2, "logit": 0.0}
HAND_SHARES = {"F2": 0.6, "F1": 1.05, "E0": 1.375, "R": 1.625, "E1": 1.85, "F3": 2.05, "logit": 2.05}
# (node threshold, edge threshold) -> (rule -> (kept nodes, kept edges))
HAND_CASES = {
    # cutoff .325 (E0's share .6707 first reaches .6): R (.25) and F3 (.2) go by influence
    (0.6, 1.0): {
        "circuit-tracer": ("E0 E1 F1 F2 logit", "E1-F1 E0-F1 F1-F2 F2-logit E0-logit"),
        "appendix": ("E0 E1 R F1 F2 logit", "E1-F1 E0-F1 F1-F2 R-F2 F2-logit E0-logit R-logit"),
    },
    # cutoff .2 keeps every node; F3 has no input: circuit-tracer's rule drops it, the appendix's not
    (0.95, 1.0): {
        "circuit-tracer": ("E0 E1 R F1 F2 logit", "E1-F1 E0-F1 F1-F2 R-F2 F2-logit E0-logit R-logit"),
        "appendix": ("E0 E1 R F1 F2 F3 logit", "E1-F1 E0-F1 F1-F2 R-F2 F2-logit F3-logit E0-logit R-logit"),
    },
    # edge scores .6 .45 .225 .225 .2 .15 .1 .1 (cumulative .8293 at .2): R loses both its edges
    (0.95, 0.8): {
        "circuit-tracer": ("E0 E1 F1 F2 logit", "E1-F1 E0-F1 F1-F2 F2-logit"),
        "appendix": ("E0 E1 R F1 F2 F3 logit", "E1-F1 E0-F1 F1-F2 F2-logit F3-logit"),
    },
}


def hand_graph():
    ix = {n: i for i, n in enumerate(HAND_NAMES)}
    D = np.zeros((7, 7))
    for (s, t), w in HAND_EDGES.items():
        D[ix[t], ix[s]] = w
    return graph_from_dense(HAND_KINDS, D, HAND_LAYERS, HAND_POSITIONS, logit_probs=[1.0])


@pytest.mark.parametrize("thresholds", list(HAND_CASES))
@pytest.mark.parametrize("rule", ["circuit-tracer", "appendix"])
def test_both_rules_on_a_hand_built_graph(thresholds, rule):
    g = hand_graph()
    p = prune_graph(g, *thresholds, rule=rule)

    def key(n, i):
        return str(n.kind[i]), int(n.layer[i]), int(n.position[i]), int(n.feature[i])

    index = {key(g.nodes, i): name for i, name in enumerate(HAND_NAMES)}
    got = [index[key(p.nodes, i)] for i in range(p.n_nodes)]
    want_nodes, want_edges = HAND_CASES[thresholds][rule]
    assert " ".join(got) == want_nodes
    coo = p.adjacency.tocoo()
    assert {f"{got[s]}-{got[t]}" for s, t in zip(coo.col, coo.row)} == set(want_edges.split())
    np.testing.assert_allclose(p.nodes.unpruned_influence, [HAND_INFLUENCE[n] for n in got], rtol=1e-12)
    np.testing.assert_allclose(p.nodes.unpruned_share, [HAND_SHARES[n] / 2.05 for n in got], rtol=1e-12)
    assert (p.meta["node_threshold"], p.meta["edge_threshold"], p.meta["prune_rule"]) == (*thresholds, rule)


def test_influence_shares_known_answer():
    np.testing.assert_allclose(influence_shares([0.2, 0.5, 0.0, 0.3]), [1.0, 0.5, 1.0, 0.8])


def test_pruning_a_pruned_graph_again_is_refused(make_random_graph):
    p = prune_graph(make_random_graph(2, n_feat=30))
    with pytest.raises(GraphError, match="already pruned .circuit-tracer rule, node threshold 0.8") as e:
        prune_graph(p, 0.9, 0.99)
    assert "\n" not in str(e.value)
    with pytest.raises(GraphError, match="unknown; pass one of"):
        prune_graph(make_random_graph(2), rule="ct")

"""`attribute_pruned`: the pruned graph of `prune_graph(attribute(...))` without the full graph,
on tiny models of each architecture and transcoder kind, with the rows engine's groups bounded."""

import numpy as np
import pytest
import torch

from attrgraph.engine.attribute import StandardSetup, attribute
from attrgraph.engine.pruned_build import attribute_pruned
from attrgraph.engine.targets import logit_difference
from attrgraph.graph.prune import prune_graph
from attrgraph.graph.streamed_influence import logit_influence
from tests.attrgraph.ag_helpers import ARCHS, TRANSCODERS, tiny_attn_saes, tiny_model, tiny_transcoders

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TOKENS = torch.tensor([0, 5, 9, 3, 17, 22, 5, 9, 11, 2, 30, 7])


def assert_same_pruned_graph(a, b):
    """Same nodes, same edges (rows agree to float32 rounding: their batches differ), same influence."""
    for f in ("kind", "layer", "position", "feature", "token", "site"):
        np.testing.assert_array_equal(getattr(a.nodes, f), getattr(b.nodes, f))
    A, B = a.adjacency.toarray(), b.adjacency.toarray()
    np.testing.assert_array_equal(A != 0, B != 0)
    np.testing.assert_allclose(A, B, rtol=0, atol=1e-5 * np.abs(A).max())
    np.testing.assert_allclose(a.nodes.influence, b.nodes.influence, rtol=1e-5, atol=1e-9)
    np.testing.assert_array_equal(a.logit_tokens, b.logit_tokens)
    for k in ("pruned", "node_threshold", "edge_threshold", "backend"):
        assert a.meta[k] == b.meta[k]


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kind,skip", TRANSCODERS)
def test_equals_prune_graph_of_attribute(arch, kind, skip):
    model = tiny_model(arch, torch.float32)
    tc = tiny_transcoders(model, kind, skip)
    full = attribute(model, tc, TOKENS)
    # attribute's influence is the pass prune_graph would make, in float64: pruning may take it
    again = logit_influence(full.adjacency, full.logit_weights()).influence
    np.testing.assert_allclose(full.nodes.influence, again, rtol=1e-12, atol=1e-15)
    want = prune_graph(full, 0.7, 0.9)
    assert_same_pruned_graph(want, prune_graph(full, 0.7, 0.9, influence=full.nodes.influence))
    got = attribute_pruned(model, tc, TOKENS, 0.7, 0.9, chunk_edges=200)  # many groups of rows
    assert_same_pruned_graph(want, got)
    assert got.meta["unpruned_n_edges"] == full.n_edges and got.meta["unpruned_n_nodes"] == full.n_nodes
    assert got.meta["unpruned_n_features"] == full.n_features
    for k in ("unpruned_replacement_score", "unpruned_completeness_score"):
        assert got.meta[k] == pytest.approx(full.meta[k], rel=1e-6)


@pytest.mark.parametrize("arch", ARCHS)
def test_equals_prune_graph_of_attribute_with_attention_features(arch):
    """With attention-output SAEs beside the MLP transcoders (an attention feature of a layer feeds
    its MLP features): the same pruned graph, attention nodes of both kinds included."""
    model = tiny_model(arch, torch.float32)
    sets = [tiny_transcoders(model), tiny_attn_saes(model)]
    full = attribute(model, sets, TOKENS)
    want = prune_graph(full, 0.7, 0.9)
    assert want.nodes.mask("feature", "attn").any() and want.nodes.mask("error", "attn").any()
    assert_same_pruned_graph(want, attribute_pruned(model, sets, TOKENS, 0.7, 0.9, chunk_edges=200))


def test_custom_targets_and_thresholds_of_one():
    """A logit-difference target (a custom direction), and thresholds of 1 (every node and edge
    kept: step 3 computes every row again)."""
    model = tiny_model("gpt2", torch.float32)
    tc = tiny_transcoders(model)
    targets = [logit_difference(model, 5, 9)]
    full = attribute(model, tc, TOKENS, targets=targets)
    for rule in ("circuit-tracer", "appendix"):
        for thresholds in ((1.0, 1.0), (0.5, 0.8)):
            want = prune_graph(full, *thresholds, rule=rule)
            got = attribute_pruned(
                model, tc, TOKENS, *thresholds, targets=targets, chunk_edges=100, rule=rule
            )
            assert_same_pruned_graph(want, got)
            assert got.meta["prune_rule"] == rule
            np.testing.assert_allclose(got.nodes.unpruned_influence, want.nodes.unpruned_influence, rtol=1e-5)
            np.testing.assert_allclose(got.nodes.unpruned_share, want.nodes.unpruned_share, rtol=1e-5)
    # the appendix's rule at 1 keeps every node and edge (circuit-tracer's drops features without inputs)
    kept = attribute_pruned(model, tc, TOKENS, 1.0, 1.0, targets=targets, rule="appendix")
    assert kept.n_edges == full.n_edges


def test_each_group_of_rows_holds_at_most_chunk_edges(monkeypatch):
    """The memory bound of step 2: the rows engine is asked for at most about `chunk_edges` edges
    at a time (a group of one target may pass it), and every target's row is computed once there."""
    model = tiny_model("llama", torch.float32)
    tc = tiny_transcoders(model, "clt")
    sizes = []
    rows = StandardSetup.rows

    def spy(self, injections, *args, **kwargs):
        out = rows(self, injections, *args, **kwargs)
        sizes.append((len(injections), out.nnz))
        return out

    monkeypatch.setattr(StandardSetup, "rows", spy)
    chunk = 300
    pruned = attribute_pruned(model, tc, TOKENS, chunk_edges=chunk)
    streamed = sizes[:-1]  # the last call is step 3, the kept targets
    assert len(streamed) > 5
    assert all(nnz <= chunk or n == 1 for n, nnz in streamed), streamed
    assert sum(n for n, _ in streamed) == pruned.meta["unpruned_n_features"] + len(pruned.logit_tokens)

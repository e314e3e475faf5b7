"""Bad input, round 6 (docs/bad_inputs.md, "Round 6: indices and analysis calls"): what a researcher
passes by mistake to the graph and analysis functions. Each is one named exception of the package
with one sentence, where it gave an IndexError or TypeError from numpy or torch or, worse, ran: a
supernode of node 1 for id 1.5, a generation whose unknown mode was never looked at. The sentences are
the spec; the calls that must keep working are beside them."""

import numpy as np
import pytest

from attrgraph.analysis.global_weights import output_logit_weights, virtual_weights
from attrgraph.analysis.head_loadings import head_loadings
from attrgraph.analysis.inactive import attribute_inactive
from attrgraph.analysis.intervene import generate
from attrgraph.analysis.qk import qk_attribution
from attrgraph.engine.adaptive import attribute_adaptive
from attrgraph.engine.attribute import attribute
from attrgraph.engine.hierarchical import attribute_hierarchical, hierarchical_attribution
from attrgraph.errors import GraphError, InterventionError, OptionError, SupernodeError, TargetError
from attrgraph.graph.prune import normalize_matrix
from attrgraph.graph.supernodes import Supernode, supernode
from tests.attrgraph.ag_helpers import random_graph

TOKENS = [0, 5, 9, 3, 17]


@pytest.mark.parametrize(
    "options,said",
    [
        (dict(mode="sideways"), "mode is 'sideways'; pass one of"),
        (dict(layers=(1, 0)), "layers=(1, 0) is not a range inside 0..1"),
        (dict(layers=(0, 9)), "layers=(0, 9) is not a range inside 0..1"),
    ],
)
def test_generate_checks_mode_and_layers_without_interventions(tiny, options, said):
    """Before: with no interventions (a baseline run beside a steered one) nothing looked at them:
    the unknown mode or the empty range ran and gave the model's own continuation."""
    model, tc = tiny
    with pytest.raises(InterventionError) as e:
        generate(model, tc, TOKENS, {}, n_tokens=2, **options)
    assert said in str(e.value)
    assert len(generate(model, tc, TOKENS, {}, n_tokens=2, mode="constrained", layers=(0, 1))) == 7


def test_hierarchical_root_and_keep_are_checked():
    """Before: numpy's IndexError (`index 1000000 is out of bounds`, `index 27 is out of bounds for
    axis 0 with size 2`); an int array as `keep` indexed nodes instead of masking them."""
    g = random_graph(0)
    n = g.n_nodes
    for root in (10**6, -1, 2.0, True):
        with pytest.raises(GraphError, match=rf"^root is {root!r}; pass a node index in 0\.\.{n - 1}"):
            hierarchical_attribution(g, root=root)
    for keep in (np.ones(2, bool), np.ones(n, int)):
        with pytest.raises(
            GraphError, match=r"^keep is a \w+ array of shape \(\d+,\); pass one bool per node"
        ):
            hierarchical_attribution(g, keep=keep)
    logit = int(np.flatnonzero(g.nodes.kind == "logit")[0])
    kept = hierarchical_attribution(g, root=np.int64(logit), keep=np.ones(n, bool))
    assert kept.attribution[logit] == hierarchical_attribution(g).attribution[logit]


def test_supernode_names_and_ids():
    """Before: `supernode(g, "x", [1.5])` grouped node 1; an empty name made a supernode with no
    label in the viewer; a string of digits was read digit by digit."""
    g = random_graph(0)
    with pytest.raises(SupernodeError, match=r"^node ids \[1\.5\] are not integers; pass node indices\.$"):
        supernode(g, "x", [1.5])
    with pytest.raises(SupernodeError, match=r"^node_ids is '12'; pass a list of node indices\.$"):
        supernode(g, "x", "12")
    for name in ("", "  ", None):
        with pytest.raises(SupernodeError, match=r"^a supernode's name is .*; give it a label to show"):
            supernode(g, name, [1])
    sn = supernode(g, "pair", np.array([1, 2]))  # numpy indices still work
    assert isinstance(sn, Supernode) and len(sn.members) == 2


def test_normalize_matrix_needs_a_square_matrix():
    """Before: numpy's IndexError (`boolean index did not match indexed array along axis 0`)."""
    for bad in (np.ones(3), np.ones((2, 3)), [[1.0]]):
        with pytest.raises(
            GraphError, match=r"^the adjacency has shape .*; pass a square matrix \[n_nodes, n_nodes\]"
        ):
            normalize_matrix(bad)
    out = normalize_matrix(np.array([[0.0, -2.0], [1.0, 3.0]]))
    np.testing.assert_allclose(out.toarray(), [[0.0, 1.0], [0.25, 0.75]])  # rows of |A| summing to 1


def test_inactive_feature_indices_must_be_integers(tiny):
    """Before: torch's IndexError (`tensors used as indices must be long, int, byte or bool tensors`)."""
    model, tc = tiny
    for kw, said in ((dict(feature=1.5), "feature is 1.5"), (dict(layer="1"), "layer is '1'")):
        with pytest.raises(TargetError, match=rf"^{said}; pass an integer index\.$"):
            attribute_inactive(model, tc, TOKENS, **{"layer": 1, "position": 3, "feature": 2, **kw})


@pytest.mark.parametrize("feature", [5, "mlp", ("mlp", 0), ("mlp", 0.5, 1), (0, 0, 1), ("mlp", 0, True)])
def test_a_feature_that_is_not_site_layer_index(tiny, feature):
    """Before: `TypeError: cannot unpack non-iterable int object`, a ValueError from unpacking, or
    layer 0.5 read as layer 0."""
    model, tc = tiny
    for call in (virtual_weights, output_logit_weights):
        with pytest.raises(
            OptionError, match=r"^feature is .*; pass \(site, layer, index\) such as \('mlp', 1, 42\)"
        ):
            call(model, tc, feature)


def test_a_feature_key_as_list_or_numpy_ints_still_works(tiny):
    model, tc = tiny
    a = virtual_weights(model, tc, ("mlp", 0, 3))
    b = virtual_weights(model, tc, ["mlp", np.int64(0), np.int32(3)])
    np.testing.assert_array_equal(a.weight, b.weight)


def test_graph_label_of_a_node_not_in_the_graph():
    """Before: `ValueError: -1 is not in list` (the logit branch), numpy's IndexError."""
    g = random_graph(0)
    for i in (-1, g.n_nodes, 1.0):
        with pytest.raises(
            GraphError, match=rf"^node {i!r} is not in this graph; pass an index in 0\.\.{g.n_nodes - 1}\.$"
        ):
            g.label(i)
    assert g.label(np.int64(0)).startswith("emb@")


def test_supernode_adjacency_takes_a_list_of_supernodes():
    """Before: `AttributeError: 'str' object has no attribute 'members'` (a string, a list of ids, one
    Supernode not in a list)."""
    from attrgraph.graph.supernodes import supernode_adjacency

    g = random_graph(0)
    one = supernode(g, "pair", [1, 2])
    for bad in ("abc", [1, 2], one, 5):
        with pytest.raises(SupernodeError, match=r"^supernodes is a \w+ \(.*\); pass a list of Supernode"):
            supernode_adjacency(g, bad)
    as_list, as_generator = supernode_adjacency(g, [one]), supernode_adjacency(g, (s for s in [one]))
    assert as_list.names == as_generator.names and "pair" in as_list.names
    none = supernode_adjacency(g, [])
    for empty in ((s for s in []), np.array([]), None):  # no supernodes, however given
        assert supernode_adjacency(g, empty).names == none.names


@pytest.mark.parametrize(
    "call,error,said",
    [
        (lambda m, tc: attribute(m, tc, TOKENS, exclude_bos="no"), OptionError, "exclude_bos is 'no'; pass True, False or None"),
        (lambda m, tc: qk_attribution(m, tc, TOKENS, 1, 0, 3, 1, exclude_bos="no"), OptionError, "exclude_bos is 'no'"),
        (lambda m, tc: attribute(m, tc, TOKENS, max_n_logits=2.5), TargetError, "max_n_logits is 2.5; pass a whole number, at least 1."),
        (lambda m, tc: attribute_adaptive(m, tc, TOKENS, max_feature_nodes=2.5), OptionError, "max_feature_nodes is 2.5; pass a whole number."),
        (lambda m, tc: attribute_adaptive(m, tc, TOKENS, max_feature_nodes=4, k=1.5), OptionError, "k is 1.5; pass a whole number."),
        (lambda m, tc: attribute_hierarchical(m, tc, TOKENS, root=10**6), TargetError, "root is 1000000; pass None (the top logit), a Target, or an active feature"),
        (lambda m, tc: attribute_hierarchical(m, tc, TOKENS, root=(1, 2.5, 3)), TargetError, "root is (1, 2.5, 3); pass None"),
    ],
)  # fmt: skip
def test_engine_options_of_the_wrong_type(tiny, call, error, said):
    """Before: `exclude_bos="no"` ran as True (any non-empty string is); torch's `TypeError: topk():
    argument 'k' must be int, not float`; `slice indices must be integers`; `'int' object is not
    iterable` (a bare int as the hierarchical root), after the prompt ran."""
    model, tc = tiny
    with pytest.raises(error) as e:
        call(model, tc)
    assert str(e.value).startswith(said)
    assert (
        attribute(model, tc, TOKENS, exclude_bos=np.bool_(True)).meta["exclude_bos"] is True
    )  # a stored flag


def test_head_loadings_edges_must_be_pairs(tiny):
    """Before: numpy's `cannot reshape array of size 3 into shape (2)`; float pairs were cut to
    integers (a single pair `(1.5, 2.0)` too)."""
    model, tc = tiny
    graph = attribute(model, tc, TOKENS)
    for edges in (np.array([1, 2, 3]), [(1.5, 2)], (1.5, 2.0), np.ones((2, 3), int)):
        with pytest.raises(
            OptionError, match=r"^edges is a \w+ array of shape .*; pass \(target, source\) node index pairs"
        ):
            head_loadings(model, tc, graph, edges=edges)
    assert len(head_loadings(model, tc, graph, edges=[]).edges) == 0  # none asked, none explained


def test_a_batch_size_of_true_is_refused(tiny):
    """Round 7: `batch_size=True` ran as batches of one row (True is 1 to Python); head_loadings
    took it too, and compared a float batch size with 1 without asking for a whole number."""
    model, tc = tiny
    with pytest.raises(OptionError, match=r"^batch_size is True; pass a whole number, at least 1\.$"):
        attribute(model, tc, TOKENS, batch_size=True)
    graph = attribute(model, tc, TOKENS, batch_size=np.int64(3))  # numpy integers still count
    for bad in (True, 2.5):
        with pytest.raises(OptionError, match=rf"^batch_size is {bad!r}; pass a whole number, at least 1\.$"):
            head_loadings(model, tc, graph, edges=[], batch_size=bad)

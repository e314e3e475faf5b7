"""Construction, evaluation, Edge Pruning, HAP, schemas, storage and bad input."""

import json
import re

import pytest
import torch

from attrgraph.circuits.circuit import Circuit
from attrgraph.circuits.construct import greedy, is_connected, top_n
from attrgraph.circuits.eap import eap, example_scores
from attrgraph.circuits.edge_pruning import PruneConfig, prune_edges
from attrgraph.circuits.evaluate import evaluate
from attrgraph.circuits.hap import hap, hap_subgraph
from attrgraph.circuits.pairs import Pairs
from attrgraph.circuits.pairs import make_pairs as pad_pairs
from attrgraph.circuits.peap import peap
from attrgraph.circuits.schema import (
    Schema,
    aggregate,
    align_schema,
    propose_schema,
    read_schema,
    write_schema_json,
)
from attrgraph.circuits.store import circuit_to_networkx, load_circuit, save_circuit
from attrgraph.errors import ConstantMetricError, OptionError, PairLengthError, SchemaError, SparsityError
from tests.attrgraph.circuits.circuit_helpers import make_pairs, tiny_model


@pytest.fixture(scope="module")
def model():
    return tiny_model(torch.float32)


@pytest.fixture(scope="module")
def data(model):
    pairs = make_pairs(seed=1, n=8)
    ex = example_scores(model, pairs, cross_position=True)
    return pairs, ex, eap(model, pairs), peap(model, pairs, example=ex)


def _all_and_none(scores):
    n = scores.layout.n_edges
    return Circuit.from_flat(scores.layout, torch.ones(n)), Circuit.from_flat(scores.layout, torch.zeros(n))


def test_full_circuit_is_clean_and_empty_circuit_is_corrupted(model, data):
    pairs, ex, s_eap, s_peap = data
    schema = propose_schema(pairs, ex)
    s_span = peap(model, pairs, schema=schema, example=ex)
    for scores, sch in ((s_eap, None), (s_peap, None), (s_span, schema)):
        full, empty = _all_and_none(scores)
        f = evaluate(model, pairs, full, schema=sch)
        assert f.metric_circuit == pytest.approx(f.metric_model, abs=1e-5)
        assert f.soft == pytest.approx(1.0, abs=1e-4) and f.hard == 1.0 and abs(f.kl) < 1e-6
        e = evaluate(model, pairs, empty, schema=sch)
        assert e.metric_circuit == pytest.approx(e.metric_corrupt, abs=1e-5) and e.n_edges == 0


def test_greedy_circuits_are_connected_and_sized(data):
    _, _, s_eap, s_peap = data
    for scores in (s_eap, s_peap):
        for n in (3, 15, 40):
            c = greedy(scores, n)
            assert is_connected(c)
            assert n <= c.n_edges <= n + 10  # the last step may connect several waiting edges at once
    t = top_n(s_eap, 10)
    assert t.n_edges == 10
    assert set(t.flat().nonzero().flatten().tolist()) == set(s_eap.flat().abs().topk(10).indices.tolist())


def test_greedy_follows_scores_on_a_hand_built_case(model):
    from attrgraph.circuits.circuit import EdgeLayout, EdgeScores
    from attrgraph.circuits.graph import ComponentGraph

    g = ComponentGraph.from_model(model)
    s = torch.zeros(g.n_up, g.n_down)
    s[g.up_head(1, 2), g.down_logits] = 5.0  # a1.h2 -> logits
    s[g.up_head(0, 1), g.down_head(1, 2, 2)] = -4.0  # a0.h1 -> a1.h2.v
    s[0, g.down_head(0, 1, 0)] = 3.0  # input -> a0.h1.q
    s[0, g.down_mlp(1)] = 10.0  # big but dangling: m1 never reaches the logits in this circuit
    c = greedy(EdgeScores(EdgeLayout(g), s), 3)
    names = {g.edge_name(u, d) for u, d in c.resid.nonzero().tolist()}
    assert names == {"a1.h2->logits", "a0.h1->a1.h2.v", "input->a0.h1.q"}


def test_edge_pruning_moves_toward_the_target_sparsity(model, data):
    pairs = data[0]
    r = prune_edges(model, pairs, PruneConfig(sparsity=0.7, steps=200, batch_size=8))
    n = r.circuit.layout.n_edges
    assert r.circuit.n_edges == round(0.3 * n)
    # the Lagrangian pulls the expected sparsity from ~0.03 (gates open) to the target
    assert abs(r.expected_sparsity - 0.7) < 0.1
    assert not r.circuit.layout.positional and len(r.kl) == 200


def test_edge_pruning_stops_once_its_circuit_is_stable(model, data):
    cfg = PruneConfig(sparsity=0.8, steps=60, warmup=0.5, batch_size=8, patience=2)
    r = prune_edges(model, data[0], cfg)
    assert 31 <= len(r.kl) < 60  # never before the warm-up ends, and early once the top edges settle


def test_hap_circuit_lies_inside_the_eap_top_fraction(model, data):
    pairs, _, s_eap, _ = data
    r = hap(model, pairs, PruneConfig(sparsity=0.8, steps=20, batch_size=8), keep_frac=0.4, scores=s_eap)
    allowed = hap_subgraph(s_eap, 0.4)
    assert bool((r.circuit.flat() <= allowed).all()) and r.circuit.n_edges == round(
        0.2 * s_eap.layout.n_edges
    )
    assert torch.isinf(r.log_alpha[~allowed]).all()


def test_store_round_trip_and_networkx(tmp_path, data):
    _, _, s_eap, s_peap = data
    path = tmp_path / "c.h5"
    for name, scores in (("eap", s_eap), ("peap", s_peap)):
        c = greedy(scores, 12)
        save_circuit(c, path, name, scores)
    for name, scores in (("eap", s_eap), ("peap", s_peap)):
        c = greedy(scores, 12)
        back, back_scores = load_circuit(path, name)
        assert torch.equal(back.flat(), c.flat()) and back.layout.positions == c.layout.positions
        assert torch.allclose(back_scores.flat(), scores.flat().float())
        nxg = circuit_to_networkx(back, back_scores)
        assert nxg.number_of_edges() == c.n_edges and "logits" in nxg


def test_schema_aggregation_and_files(tmp_path, data):
    pairs, ex, _, s_peap = data
    T = pairs.clean.shape[1]
    ident = Schema(tuple(f"t{t}" for t in range(T)), torch.arange(T).expand(len(pairs), -1))
    resid, attn, valid = aggregate(ex, ident, "avg")
    assert torch.allclose(resid, s_peap.resid) and torch.allclose(attn, s_peap.attn, atol=1e-7)
    assert torch.equal(valid, torch.ones(T, T, dtype=torch.bool).tril())
    two = Schema(("a", "b"), torch.tensor([[0] * 3 + [1] * (T - 3)] * len(pairs)))
    r_sum, _, _ = aggregate(ex, two, "sum")
    assert torch.allclose(r_sum[0], ex.resid[:, :3].sum(1).mean(0), atol=1e-6)
    r_max, _, _ = aggregate(ex, two, "maxabs")
    assert (r_max[1].abs() <= ex.resid[:, 3:].abs().amax((0, 1)) + 1e-7).all()
    write_schema_json(two, tmp_path / "s.json")
    assert torch.equal(read_schema(tmp_path / "s.json", [T] * len(pairs)).span_index, two.span_index)
    rows = ["example,span,start,end"] + [
        f"{b},{s},{a},{e}" for b in range(len(pairs)) for s, a, e in (("a", 0, 3), ("b", 3, T))
    ]
    (tmp_path / "s.csv").write_text("\n".join(rows))
    assert torch.equal(read_schema(tmp_path / "s.csv", [T] * len(pairs)).span_index, two.span_index)
    (tmp_path / "bad.json").write_text(json.dumps({"spans": ["a"], "examples": [{"a": [0, 2]}]}))
    with pytest.raises(SchemaError, match="belong to no span"):
        read_schema(tmp_path / "bad.json", [T])


def test_positions_in_spans_a_circuit_lacks_are_ablated(model, data):
    pairs, ex, _, _ = data
    T = pairs.clean.shape[1]
    two = Schema(("a", "b"), torch.tensor([[0] * 3 + [1] * (T - 3)] * len(pairs)))
    scores = peap(model, pairs, schema=two, example=ex)
    full, _ = _all_and_none(scores)
    other = align_schema(
        Schema(("zzz",), torch.zeros(len(pairs), T, dtype=torch.long)), scores.layout.positions
    )
    assert (other.span_index == -2).all()
    f = evaluate(model, pairs, full, schema=other)
    assert f.metric_circuit == pytest.approx(f.metric_corrupt, abs=1e-5)
    same = align_schema(Schema(("b", "a"), 1 - two.span_index), scores.layout.positions)
    assert torch.equal(same.span_index, two.span_index)


def test_bad_input_raises_one_clear_error(model, data):
    pairs = data[0]
    with pytest.raises(PairLengthError, match="same length"):
        pad_pairs([[1, 2, 3]], [[1, 2]], torch.tensor([[0.0, 1.0, -1.0]]))
    w = torch.zeros(2, 50)
    with pytest.raises(ConstantMetricError, match="constant"):
        Pairs(pairs.clean[:2], pairs.corrupt[:2], pairs.last[:2], w)
    w[:, 3], w[:, 5] = 1.0, -1.0
    same = Pairs(pairs.clean[:2], pairs.clean[:2], pairs.last[:2], w)
    with pytest.raises(ConstantMetricError, match="identical"):
        eap(model, same)
    for bad in (0.0, 1.0, 1.5, -0.1):
        with pytest.raises(SparsityError, match="strictly between 0 and 1"):
            PruneConfig(sparsity=bad)
    ragged = pad_pairs([[1, 2, 3, 4], [1, 2, 3]], [[1, 2, 9, 4], [1, 9, 3]], w)
    with pytest.raises(SchemaError, match="pass a schema"):
        peap(model, ragged)


def test_bad_options_and_a_circuit_of_another_model_are_option_errors(model, data):
    """Each was a bare TypeError / RuntimeError, or ran: a negative IG step count, circuit size or
    learning rate, an unknown aggregation without a schema (it was never read), and a circuit of a
    model with MLPs evaluated on an attention-only model (its masks were cut to the other graph's
    edges without a word)."""
    pairs, _, s_eap, _ = data
    for call, said in [
        (lambda: eap(model, pairs, ig_steps=-1), "ig_steps is -1"),
        (lambda: greedy(s_eap, -5), "a circuit of -5 edges"),
        (lambda: top_n(s_eap, -1), "a circuit of -1 edges"),
        (lambda: peap(model, pairs, aggregation="median"), "aggregation 'median' is unknown"),
        (lambda: PruneConfig(lr=-1.0), "lr is -1.0; pass a positive number."),
        (lambda: PruneConfig(beta=0.0), "beta is 0.0"),
        (lambda: PruneConfig(steps=0), "steps is 0; pass at least 1."),
        (lambda: PruneConfig(warmup=2.0), "warmup is 2.0"),
        (
            lambda: evaluate(tiny_model(torch.float32, attn_only=True), pairs, greedy(s_eap, 5)),
            "no MLPs; evaluate it",
        ),
    ]:
        with pytest.raises(OptionError, match=re.escape(said)):
            call()
    assert greedy(s_eap, 0).n_edges == 0  # an empty circuit is still one (the corrupted model)

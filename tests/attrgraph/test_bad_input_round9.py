"""Bad input, round 9 (docs/bad_inputs.md, "Round 9: what a notebook session leaves on a model"): a
model kept across cells carries what an earlier cell did to it. Hooks still attached, weights
converted past `cfg.dtype`, a `torch.no_grad()` or `torch.inference_mode()` block around the call,
a replacement model of another model, a graph whose model was edited since: each ran quietly and
gave another model's answer, or failed inside torch. The sentences are the spec; the expected values
of the calls that must work come from outside the path under test (the other rows engine, the call
made outside the block, a model built in the right dtype)."""

import numpy as np
import pytest
import torch

from attrgraph.analysis.head_loadings import head_loadings
from attrgraph.analysis.intervene import intervene
from attrgraph.analysis.qk import qk_attribution
from attrgraph.analysis.validate import ValidateConfig, validate_graph
from attrgraph.circuits.eap import eap
from attrgraph.circuits.edge_pruning import PruneConfig, prune_edges
from attrgraph.engine.attribute import attribute
from attrgraph.engine.hierarchical import node_biases
from attrgraph.engine.replacement import ReplacementModel
from attrgraph.errors import GraphError, ModelStateError, SupernodeError, ValidationError
from attrgraph.graph.supernodes import suggest_supernodes
from tests.attrgraph.ag_helpers import tiny_model, tiny_transcoders
from tests.attrgraph.circuits.circuit_helpers import make_pairs
from tests.attrgraph.circuits.circuit_helpers import tiny_model as circuit_model
from transcoders.errors import TranscoderMismatchError
from transcoders.model_state import attached_hooks

TOKENS = [0, 5, 9, 3, 17, 22, 5]
VALIDATE = ValidateConfig(max_features=6, n_perturbations=1, windows=(0,))


@pytest.fixture
def fresh():
    """A model and set of its own (these tests hook, convert and edit them)."""
    model = tiny_model("gpt2")
    return model, tiny_transcoders(model)


def doubled(x, hook):
    return x * 2


@pytest.mark.parametrize("how", ["add_hook", "add_perma_hook", "torch", "context"])
def test_hooks_left_on_the_model_are_refused_by_every_call_that_runs_it(fresh, how):
    """Before: with `x * 2` on `blocks.0.hook_resid_mid` attribution ran; its linear and autograd
    rows were 1.8 apart (the recorded run and the frozen forwards had the hook, the linear engine's
    products did not): a graph of neither model. Validation and head loadings ran on the hooked
    model too. Now each refuses, naming the hook point; once the hooks are removed the graph is the
    clean model's, value for value."""
    model, tc = fresh
    clean = attribute(model, tc, TOKENS)
    graph = attribute(model, tc, TOKENS)
    where = "blocks.0.hook_resid_mid"
    handle = None
    if how == "add_hook":
        model.add_hook(where, doubled)
    elif how == "add_perma_hook":
        model.add_perma_hook(where, doubled)
    elif how == "torch":
        where = "blocks.0.mlp"
        handle = model.blocks[0].mlp.register_forward_hook(lambda module, args, out: out * 2)
    calls = {
        "attribute": lambda: attribute(model, tc, TOKENS),
        "attribute autograd": lambda: attribute(model, tc, TOKENS, backend="autograd"),
        "validate_graph": lambda: validate_graph(model, tc, graph, VALIDATE),
        "head_loadings": lambda: head_loadings(model, tc, graph, top=2),
        "node_biases": lambda: node_biases(ReplacementModel(model, tc), graph),
        "qk_attribution": lambda: qk_attribution(model, tc, TOKENS, 1, 0, 5, 2),
    }
    for name, call in calls.items():
        if how == "context":
            with model.hooks(fwd_hooks=[(where, doubled)]), pytest.raises(ModelStateError) as e:
                call()
        else:
            with pytest.raises(ModelStateError) as e:
                call()
        said = str(e.value)
        assert said.startswith(f"hooks are attached to the model at {where}: they would change"), name
        assert "model.reset_hooks(including_permanent=True)" in said
    if handle is not None:
        handle.remove()
    model.reset_hooks(including_permanent=True)
    assert attached_hooks(model) == []
    again = attribute(model, tc, TOKENS)
    assert (again.adjacency != clean.adjacency).nnz == 0


@pytest.mark.parametrize("freeze_attention", [True, False])
def test_an_intervention_takes_the_model_as_it_is_hooks_included(fresh, freeze_attention):
    """Interventions differentiate nothing: with a hook held on purpose (ioi_explained holds the final
    LayerNorm's scale), the clean and intervened runs both carry it. With no edit the logits are the
    hooked model's own, from TransformerLens's `run_with_hooks`."""
    model, tc = fresh
    hooks = [("blocks.0.hook_resid_mid", doubled)]
    want = model.run_with_hooks(torch.tensor([TOKENS]), fwd_hooks=hooks)[0]
    with model.hooks(fwd_hooks=hooks):
        got = intervene(model, tc, TOKENS, {}, freeze_attention=freeze_attention).logits
    torch.testing.assert_close(got, want, rtol=0, atol=1e-10)
    assert attached_hooks(model) == []


def test_component_circuits_refuse_a_hooked_model():
    """Before: EAP ran on the hooked model, 0.03 from the clean scores: the patched runs had the
    hook, the residual sums of the component graph did not."""
    model, pairs = circuit_model(torch.float32), make_pairs(seed=1, n=4)
    model.add_hook("blocks.0.hook_resid_post", doubled)
    with pytest.raises(
        ModelStateError, match=r"^hooks are attached to the model at blocks\.0\.hook_resid_post: .*circuit"
    ):
        eap(model, pairs)
    model.reset_hooks()
    eap(model, pairs)


def test_a_failed_call_leaves_none_of_its_own_hooks_behind(fresh):
    """The check holds only if attrgraph never leaves a hook of its own: a frozen forward that fails
    inside its block (here a Ctrl-C) leaves the model without hooks and with its own MLPs."""
    model, tc = fresh
    rm = ReplacementModel(model, tc)
    state = rm.run(torch.tensor(TOKENS))
    mlps = [block.mlp for block in model.blocks]
    with pytest.raises(KeyboardInterrupt), rm.frozen(state, rm.constant(state), probes=True):
        model(state.tokens[None])
        assert attached_hooks(model) != []
        raise KeyboardInterrupt
    assert attached_hooks(model) == []
    assert [block.mlp for block in model.blocks] == mlps
    attribute(model, tc, TOKENS)


def test_gradients_work_inside_no_grad_and_inference_mode(fresh):
    """Before: `attribute(backend="autograd")` and `head_loadings` inside `torch.inference_mode()`,
    and EAP and edge pruning inside either block, failed with torch's `element 0 of tensors does not
    require grad`. Now each runs, and gives what it gives outside: the autograd rows equal the
    linear engine's graph built outside any block."""
    model, tc = fresh
    linear = attribute(model, tc, TOKENS, backend="linear").adjacency.toarray()
    loads = head_loadings(model, tc, attribute(model, tc, TOKENS), top=3).heads
    for block in (torch.no_grad, torch.inference_mode):
        with block():
            rows = attribute(model, tc, TOKENS, backend="autograd").adjacency.toarray()
            inside = head_loadings(model, tc, attribute(model, tc, TOKENS), top=3).heads
        np.testing.assert_allclose(rows, linear, rtol=0, atol=1e-12)
        np.testing.assert_allclose(inside, loads, rtol=0, atol=1e-12)

    cm, pairs = circuit_model(torch.float64), make_pairs(seed=1, n=4)
    scores = eap(cm, pairs).resid
    cfg = PruneConfig(steps=4, batch_size=4, seed=0)
    gates = prune_edges(cm, pairs, cfg).log_alpha
    for block in (torch.no_grad, torch.inference_mode):
        with block():
            assert torch.equal(eap(cm, pairs).resid, scores)
            assert torch.equal(prune_edges(cm, pairs, cfg).log_alpha, gates)


def test_a_model_made_under_inference_mode_is_refused_where_it_is_differentiated():
    """Parameters made under `torch.inference_mode()` (a model loaded inside the block) cannot be
    saved for backward: before, torch's `Inference tensors cannot be saved for backward` from deep in
    EAP. Now the calls that differentiate the model say so in one sentence; the linear engine, which
    differentiates by hand, builds the graph the ordinary model builds."""
    with torch.inference_mode():
        model = tiny_model("gpt2")
        cm = circuit_model(torch.float32)
    ordinary = tiny_model("gpt2")
    tc = tiny_transcoders(ordinary)
    graph = attribute(model, tc, TOKENS)
    assert (graph.adjacency != attribute(ordinary, tc, TOKENS).adjacency).nnz == 0
    said = (
        r"differentiates the model, but its parameters were made under torch.inference_mode\(\) \(embed.W_E"
    )
    with pytest.raises(ModelStateError, match="^the autograd rows engine " + said):
        attribute(model, tc, TOKENS, backend="autograd")
    with pytest.raises(ModelStateError, match="^head_loadings " + said):
        head_loadings(model, tc, graph, top=2)
    with pytest.raises(ModelStateError, match="^EAP " + said):
        eap(cm, make_pairs(seed=1, n=4))


@pytest.mark.parametrize("convert,dtype", [("half", torch.float16), ("float", torch.float32)])
def test_weights_converted_past_cfg_dtype_are_refused_with_the_call_that_converts(convert, dtype):
    """Before: `.half()` / `.float()` (torch's, which leave TransformerLens's `cfg.dtype` behind) and
    then `attribute`: `RuntimeError: mat1 and mat2 must have the same dtype, but got Double and Half`
    from inside the attention. Now one sentence with the call to make; after it, the graph is the one
    the model converted by TransformerLens gives."""
    model = tiny_model("gpt2")
    tc = tiny_transcoders(model).to(torch.float32)
    getattr(model, convert)()
    name = str(dtype).replace("torch.", "")
    with pytest.raises(ModelStateError) as e:
        attribute(model, tc, TOKENS)
    assert str(e.value) == (
        f"the model's weights are {name} (embed.W_E) but model.cfg.dtype is float64: .half(), .float() and "
        ".bfloat16() convert the weights and leave TransformerLens's config behind; convert with "
        f"model.to(torch.{name}), or load it so (load_model(..., dtype='{name}'))."
    )
    if dtype == torch.float32:
        model.to(torch.float32)
        built = tiny_model("gpt2").to(torch.float32)  # TransformerLens's conversion, cfg and all
        want = attribute(built, tc, TOKENS).adjacency.toarray()
        np.testing.assert_allclose(attribute(model, tc, TOKENS).adjacency.toarray(), want, rtol=0, atol=1e-6)


def test_a_replacement_model_of_another_model_is_refused(fresh):
    """Before: `attribute(model_b, ReplacementModel(model_a, tc), ...)` returned model A's graph
    (0 apart) under model B's name."""
    model, tc = fresh
    rm = ReplacementModel(model, tc)
    other = tiny_model("gpt2", seed=1)
    for call in (
        lambda: attribute(other, rm, TOKENS),
        lambda: intervene(other, rm, TOKENS, {}),
    ):
        with pytest.raises(
            TranscoderMismatchError, match="^the ReplacementModel passed was built on another model"
        ):
            call()
    assert (attribute(model, rm, TOKENS).adjacency != attribute(model, tc, TOKENS).adjacency).nnz == 0


def test_a_graph_is_checked_against_the_model_and_sets_that_recompute_from_it(fresh):
    """Before: `validate_graph` checked the set's fingerprint but not the model's, so a model edited in
    place after the graph was built (one head's W_O zeroed in a cell) or another model of the same
    shape was validated as if it had built the graph; `node_biases` checked neither; decoder
    supernodes took any set of the shape. Now each names what differs."""
    model, tc = fresh
    graph = attribute(model, tc, TOKENS)
    node_biases(ReplacementModel(model, tc), graph)
    other_tc = tiny_transcoders(model, seed=1)
    with pytest.raises(
        GraphError, match=r"^the graph was built with other MLP transcoders \(fingerprint \w+; the one"
    ):
        node_biases(ReplacementModel(model, other_tc), graph)
    with pytest.raises(SupernodeError, match=r"^the graph was built with other MLP transcoders"):
        suggest_supernodes(graph, by="decoder", transcoders=other_tc)
    suggest_supernodes(graph, by="decoder", transcoders=tc)
    with torch.no_grad():
        model.blocks[0].attn.W_O[0] = 0
    said = r"^the graph was built with another model \(fingerprint \w+; the one passed is \w+: another one, its weights edited since, or loaded in another dtype\)"
    with pytest.raises(ValidationError, match=said):
        validate_graph(model, tc, graph, VALIDATE)
    with pytest.raises(GraphError, match=said):
        node_biases(ReplacementModel(model, tc), graph)
    # a graph of the edited model is its own
    edited = attribute(model, tc, TOKENS)
    node_biases(ReplacementModel(model, tc), edited)
    validate_graph(model, tc, edited, VALIDATE)


def test_the_corpus_norm_scales_refuse_a_hooked_model(fresh):
    """The viewer's typical norm scales (global weights) read from a corpus through the model."""
    from attrgraph.analysis.global_weights import mean_norm_scales

    model, _ = fresh
    model.add_hook("blocks.0.hook_resid_pre", doubled)
    with pytest.raises(
        ModelStateError, match=r"^hooks are attached to the model at blocks\.0\.hook_resid_pre: .*norm scales"
    ):
        mean_norm_scales(model, [torch.tensor(TOKENS)])
    model.reset_hooks()
    assert mean_norm_scales(model, [torch.tensor(TOKENS)])


def test_the_bundled_sets_are_refused_on_the_bundled_model_processed_as_from_pretrained_does():
    """Before: the bundled model with TransformerLens's default processing (`from_pretrained`'s: folded
    norms, centered weights; the same next-token distribution) gave the IOI graph a replacement score of
    0.85 instead of 0.94, the sets reading other MLP inputs. Now the pair is refused, naming the loader
    call; `processing` itself is checked."""
    from attrgraph.bundled.loading import load_model
    from attrgraph.errors import OptionError
    from transcoders import load_transcoders

    tc = load_transcoders("default-plt")
    model = load_model("default", processing=True)
    assert model.cfg.normalization_type == "LNPre"
    with pytest.raises(
        TranscoderMismatchError,
        match=r"^the transcoders were trained on the model with its norms unfolded, but this one has them folded .*attrgraph\.load_model\(name\)",
    ):
        attribute(model, tc, "When Mary and John went to the store, John gave a drink to")
    with pytest.raises(OptionError, match=r"^processing is 'yes'; pass True"):
        load_model("default", processing="yes")

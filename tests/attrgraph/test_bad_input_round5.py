"""Bad input, round 5 (docs/bad_inputs.md, "Round 5: the Python API"): what a researcher passes
from Python by mistake. Each is one named exception of the package with one sentence, raised before
any work, where it gave a foreign exception (TypeError, AttributeError, AssertionError, torch's
RuntimeError) or, worse, ran: a graph of a prompt that was not meant, NaN activations, a zero target.
The sentences are the spec; the cases that must keep working are beside them."""

import math

import numpy as np
import pytest
import torch
from transformer_lens.HookedTransformer import DTYPE_FROM_STRING

from attrgraph.analysis.head_loadings import head_loadings
from attrgraph.analysis.intervene import Add, Scale, SetTo, generate, intervene
from attrgraph.analysis.validate import ValidateConfig, validate_graph
from attrgraph.engine.attribute import attribute
from attrgraph.engine.hierarchical import attribute_hierarchical
from attrgraph.engine.sources import to_tokens
from attrgraph.engine.targets import direction, logit_difference
from attrgraph.errors import (
    GraphError,
    InterventionError,
    OptionError,
    PromptError,
    TargetError,
    UnsupportedModelError,
    ValidationError,
)
from attrgraph.graph.export import to_networkx
from attrgraph.graph.neuronpedia import export_json, graph_to_json
from attrgraph.graph.prune import prune_graph
from attrgraph.graph.scores import compute_graph_scores
from attrgraph.graph.store import save_graph, save_graphs
from tests.attrgraph.ag_helpers import random_graph
from transcoders.config import check_dtype
from transcoders.errors import ConfigError, TranscoderMismatchError
from transcoders.formats import load_transcoders, save_transcoders

TOKENS = [0, 5, 9, 3, 17]


@pytest.mark.parametrize(
    "prompt,said",
    [
        (123, "prompt has type int; pass text (a str) or token ids"),
        (None, "prompt has type NoneType"),
        (3.5, "prompt has type float"),
        (b"ab", "prompt has type bytes"),
        (["a", "b"], "prompt has type list of non-integers"),
        ([[1, 2], [3]], "prompt has type list of non-integers"),
        ([True, False], "prompt has type list of bool"),
        (torch.tensor([1.0, 2.0]), "prompt has type Tensor of float32"),
        (np.array([1.5, 2.0]), "prompt has type ndarray of float64"),
        (
            torch.tensor([[1, 2], [3, 4]]),
            "prompt ids have shape (2, 2), 2 sequences; a graph is one prompt's",
        ),
        ([], "prompt has 0 tokens; pass at least one."),
    ],
)
def test_a_prompt_that_is_neither_text_nor_one_sequence_of_ids_is_a_prompt_error(tiny, prompt, said):
    """Before: 123 was taken for one token id and built its graph, a float tensor's ids were cut to
    integers, a batch of two prompts became one prompt of their concatenation, and None, a list of
    words or a ragged list were torch TypeErrors."""
    model, tc = tiny
    with pytest.raises(PromptError) as e:
        to_tokens(model, prompt)
    assert said in str(e.value)
    with pytest.raises(PromptError):
        attribute(model, tc, prompt)


@pytest.mark.parametrize(
    "prompt",
    [TOKENS, tuple(TOKENS), np.array(TOKENS, np.int32), torch.tensor(TOKENS), torch.tensor([TOKENS])],
    ids=["list", "tuple", "int32 array", "tensor", "batch of one"],
)
def test_ids_in_any_integer_container_are_the_same_prompt(tiny, prompt):
    assert to_tokens(tiny[0], prompt).tolist() == TOKENS


def test_what_is_not_a_model_or_a_transcoder_set_is_said(tiny):
    """Before: `'str' object has no attribute 'cfg'` (AttributeError) for both."""
    model, tc = tiny
    with pytest.raises(UnsupportedModelError, match=r"^the model is a str, not a TransformerLens "):
        attribute("default", tc, TOKENS)
    with pytest.raises(TranscoderMismatchError, match=r"^the MLP set is a NoneType, not a transcoder set"):
        attribute(model, None, TOKENS)


def test_a_zero_or_non_finite_target_is_refused(tiny):
    """Before: a logit difference of a token with itself, and a direction of zeros, built a graph
    whose every edge into the target is 0; a NaN direction built NaN rows."""
    model, tc = tiny
    with pytest.raises(TargetError, match=r"logit_difference of 3 and 3 \(both token 3\) is 0 whatever"):
        logit_difference(model, 3, 3)
    zero = direction("blocks.1.hook_resid_post", 2, torch.zeros(model.cfg.d_model, dtype=torch.float64))
    with pytest.raises(TargetError, match=r"has a vector of zeros, so every edge into it would be 0"):
        attribute(model, tc, TOKENS, targets=[zero])
    nan = torch.ones(model.cfg.d_model, dtype=torch.float64)
    nan[3] = math.nan
    with pytest.raises(TargetError, match=r"has NaN or inf in its vector; pass a finite direction"):
        attribute(model, tc, TOKENS, targets=[direction("blocks.1.hook_resid_post", 2, nan)])
    graph = attribute(model, tc, TOKENS, targets=[logit_difference(model, 3, 4)])  # still works
    assert graph.nodes.kind[-1] == "logit"


def test_options_of_the_python_methods_that_make_no_sense(tiny):
    model, tc = tiny
    with pytest.raises(OptionError, match=r"^batch_size is 2\.5; pass a whole number, at least 1\.$"):
        attribute(model, tc, TOKENS, batch_size=2.5)
    with pytest.raises(OptionError, match=r"^tau is nan; pass a number"):  # before: everything detached
        attribute_hierarchical(model, tc, TOKENS, tau=math.nan)
    with pytest.raises(OptionError, match=r"^method='standard' does not take tau \(tau is for method="):
        attribute(model, tc, TOKENS, tau=0.1)
    with pytest.raises(OptionError, match=r"^method='adaptive' needs max_feature_nodes"):
        attribute(model, tc, TOKENS, method="adaptive")
    # a negative tau stays a choice (the seed's theorem: -inf detaches nothing), as does fp32
    assert attribute_hierarchical(model, tc, TOKENS, tau=-math.inf).meta["tau"] == -math.inf
    attribute(model, tc, TOKENS, method="hierarchical", precision="fp32", tau=0.0)


@pytest.mark.parametrize(
    "value,said",
    [
        (math.nan, "intervention value nan is not finite"),
        (SetTo(math.inf), "intervention value SetTo(value=inf) is not finite"),
        (Scale(math.inf), "intervention value Scale(factor=inf) is not finite"),
        (Add(-math.inf), "intervention value Add(delta=-inf) is not finite"),
        (SetTo("1"), "intervention value SetTo(value='1') is not a number, SetTo, Scale or Add"),
        (torch.tensor([1.0, 2.0]), "is not a number, SetTo, Scale or Add"),
    ],
)
def test_an_intervention_value_that_is_not_a_finite_number_is_refused(tiny, value, said):
    """Before: NaN and inf ran, and every activation and logit after the edit came out NaN."""
    model, tc = tiny
    with pytest.raises(InterventionError) as e:
        intervene(model, tc, TOKENS, {(0, 2, 1): value})
    assert said in str(e.value)


def test_interventions_that_are_no_mapping_and_generate_options(tiny):
    model, tc = tiny
    with pytest.raises(
        InterventionError, match=r"^interventions is a list; pass a dict from nodes to values"
    ):
        intervene(model, tc, TOKENS, [])  # before: AttributeError, 'list' object has no attribute 'items'
    with pytest.raises(InterventionError, match=r"^hold is -1; pass 0 or more"):  # before: ran
        generate(model, tc, TOKENS, {}, n_tokens=2, hold=-1)
    with pytest.raises(InterventionError, match=r"^temperature is nan; pass 0 \(greedy\) or a finite"):
        generate(model, tc, TOKENS, {}, n_tokens=2, temperature=math.nan)  # before: torch RuntimeError
    # a one-element tensor is a number, as float() reads it; the two ways give one output
    as_tensor = intervene(model, tc, TOKENS, {(0, 2, 1): torch.tensor(0.0)}).logits
    assert torch.equal(as_tensor, intervene(model, tc, TOKENS, {(0, 2, 1): 0.0}).logits)


@pytest.mark.parametrize(
    "options,said",
    [
        (dict(delta=math.nan), "delta is nan; pass the perturbation's size, a finite number above 0"),
        (dict(delta=0.0), "delta is 0.0"),
        (dict(windows=(-1,)), "windows (-1,) and ff_window 2 must be layer counts of 0 or more"),
        (dict(windows=()), "(at least one window"),
        (dict(ff_window=-2), "ff_window -2 must be"),
        (dict(max_features=0), "max_features is 0; max_features and batch_size must be >= 1"),
        (dict(n_perturbations=-3), "n_perturbations is -3; "),
    ],
)
def test_validate_config_values_that_make_no_sense(options, said):
    """Before: a NaN delta validated to NaN correlations; a negative window was refused as a patch
    range `layers=(0, -1)` the user never wrote; no window gave a report without ablations."""
    with pytest.raises(ValidationError) as e:
        ValidateConfig(**options)
    assert said in str(e.value)


def test_a_graph_argument_that_is_not_a_graph_names_the_function(tiny, tmp_path):
    """Before: AttributeErrors (`'str' object has no attribute 'meta'`, `... 'validate'`, ...)."""
    model, tc = tiny
    calls = {
        "prune_graph": lambda g: prune_graph(g),
        "save_graph": lambda g: save_graph(g, tmp_path / "g.h5"),
        "save_graphs": lambda g: save_graphs({"a": random_graph(0), "b": g}, tmp_path / "g.h5"),
        "compute_graph_scores": compute_graph_scores,
        "to_networkx": to_networkx,
        "graph_to_json": graph_to_json,
        "export_json": lambda g: export_json(g, tmp_path / "json"),
        "validate_graph": lambda g: validate_graph(model, tc, g),
        "head_loadings": lambda g: head_loadings(model, tc, g),
    }
    for who, call in calls.items():
        with pytest.raises(GraphError, match=rf"^{who} takes a Graph, got a str \('g\.h5' looks like a path"):
            call("g.h5")
    with pytest.raises(GraphError, match=r"^prune_graph takes a Graph, got a dict\.$"):
        prune_graph({})
    with pytest.raises(
        GraphError, match=r"^save_graphs takes a \{name: Graph\} mapping, got a Graph \(one graph: save_graph"
    ):
        save_graphs(random_graph(0), tmp_path / "g.h5")  # before: TypeError, 'Graph' object is not iterable
    assert not (tmp_path / "g.h5").exists() and not (tmp_path / "json").exists()
    compute_graph_scores(random_graph(0))  # a Graph still passes


def test_head_loadings_top_below_zero(tiny):
    model, tc = tiny
    graph = attribute(model, tc, TOKENS)
    with pytest.raises(OptionError, match=r"^top is -1; pass 0 or more edges"):  # before: all but one
        head_loadings(model, tc, graph, top=-1)


def test_loaders_take_dtype_names_as_transformer_lens_does_and_refuse_devices_this_machine_lacks(
    tiny, tmp_path
):
    """Before: `load_transcoders(device="cuda")` on a CPU-only torch was an AssertionError ("Torch not
    compiled with CUDA enabled"), `device="bogus"` torch's RuntimeError, and `dtype="float16"` a
    TypeError in both loaders, though TransformerLens takes these names."""
    for name, dtype in DTYPE_FROM_STRING.items():  # the oracle: TransformerLens's own table
        assert check_dtype(name) is dtype and check_dtype("torch." + name) is dtype
    assert check_dtype(torch.float64) is torch.float64
    for bad in ("int8", "half", torch.int64, None, 32):
        with pytest.raises(ConfigError, match=r"is not a floating-point torch dtype; pass torch\.float32"):
            check_dtype(bad)
    save_transcoders(tiny[1], tmp_path / "tc")
    assert load_transcoders(tmp_path / "tc", dtype="bf16").W_enc.dtype == torch.bfloat16
    with pytest.raises(ConfigError, match=r"^device 'bogus' is not a torch device"):
        load_transcoders(tmp_path / "tc", device="bogus")
    if not torch.cuda.is_available():
        with pytest.raises(ConfigError, match=r"^device 'cuda' was asked for, but CUDA is not available"):
            load_transcoders(tmp_path / "tc", device="cuda")


def test_an_unknown_task_is_refused_not_taken_for_greater_than(tiny):
    """Before: `task_data(model, "xyz", n)` built greater-than pairs; n = 0 was an IndexError."""
    from attrgraph.circuits import task_data
    from attrgraph.errors import CircuitMethodError

    with pytest.raises(CircuitMethodError, match=r"^task 'xyz' is unknown; use one of ioi, greater-than\.$"):
        task_data(tiny[0], "xyz", 4)
    for n in (0, "5"):
        with pytest.raises(OptionError, match=r"^n \(--n\) is .*; pass at least 1 example"):
            task_data(tiny[0], "ioi", n)


def test_component_circuits_name_what_is_not_a_model():
    """Before: `eap("default", pairs)` was `'str' object has no attribute 'cfg'`."""
    from attrgraph.circuits.graph import ComponentGraph

    with pytest.raises(UnsupportedModelError, match=r"^the model is a str, not a TransformerLens "):
        ComponentGraph.from_model("default")


def test_build_and_save_transcoders_refuse_what_they_cannot_take(tiny, tmp_path):
    """Before: AttributeErrors for a dict config and a non-set, and a `FileExistsError` traceback for
    a file where the folder goes."""
    from transcoders.build import build_transcoders

    with pytest.raises(ConfigError, match=r"^cfg is a dict, not a TranscoderConfig; pass TranscoderConfig"):
        build_transcoders({"kind": "plt"})
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match=r"file is a file; pass a folder to write into"):
        save_transcoders(tiny[1], tmp_path / "file")
    with pytest.raises(ConfigError, match=r"^the set to save is a str, not a transcoder set"):
        save_transcoders("tc", tmp_path / "tc")
    from transcoders.errors import UnknownFormatError

    with pytest.raises(UnknownFormatError, match=r"^format 'onnx' is not one of"):
        save_transcoders(tiny[1], tmp_path / "onnx", format="onnx")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # nothing written, no folder made


def test_the_notebook_view_and_supernode_suggestions_refuse_nonsense():
    from attrgraph.errors import SupernodeError
    from attrgraph.graph.supernodes import suggest_supernodes
    from attrgraph.viewer.notebook import show

    with pytest.raises(GraphError, match=r"^show takes a Graph, got a str \('g\.h5' looks like a path"):
        show("g.h5")  # before: AttributeError
    with pytest.raises(OptionError, match=r"^height is -1; pass the view's height in pixels"):
        show(random_graph(0), height=-1)  # before: a view of height -1
    with pytest.raises(
        SupernodeError, match=r"^min_size is 0; pass the fewest members of a group, 1 or more"
    ):
        suggest_supernodes(random_graph(0), min_size=0)


def test_circuit_methods_name_pairs_scores_and_examples_that_are_not_theirs():
    """Before: AttributeErrors (`'NoneType' object has no attribute 'to'`, `... 'layout'`,
    `'str' object has no attribute 'task'`)."""
    from attrgraph.bundled.loading import load_model
    from attrgraph.circuits import PruneConfig, evaluate_circuit, greedy, prune_edges, task_pairs, top_n
    from attrgraph.circuits.eap import eap
    from attrgraph.circuits.peap import peap

    model = load_model("default")
    for call in (
        lambda: eap(model, None),
        lambda: peap(model, "ioi"),
        lambda: prune_edges(model, [], PruneConfig()),
        lambda: evaluate_circuit(model, None, None),
    ):
        with pytest.raises(OptionError, match=r"^pairs is a (NoneType|str|list), not Pairs; make them with"):
            call()
    for call in (lambda: greedy(None, 5), lambda: top_n("eap", 5)):
        with pytest.raises(OptionError, match=r"^scores is a (NoneType|str), not EdgeScores"):
            call()
    for examples in (["a b"], [], "ioi"):
        with pytest.raises(OptionError, match=r"not the bundled tasks' examples; pass a non-empty list"):
            task_pairs(model, examples)

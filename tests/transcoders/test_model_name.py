"""A set used on another model than the one it records (sites.py step 5): same shapes and hooks, so
nothing else stops it; `check_fits` warns with one line naming both. The names are compared after
TransformerLens's own alias map (its `get_official_model_name`), the oracle for "the same model"."""

import warnings

import pytest
from transformer_lens.loading_from_pretrained import get_official_model_name

from tests.transcoders.tc_helpers import random_set, tiny_model
from transcoders import ModelNameWarning, check_fits, load_transcoders


def set_for(name: str, seed: int = 0):
    return random_set("plt", "relu", model_name=name, seed=seed)


def warned(model, tc) -> list[str]:
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        check_fits(model, tc)
    return [str(w.message) for w in seen if issubclass(w.category, ModelNameWarning)]


def test_a_set_of_another_model_is_named_in_one_line():
    model = tiny_model(model_name="gpt2")
    (message,) = warned(model, set_for("pythia-160m"))
    assert "'pythia-160m'" in message and "'gpt2'" in message and "\n" not in message
    assert "trained for model" in message


@pytest.mark.parametrize("alias", ["gpt2-small", "gpt2", "GPT2", "openai-community/gpt2"])
def test_aliases_of_the_model_are_the_model(alias):
    """Whatever TransformerLens resolves to the same official name is the same model."""
    try:
        official = get_official_model_name(alias)
    except ValueError:
        official = alias
    assert official.rsplit("/", 1)[-1].lower() == "gpt2"
    assert warned(tiny_model(model_name="gpt2"), set_for(alias)) == []


def test_a_hub_path_and_its_last_part_are_the_same_model():
    assert warned(tiny_model(model_name="gemma-2-2b"), set_for("google/gemma-2-2b")) == []
    assert warned(tiny_model(model_name="Llama-3.2-1B"), set_for("meta-llama/Llama-3.2-1B")) == []


@pytest.mark.parametrize("set_name, model_name", [("", "gpt2"), ("gpt2", "custom"), ("", "custom")])
def test_an_unnamed_set_or_model_is_not_judged(set_name, model_name):
    assert warned(tiny_model(model_name=model_name), set_for(set_name)) == []


def test_the_bundled_sets_fit_the_bundled_model():
    from attrgraph.bundled.loading import load_model

    model = load_model("default")
    for name in ("default-plt", "default-clt", "default-attn-sae"):
        assert warned(model, load_transcoders(name)) == []


def test_a_deliberate_pairing_still_builds_the_same_graph():
    """A warning, not a refusal: the graph is the one built when the names agree, value for value."""
    from attrgraph.bundled.loading import load_model
    from attrgraph.engine.attribute import attribute

    model = load_model("default")
    tc = load_transcoders("default-plt")
    prompt = "When Mary and John went to the store"
    g = attribute(model, tc, prompt)
    model.cfg.model_name = "gpt2"
    with pytest.warns(
        ModelNameWarning, match=r"trained for model 'attrgraph-default', but the model is 'gpt2'"
    ):
        other = attribute(model, tc, prompt)
    assert (g.adjacency != other.adjacency).nnz == 0 and g.adjacency.nnz > 0

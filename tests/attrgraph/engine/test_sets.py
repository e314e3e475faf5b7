"""Transcoder sets: one MLP set, `[mlp_set, attn_set]` or `TranscoderSets`, and one-line errors for misfits."""

import dataclasses

import pytest

from attrgraph.engine.attribute import attribute
from attrgraph.engine.replacement import ReplacementModel
from attrgraph.engine.sets import TranscoderSets, transcoder_sets
from tests.attrgraph.ag_helpers import tiny_attn_saes, tiny_model, tiny_transcoders
from transcoders.errors import TranscoderMismatchError


def with_cfg(tc, **changes):
    """A copy of the set's config with `changes`, on the same weights (configs are frozen)."""
    tc.cfg = dataclasses.replace(tc.cfg, **changes)
    return tc


def test_the_forms_of_a_set_normalise_to_one():
    model = tiny_model("gpt2")
    tc, sae = tiny_transcoders(model), tiny_attn_saes(model)
    assert transcoder_sets(model, tc) == TranscoderSets(tc, None)
    assert transcoder_sets(model, [tc]) == TranscoderSets(tc, None)
    assert transcoder_sets(model, [tc, sae]) == TranscoderSets(tc, sae)
    assert transcoder_sets(model, (tc, sae)) == TranscoderSets(tc, sae)
    assert transcoder_sets(model, TranscoderSets(mlp=tc, attn=sae)) == TranscoderSets(tc, sae)
    rm = ReplacementModel(model, TranscoderSets(tc, sae))
    assert rm.tc is tc and rm.attn is sae
    assert ReplacementModel(model, tc).attn is None


def test_misfit_attention_sets_are_refused_in_one_line():
    model = tiny_model("gpt2")
    tc = tiny_transcoders(model)
    other = tiny_model("gpt2", d_model=24)
    cases = [
        ([tc, tiny_attn_saes(other)], "attention SAEs have d_model 24 but the model has d_model 16"),
        (
            [tc, tiny_attn_saes(tiny_model("gpt2", n_layers=3))],
            "attention SAEs cover 3 layers but the model has 2",
        ),
        (
            [tc, tiny_transcoders(model)],
            r"attention set is a 'plt' set on 'blocks.\{layer\}.ln2.hook_normalized'",
        ),
        (
            [
                tc,
                with_cfg(
                    tiny_attn_saes(model),
                    input_hook="blocks.{layer}.hook_resid_pre",
                    output_hook="blocks.{layer}.hook_resid_pre",
                ),
            ],
            "must be an SAE set .* reading and writing 'blocks.{layer}.hook_attn_out'",
        ),
        ([tiny_attn_saes(model), tc], "the first set is an attention-output SAE"),
        ([tiny_attn_saes(model)], "the first set is an attention-output SAE"),
        ([tc, tiny_attn_saes(model), tc], "got 3 transcoder sets"),
        (
            [
                with_cfg(tiny_transcoders(model), model_name="gpt2"),
                with_cfg(tiny_attn_saes(model), model_name="llama"),
            ],
            "attention SAEs were trained for model 'llama' but the MLP transcoders for 'gpt2'",
        ),
        ([tc, "not a set"], "the attention set is a str, not a transcoder set"),
    ]
    for sets, message in cases:
        with pytest.raises(TranscoderMismatchError, match=message) as e:
            ReplacementModel(model, sets)
        assert "\n" not in str(e.value)
    with pytest.raises(TranscoderMismatchError, match="attention SAEs have d_model 24"):
        attribute(model, [tc, tiny_attn_saes(other)], [0, 1, 2])

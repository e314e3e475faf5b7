"""Bad input round 2 (../shared/BAD_INPUTS.md): NaN or inf weights in a set built in Python (so not
refused by load_transcoders) or in the model make attribution refuse, in one line, instead of
storing a graph of 0 features and NaN edges; a NaN edge value is never written into the rows."""

import math

import numpy as np
import pytest
import torch

from attrgraph import errors
from attrgraph.engine.attribute import attribute
from attrgraph.engine.csr_rows import CsrRowWriter
from attrgraph.engine.hierarchical import attribute_hierarchical
from attrgraph.engine.pruned_build import attribute_pruned
from tests.attrgraph.ag_helpers import tiny_model, tiny_transcoders

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TOKENS = [0, 5, 9, 3, 17]


def build(how: str, model, tc):
    if how == "attribute":
        return attribute(model, tc, TOKENS)
    if how == "attribute_pruned":
        return attribute_pruned(model, tc, TOKENS)
    return attribute_hierarchical(model, tc, TOKENS)


@pytest.mark.parametrize("how", ["attribute", "attribute_pruned", "hierarchical"])
@pytest.mark.parametrize("where", ["transcoders", "model"])
def test_nan_weights_are_refused_not_stored(how, where):
    model = tiny_model("gpt2")
    tc = tiny_transcoders(model)
    build(how, model, tc)  # finite: fine
    with torch.no_grad():
        if where == "transcoders":
            tc.W_enc[0, :, 2] = math.nan  # one feature's encoder, as a diverged run leaves it
        else:
            model.blocks[1].mlp.W_out[0, 0] = math.inf
    with pytest.raises(
        errors.NonFiniteValueError, match=r"forward pass on this prompt gave \d+ NaN or inf "
    ) as e:
        build(how, model, tc)
    assert "\n" not in str(e.value)


def test_a_block_of_rows_with_nan_or_inf_is_refused():
    out = CsrRowWriter(2, 3)
    out.append(np.array([0]), np.array([[1.0, 0.0, 2.0]], np.float32))
    for bad in (math.nan, math.inf):
        with pytest.raises(errors.NonFiniteValueError, match="1 NaN or inf edge values"):
            out.append(np.array([1]), np.array([[1.0, bad, 0.0]], np.float32))
    assert out.to_csr().nnz == 2  # the refused rows were not written

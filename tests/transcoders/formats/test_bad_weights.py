"""Bad input round 2 (../shared/BAD_INPUTS.md): a set whose weights hold NaN or inf (a diverged
training run: no manifest, so nothing else notices) is refused when loaded, in every format,
naming the tensor and how many of its values; a config.json that is not JSON says so and where."""

import json
import math

import pytest
import torch

from tests.transcoders.tc_helpers import random_set
from transcoders import CorruptTranscoderError, NonFiniteError, load_transcoders, save_transcoders

FORMATS = ["native", "circuit-tracer", "sae-lens", "gemmascope"]


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_set_with_non_finite_weights_is_refused_in_every_format(tmp_path, fmt, bad):
    tc = random_set("plt", "jumprelu", n_layers=2)
    with torch.no_grad():
        tc.W_enc[1, 3, :3] = bad  # three values of one tensor, as one diverged layer leaves them
    save_transcoders(tc, tmp_path / "set", format=fmt)
    with pytest.raises(NonFiniteError, match=r"W_enc holds 3 of \d+ values that are NaN or inf") as e:
        load_transcoders(tmp_path / "set")
    assert "\n" not in str(e.value) and str(tmp_path / "set") in str(e.value)


def test_a_finite_set_still_loads_and_a_bias_is_named_too(tmp_path):
    tc = random_set("plt", "jumprelu", n_layers=2)
    save_transcoders(tc, tmp_path / "ok")
    load_transcoders(tmp_path / "ok")
    with torch.no_grad():
        tc.b_dec[0, 0] = math.nan
    save_transcoders(tc, tmp_path / "bad")
    with pytest.raises(NonFiniteError, match=r"b_dec holds 1 of"):
        load_transcoders(tmp_path / "bad")


def test_values_past_the_range_of_the_asked_dtype_are_refused(tmp_path):
    """A float32 weight of 1e5 is finite, but inf in float16 (largest 65504)."""
    tc = random_set("plt", "relu", n_layers=2)
    with torch.no_grad():
        tc.W_dec[0, 0, 0] = 1e5
    save_transcoders(tc, tmp_path / "set")
    load_transcoders(tmp_path / "set")
    with pytest.raises(NonFiniteError, match=r"W_dec holds 1 of"):
        load_transcoders(tmp_path / "set", dtype=torch.float16)


@pytest.mark.parametrize("fmt", [None, "native"])
def test_config_json_that_is_not_json_says_where(tmp_path, fmt):
    save_transcoders(random_set("plt"), tmp_path)
    text = (tmp_path / "config.json").read_text()
    assert text.count("\n") > 5
    lines = text.splitlines()
    lines[2] = lines[2].rstrip(",")  # a comma lost in a hand edit, on line 3
    (tmp_path / "config.json").write_text("\n".join(lines) + "\n")
    with pytest.raises(json.JSONDecodeError) as expected:
        json.loads((tmp_path / "config.json").read_text())
    where = f"line {expected.value.lineno}, column {expected.value.colno}"
    with pytest.raises(CorruptTranscoderError, match=rf"config.json is not valid JSON: .*at {where}") as e:
        load_transcoders(tmp_path, format=fmt)
    assert "no format" not in str(e.value)

"""Bad input round 7 (docs/bad_inputs.md "Round 7"): damaged and foreign files in every format a set
is read from, as a hand edit, another tool's writer or a broken download leaves them. Each is refused
with one named exception (`transcoders.errors`) whose one line names the file and what is wrong in
it; before this round each raised KeyError, TypeError, AttributeError, a YAML or torch error, or
loaded with its integer weights cast to floats."""

import json
import re

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.transcoders.tc_helpers import random_set
from transcoders import load_transcoders, save_transcoders
from transcoders.errors import ConfigError, CorruptTranscoderError, TranscoderError, TranscoderNotFoundError


def refused(exc, pattern, path, **kw):
    """`load_transcoders(path)` raises `exc` with one line matching `pattern`."""
    with pytest.raises(exc, match=pattern) as e:
        load_transcoders(path, **kw)
    assert isinstance(e.value, TranscoderError) and "\n" not in str(e.value)
    return str(e.value)


def saved(tmp_path, fmt, kind="plt", **kw):
    folder = tmp_path / "set"
    save_transcoders(random_set(kind, "jumprelu", n_layers=3, **kw), folder, format=fmt)
    return folder


def edit_json(path, edit):
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def edit_tensors(path, edit):
    state = load_file(path)
    edit(state)
    save_file(state, path)


# ----------------------------------------------------------------------------------- our format
@pytest.mark.parametrize(
    "edit, pattern",
    [
        (lambda m: m.pop("config"), r'config\.json holds no "config" object'),
        (lambda m: m.update(config="plt"), r'config\.json holds no "config" object'),
        (
            lambda m: m["config"].update(skip="yes"),
            r"config\.json: skip is 'yes'; it must be true or false\.",
        ),
        (
            lambda m: m["config"].update(matryoshka_widths="abc"),
            r"config\.json: matryoshka_widths is 'abc'; it must be a list of integer feature counts\.",
        ),
        (lambda m: m["config"].update(model_name=5), r"config\.json: model_name is 5; it must be a string\."),
        (lambda m: m["config"].update(input_hook=7), r"config\.json: input_hook is 7; it must be a string\."),
        (
            lambda m: m["config"].update(bandwidth="wide"),
            r"config\.json: bandwidth is wide; it must be a finite",
        ),
    ],
)
def test_a_native_config_of_the_wrong_shape_names_the_file(tmp_path, edit, pattern):
    folder = saved(tmp_path, "native")
    edit_json(folder / "config.json", edit)
    refused((CorruptTranscoderError, ConfigError), pattern, folder)


@pytest.mark.parametrize("fmt", ["native", "circuit-tracer"])
@pytest.mark.parametrize("dtype", [torch.int64, torch.bool])
def test_integer_or_boolean_weights_are_refused_not_cast(tmp_path, fmt, dtype):
    folder = saved(tmp_path, fmt)
    name = "weights.safetensors" if fmt == "native" else "layer_1.safetensors"
    edit_tensors(folder / name, lambda s: s.update(W_enc=(s["W_enc"] * 100).to(dtype)))
    message = refused(
        CorruptTranscoderError, rf"W_enc holds {str(dtype)[6:]} values, not floating point", folder
    )
    assert name in message


def test_float16_weights_still_load(tmp_path):
    """A half-precision file is weights in another width, not damage: read, cast to the asked dtype."""
    folder = saved(tmp_path, "native")
    edit_tensors(folder / "weights.safetensors", lambda s: s.update(W_enc=s["W_enc"].half()))
    assert load_transcoders(folder).W_enc.dtype == torch.float32


def test_format_native_on_a_folder_without_config_json(tmp_path):
    folder = saved(tmp_path, "circuit-tracer")
    refused(
        TranscoderNotFoundError, r"has no config\.json file; .*leave format= out", folder, format="native"
    )


# ------------------------------------------------------------------------------- circuit-tracer
@pytest.mark.parametrize(
    "text, pattern",
    [
        (b"model_kind: [1,\n  b: :", r"config\.yaml is not UTF-8 YAML text \(.* at line 2, column \d+\)"),
        (b"model_kind: \xff\xfe\n", r"config\.yaml is not UTF-8 YAML text;"),
        (b"- 1\n- 2\n", r"config\.yaml holds a list, not a mapping"),
        (b"feature_input_hook: 5\n", r"config\.yaml: feature_input_hook is 5; it must be a string\."),
    ],
)
def test_a_circuit_tracer_config_yaml_that_is_not_one(tmp_path, text, pattern):
    folder = saved(tmp_path, "circuit-tracer")
    (folder / "config.yaml").write_bytes(text)
    refused(CorruptTranscoderError, pattern, folder)


@pytest.mark.parametrize(
    "key, cut, shape",
    [
        ("W_enc", lambda t: t[:20], (20, 32)),
        ("W_dec", lambda t: t[:, :16], (48, 16)),
        ("b_dec", lambda t: t[None], (1, 32)),
    ],
)
def test_one_circuit_tracer_layer_of_another_shape_is_named(tmp_path, key, cut, shape):
    folder = saved(tmp_path, "circuit-tracer")
    edit_tensors(folder / "layer_2.safetensors", lambda s: s.update({key: cut(s[key]).contiguous()}))
    refused(
        CorruptTranscoderError,
        rf"layer_2\.safetensors: {key} has shape {re.escape(str(shape))}, layer 0's has",  # as the file holds it
        folder,
    )


def test_a_clt_encoder_of_another_width_is_named(tmp_path):
    folder = saved(tmp_path, "circuit-tracer", kind="clt")
    edit_tensors(
        folder / "W_enc_1.safetensors", lambda s: s.update({"W_enc_1": s["W_enc_1"][:10].contiguous()})
    )
    refused(
        CorruptTranscoderError,
        r"W_enc_1\.safetensors: W_enc has shape \(10, 32\), layer 0's has \(48, 32\)",
        folder,
    )


@pytest.mark.parametrize("kept_in", [[1], [0, 2]])
def test_a_threshold_in_some_layers_only_is_refused(tmp_path, kept_in):
    """One nonlinearity serves the whole set: layer 0's files decided it, and the other layers'
    thresholds were dropped (or looked for and missed) without a word."""
    folder = saved(tmp_path, "circuit-tracer")
    for layer in {0, 1, 2} - set(kept_in):
        edit_tensors(folder / f"layer_{layer}.safetensors", lambda s: s.pop("activation_function.threshold"))
    refused(CorruptTranscoderError, r"holds 'activation_function\.threshold' but .* does not", folder)


# -------------------------------------------------------------------------------------- sae_lens
@pytest.mark.parametrize(
    "edit, pattern",
    [
        (lambda c: c.pop("dtype"), r"KeyError: 'dtype'"),
        (lambda c: c.pop("d_sae"), r"TypeError: .*'d_sae'"),
        (lambda c: c.update(architecture="bogus"), r"KeyError: 'bogus'"),
        (lambda c: c.update(metadata="x"), r"AttributeError"),
    ],
)
def test_a_sae_lens_cfg_json_sae_lens_cannot_use_is_one_line(tmp_path, edit, pattern):
    folder = saved(tmp_path, "sae-lens")
    edit_json(folder / "layer_1" / "cfg.json", edit)
    message = refused(CorruptTranscoderError, rf"layer_1 could not be read by sae_lens \({pattern}", folder)
    assert message.endswith("check its cfg.json and sae_weights.safetensors.")


def test_a_damaged_sae_lens_weights_file_is_one_line(tmp_path):
    folder = saved(tmp_path, "sae-lens")
    (folder / "layer_0" / "sae_weights.safetensors").write_bytes(b"abc")
    refused(CorruptTranscoderError, r"layer_0 could not be read by sae_lens \(SafetensorError: ", folder)


def test_a_sae_lens_hook_name_that_is_not_text(tmp_path):
    from transcoders.errors import UnknownFormatError

    folder = saved(tmp_path, "sae-lens")
    edit_json(folder / "layer_0" / "cfg.json", lambda c: c["metadata"].update(hook_name=5))
    refused(UnknownFormatError, r"sae_lens hook_name 5 is not a per-layer hook", folder)


def test_a_sae_lens_layer_of_another_width_names_what_differs(tmp_path):
    tc = random_set("plt", "jumprelu", n_layers=2)
    narrow = random_set("plt", "jumprelu", n_layers=2, d_sae=24)
    save_transcoders(tc, tmp_path / "a", format="sae-lens")
    save_transcoders(narrow, tmp_path / "b", format="sae-lens")
    (tmp_path / "a" / "layer_1").rename(tmp_path / "a" / "old")
    (tmp_path / "b" / "layer_1").rename(tmp_path / "a" / "layer_1")
    refused(
        CorruptTranscoderError,
        r"sae_lens layer 1 differs from layer 0 \(\(d_in, d_sae\) \(32, 24\) vs \(32, 48\)\)",
        [tmp_path / "a" / "layer_0", tmp_path / "a" / "layer_1"],
    )


# ------------------------------------------------------------------------------------ GemmaScope
@pytest.mark.parametrize(
    "value, pattern",
    [
        (
            lambda a: a.astype(np.int64),
            r"W_enc holds int64 values; GemmaScope's W_enc is a 2-D array of floats\.",
        ),
        (lambda a: np.array(["a", "b"]), r"W_enc holds <U1 values"),
        (lambda a: a[None], r"W_enc holds 3 axes \(shape \(1, 32, 48\)\)"),
        (lambda a: np.float32(1.0), r"W_enc holds 0 axes"),
    ],
)
def test_a_gemmascope_array_of_the_wrong_kind(tmp_path, value, pattern):
    folder = saved(tmp_path, "gemmascope")
    path = (
        next(folder.glob("layer_0/**/*.npz"))
        if not (folder / "layer_0.npz").exists()
        else folder / "layer_0.npz"
    )
    arrays = dict(np.load(path))
    arrays["W_enc"] = value(arrays["W_enc"])
    np.savez(path, **arrays)
    refused(CorruptTranscoderError, pattern, folder)


def test_gemmascope_encoder_and_decoder_of_one_orientation(tmp_path):
    """W_enc stored [d_sae, d_model] in every layer (another tool's orientation): said so, not as a
    decoder shape error against a config built from the wrong axes."""
    folder = saved(tmp_path, "gemmascope")
    for path in folder.rglob("*.npz"):
        arrays = dict(np.load(path))
        arrays["W_enc"] = arrays["W_enc"].T.copy()
        np.savez(path, **arrays)
    refused(
        CorruptTranscoderError,
        r"W_enc has shape \(48, 32\) and W_dec \(48, 32\); GemmaScope's W_enc is \[d_model, d_sae\]",
        folder,
    )


# ----------------------------------------------------------------------------- the call itself
@pytest.mark.parametrize(
    "fmt, kwargs, pattern",
    [
        ("native", {"colour": 5}, r"got colour= which the native reader does not take \(it takes none\)"),
        (
            "gemmascope",
            {"colour": 5},
            r"got colour= which the gemmascope reader does not take \(it takes input_hook",
        ),
        ("circuit-tracer", {"input_hook": "x"}, r"got input_hook= which the circuit-tracer reader"),
    ],
)
def test_a_keyword_the_format_does_not_read_is_refused(tmp_path, fmt, kwargs, pattern):
    """Before, native and circuit-tracer folders ignored every extra keyword (a misspelt
    `output_hook` read as nothing) and GemmaScope raised Python's TypeError."""
    refused(ConfigError, pattern, saved(tmp_path, fmt), **kwargs)


def test_a_gemmascope_hook_that_is_not_text(tmp_path):
    refused(
        ConfigError, r"input_hook is 5; it must be a string\.", saved(tmp_path, "gemmascope"), input_hook=5
    )


@pytest.mark.parametrize("items, what", [([], "nothing"), ([1, 2], "int")])
def test_a_list_that_holds_no_layers(items, what):
    refused(ConfigError, rf"a list of transcoders holds {what}; pass one sae_lens SAE", items)


def test_the_readers_still_take_their_own_keywords(tmp_path):
    tc = load_transcoders(saved(tmp_path, "gemmascope"), model_name="mine")
    assert tc.cfg.model_name == "mine" and tc.n_layers == 3

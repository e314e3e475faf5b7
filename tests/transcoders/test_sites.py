"""The read/write site convention: MLP input includes ln2's weight and bias; post-norm writes."""

import pytest
import torch

from tests.transcoders.tc_helpers import random_set, tiny_model
from transcoders import TranscoderConfig, TranscoderMismatchError, build_transcoders, check_fits
from transcoders.sites import cache_hooks, collect, mlp_input, to_write_site, write_target


def mlp_io(model, tokens):
    """What each `blocks.{l}.mlp` receives and returns, from forward hooks on the modules."""
    seen = {}
    handles = [
        model.blocks[l].mlp.register_forward_hook(lambda m, i, o, l=l: seen.__setitem__(l, (i[0], o)))
        for l in range(model.cfg.n_layers)
    ]
    model(tokens)
    for h in handles:
        h.remove()
    return seen


@pytest.mark.parametrize("norm", ["LN", "RMS", "LNPre"])
def test_mlp_input_is_what_the_mlp_receives(norm):
    model = tiny_model(normalization_type=norm)
    tokens = torch.randint(0, 50, (2, 7))
    seen = mlp_io(model, tokens)
    _, cache = model.run_with_cache(tokens)
    for l in range(2):
        torch.testing.assert_close(mlp_input(model, cache, l), seen[l][0])
        assert norm == "LNPre" or not torch.allclose(cache[f"blocks.{l}.ln2.hook_normalized"], seen[l][0])


def test_collect_stacks_all_layers(model):
    tc = random_set("plt")
    tokens = torch.randint(0, 50, (3, 9))
    x, y = collect(model, tokens, tc.cfg)
    assert x.shape == y.shape == (3, 9, 2, 32)
    seen = mlp_io(model, tokens)
    for l in range(2):
        torch.testing.assert_close(x[:, :, l], seen[l][0])
        torch.testing.assert_close(y[:, :, l], seen[l][1])


def test_output_before_post_norm_round_trips_to_hook_mlp_out():
    model = tiny_model(normalization_type="RMS", use_normalization_before_and_after=True)
    cfg = TranscoderConfig(kind="plt", n_layers=2, d_model=32, d_sae=16, output_before_post_norm=True)
    tokens = torch.randint(0, 50, (2, 6))
    seen = mlp_io(model, tokens)
    names = set(cache_hooks(model, cfg))
    _, cache = model.run_with_cache(
        tokens, names_filter=lambda n: n in names | {f"blocks.{l}.hook_mlp_out" for l in range(2)}
    )
    for l in range(2):
        raw = write_target(model, cache, l, cfg)
        torch.testing.assert_close(raw, seen[l][1], rtol=1e-5, atol=1e-5)  # the MLP's own output
        torch.testing.assert_close(
            to_write_site(model, cache, l, raw, cfg), cache[f"blocks.{l}.hook_mlp_out"]
        )
    # without the flag the target is the literal hook value
    literal = TranscoderConfig(kind="plt", n_layers=2, d_model=32, d_sae=16)
    _, cache = model.run_with_cache(tokens)
    torch.testing.assert_close(write_target(model, cache, 0, literal), cache["blocks.0.hook_mlp_out"])


@pytest.mark.parametrize(
    "kind, read, write",
    [("clt", "mlp in", "mlp out"), ("sae", "blocks.{l}.hook_attn_out", "blocks.{l}.hook_attn_out")],
)
def test_check_fits_accepts_a_fitting_set_that_then_runs(model, kind, read, write):
    """A set that fits passes silently, and it does fit: its sites hold d_model-wide values of
    every layer (the MLP's own input and output, or the literal hook value), which it encodes."""
    tc = random_set(kind)
    assert check_fits(model, tc) is None
    tokens = torch.randint(0, 50, (2, 5))
    x, y = collect(model, tokens, tc.cfg)
    seen = mlp_io(model, tokens)
    _, cache = model.run_with_cache(tokens)
    for l in range(2):
        want_x = seen[l][0] if read == "mlp in" else cache[read.format(l=l)]
        want_y = seen[l][1] if write == "mlp out" else cache[write.format(l=l)]
        torch.testing.assert_close(x[:, :, l], want_x)
        torch.testing.assert_close(y[:, :, l], want_y)
    assert tc(x).out.shape == y.shape == (2, 5, 2, 32)


@pytest.mark.parametrize(
    "kw, words",
    [
        (dict(d_model=16), "d_model 16"),
        (dict(n_layers=3), "cover 3 layers"),
        (dict(input_hook="blocks.{layer}.hook_nonexistent"), "does not exist"),
        (dict(output_hook="blocks.{layer}.mlp.hook_out"), "does not exist"),
    ],
)
def test_check_fits_names_the_mismatch(model, kw, words):
    base = dict(kind="plt", n_layers=2, d_model=32, d_sae=8)
    base.update(kw)
    with pytest.raises(TranscoderMismatchError, match=words):
        check_fits(model, build_transcoders(TranscoderConfig(**base)))

"""Every tensor of a set declares its feature axis (base.py `declare_features`), and sharding refuses one
that does not rather than copy it to every rank (issue 33: `feature_dim` used to guess from names and
returned None, "replicated", for a name it did not know).

The expected axes come from the shapes alone: build the set with two widths; the feature axis of a
tensor is the one whose length follows `d_sae` (none for a tensor whose shape does not change)."""

import pytest
import torch
from torch import nn

from transcoders import TranscoderConfig, build_transcoders
from transcoders import distributed as tdist
from transcoders.build import feature_dims_of
from transcoders.errors import UndeclaredFeatureAxisError
from transcoders.nonlinearity import NONLINEARITIES

CASES = [(kind, act) for kind in ("plt", "clt", "sae") for act in NONLINEARITIES]


def build(kind, activation, d_sae, training=False):
    hook = "blocks.{layer}.hook_resid_mid" if kind == "sae" else "blocks.{layer}.ln2.hook_normalized"
    cfg = TranscoderConfig(
        kind=kind,
        n_layers=3,
        d_model=4,
        d_sae=d_sae,
        activation=activation,
        k=2,
        matryoshka_widths=(3,) if NONLINEARITIES[activation].nested else (),
        input_hook=hook,
        skip=kind != "sae",
        **({"output_hook": hook} if kind == "sae" else {}),
    )
    tc = build_transcoders(cfg)
    if training:
        tc.nonlinearity.begin_training(tc)
    return tc


def axes_from_shapes(narrow: nn.Module, wide: nn.Module) -> dict[str, int | None]:
    """The axis whose length differs between the two widths, per tensor (None where none does)."""
    a, b = narrow.state_dict(), wide.state_dict()
    out = {}
    for name, t in a.items():
        differ = [i for i, (m, n) in enumerate(zip(t.shape, b[name].shape, strict=True)) if m != n]
        assert len(differ) <= 1, name
        out[name] = differ[0] if differ else None
    return out


@pytest.mark.parametrize("training", [False, True])
@pytest.mark.parametrize("kind,activation", CASES)
def test_every_tensor_declares_the_axis_its_shape_says(kind, activation, training):
    narrow, wide = build(kind, activation, 6, training), build(kind, activation, 10, training)
    want = axes_from_shapes(narrow, wide)
    assert {name: narrow.feature_dim(name) for name in want} == want
    for name, _ in narrow.named_parameters():  # what the optimizer and the clip see
        assert narrow.feature_dim(name) == want[name]
    # a checkpoint's tensors: Adam's moments follow their parameter, its step counts have no axis
    dims = narrow.feature_dims()
    for name in want:
        assert tdist.feature_dim(f"tc.{name}", dims) == want[name]
        assert tdist.feature_dim(f"opt.{name}.exp_avg", dims) == want[name]
        assert tdist.feature_dim(f"opt.{name}.step", dims) is None
    assert feature_dims_of(narrow.cfg) == build(kind, activation, 6).feature_dims()  # no set needed


def test_an_undeclared_tensor_is_refused_not_copied():
    """A parameter added without a declared axis: slicing a state, the full shapes and the trainer's
    split into sharded / replicated parameters all stop with one sentence naming it."""
    tc = build("plt", "jumprelu", 6)
    tc.W_gate = nn.Parameter(torch.zeros(3, 4, 6))  # a new parameter nobody declared
    d = tdist.Dist(0, 2, "features")
    with pytest.raises(UndeclaredFeatureAxisError, match="'W_gate' has no declared feature axis"):
        tdist.shard_state(tc.state_dict(), tc.feature_dims(), d)
    with pytest.raises(UndeclaredFeatureAxisError, match="'W_gate'"):
        tdist.full_shapes(tc, d)
    with pytest.raises(UndeclaredFeatureAxisError, match="'W_gate'"):
        [tc.feature_dim(n) for n, _ in tc.named_parameters()]
    with pytest.raises(UndeclaredFeatureAxisError, match="'opt.W_gate.exp_avg'"):
        tdist.feature_dim("opt.W_gate.exp_avg", tc.feature_dims())
    tc.declare_features(W_gate=2)  # declared: now it is split like W_enc
    part = tdist.shard_state(tc.state_dict(), tc.feature_dims(), d)
    assert part["W_gate"].shape == (3, 4, 3)

"""The local replacement model: reproduces the logits, is affine in its sources, refuses misfits."""

import dataclasses

import pytest
import torch

from attrgraph.engine.replacement import ReplacementModel
from attrgraph.errors import UnsupportedModelError
from tests.attrgraph.ag_helpers import ARCHS, TRANSCODERS, tiny_model, tiny_transcoders
from transcoders import sites
from transcoders.config import TranscoderConfig
from transcoders.errors import TranscoderMismatchError
from transcoders.plt import PerLayerTranscoder
from transcoders.sae import SAE

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("kind,skip", TRANSCODERS)
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_replacement_reproduces_logits(arch, kind, skip, dtype, tol):
    model = tiny_model(arch, dtype)
    rm = ReplacementModel(model, tiny_transcoders(model, kind, skip))
    tokens = torch.tensor([0, 5, 9, 3, 17, 22, 5, 9])
    state = rm.run(tokens)
    assert (state.acts > 0).any()
    ref = model(tokens[None])[0]
    got = rm.forward(state)
    assert (got.logits - ref).abs().max() <= tol * ref.abs().max()
    assert torch.allclose(got.pre_acts, state.pre_acts, atol=tol * 10)
    # the errors are what closes the gap: without them the logits move
    moved = rm.forward(state, errors=torch.zeros_like(state.errors)).logits
    assert (moved - ref).abs().max() > 1e3 * tol * ref.abs().max()


@pytest.mark.parametrize("arch", ["gpt2", "gemma2"])
def test_frozen_model_is_affine_in_its_sources(arch):
    model = tiny_model(arch)
    rm = ReplacementModel(model, tiny_transcoders(model, "clt"))
    state = rm.run(torch.tensor([0, 4, 8, 15, 16, 23]))
    g = torch.Generator().manual_seed(0)
    d = [torch.randn(t.shape, generator=g, dtype=t.dtype) for t in (state.acts, state.errors, state.embed)]
    f = [
        rm.forward(state, state.acts + k * d[0], state.errors + k * d[1], state.embed + k * d[2])
        for k in (0, 1, 2)
    ]
    for field in ("logits", "pre_acts"):
        a, b, c = (getattr(x, field) for x in f)
        assert torch.allclose(b - a, c - b, atol=1e-9, rtol=1e-9)
        assert (b - a).abs().max() > 1e-3  # the perturbation does reach the outputs


def test_mismatched_transcoders_are_refused():
    model = tiny_model("gpt2")
    for cfg in (
        TranscoderConfig(kind="plt", n_layers=2, d_model=8, d_sae=4),
        TranscoderConfig(kind="plt", n_layers=3, d_model=16, d_sae=4),
        TranscoderConfig(kind="plt", n_layers=2, d_model=16, d_sae=4, input_hook="blocks.{layer}.hook_nope"),
    ):
        with pytest.raises(TranscoderMismatchError):
            ReplacementModel(model, PerLayerTranscoder(cfg))


def test_a_set_whose_tokens_depend_on_their_batch_is_refused_until_eval():
    """BatchTopK in training mode couples the tokens of a batch (its batch rule); in eval mode it is
    per token (its estimated threshold). Asked of the set (`per_token`), not of its name."""
    model = tiny_model("gpt2")
    cfg = TranscoderConfig(kind="plt", n_layers=2, d_model=16, d_sae=8, activation="batchtopk", k=2)
    mlp = PerLayerTranscoder(cfg).init_weights(torch.Generator().manual_seed(0)).train()
    acfg = dataclasses.replace(cfg, kind="sae", input_hook=sites.ATTN_OUTPUT, output_hook=sites.ATTN_OUTPUT)
    attn = SAE(acfg).train()
    with pytest.raises(TranscoderMismatchError, match="batchtopk set is in training mode"):
        ReplacementModel(model, mlp)
    with pytest.raises(TranscoderMismatchError, match=r"attention SAE set \(batchtopk\) is in training"):
        ReplacementModel(model, [tiny_transcoders(model), attn])
    ReplacementModel(model, [mlp.eval(), attn.eval()])


def test_logit_softcap_is_refused():
    model = tiny_model("gemma2")
    model.cfg.output_logits_soft_cap = 30.0
    with pytest.raises(UnsupportedModelError, match="soft-caps"):
        ReplacementModel(model, tiny_transcoders(model))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-5)])
def test_replacement_with_attention_saes_reproduces_logits(arch, dtype, tol):
    """Both MLP outputs and attention outputs replaced (features + errors): the logits are the
    model's, every attention SAE pre-activation is the recorded one, and each kind of error is needed."""
    from tests.attrgraph.ag_helpers import tiny_attn_saes

    model = tiny_model(arch, dtype)
    rm = ReplacementModel(model, [tiny_transcoders(model, "clt"), tiny_attn_saes(model)])
    tokens = torch.tensor([0, 5, 9, 3, 17, 22, 5, 9])
    state = rm.run(tokens)
    assert (state.attn_acts > 0).any() and (state.attn_acts[:, 0] == 0).all()  # BOS excluded
    ref = model(tokens[None])[0]
    got = rm.forward(state)
    assert (got.logits - ref).abs().max() <= tol * ref.abs().max()
    assert torch.allclose(got.attn_pre_acts, state.attn_pre_acts, atol=tol * 10)
    for moved in (
        rm.forward(state, attn_errors=torch.zeros_like(state.attn_errors)).logits,
        rm.forward(state, errors=torch.zeros_like(state.errors)).logits,
    ):
        assert (moved - ref).abs().max() > 1e3 * tol * ref.abs().max()

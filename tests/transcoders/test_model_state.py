"""What a session leaves on a model, met by training and the activation reads (model_state.py;
docs/bad_inputs.md, round 9): a hook still attached trained a set on the hooked model's activations
without a word; `.half()` failed inside TransformerLens; `train` inside `torch.no_grad()` failed with
torch's `element 0 of tensors does not require grad`."""

from pathlib import Path

import pytest
import torch
from torch import nn

from tests.transcoders.tc_helpers import tiny_model
from tests.transcoders.test_train import random_sequences, small_cfg
from transcoders.errors import ModelStateError
from transcoders.model_state import attached_hooks, check_no_hooks
from transcoders.sites import collect
from transcoders.train import train, transcoder_config

STEPS = 256 * 4


def test_a_hooked_model_is_refused_before_its_activations_are_read(tmp_path):
    """Before: `train(cfg, model=hooked)` trained on the hooked model's activations (they are what
    `collect` read); now the run stops before its first step, naming the hook."""
    model = tiny_model()
    model.add_hook("blocks.1.hook_resid_pre", lambda x, hook: x * 2)
    with pytest.raises(
        ModelStateError, match=r"^hooks are attached to the model at blocks\.1\.hook_resid_pre: "
    ):
        train(small_cfg(tmp_path, n_tokens=STEPS), model=model, sequences=random_sequences(), progress=False)
    assert not (tmp_path / "run" / "checkpoint").exists()


def test_training_inside_no_grad_or_inference_mode_trains_the_set_it_trains_outside(tmp_path):
    """Training differentiates the set, whatever block the caller is in: the same seed gives the same
    weights, tensor for tensor."""
    model, seqs = tiny_model(), random_sequences()
    want, _ = train(small_cfg(tmp_path / "a", n_tokens=STEPS), model=model, sequences=seqs, progress=False)
    for i, block in enumerate((torch.no_grad, torch.inference_mode)):
        with block():
            got, _ = train(
                small_cfg(tmp_path / f"b{i}", n_tokens=STEPS), model=model, sequences=seqs, progress=False
            )
        assert all(torch.equal(a, b) for a, b in zip(got.state_dict().values(), want.state_dict().values()))
        assert not got.W_enc.is_inference()


def test_weights_converted_past_cfg_dtype_are_refused_where_activations_are_read():
    model = tiny_model()
    model.half()
    cfg = small_cfg(Path("unused"))
    with pytest.raises(
        ModelStateError,
        match=r"^the model's weights are float16 \(embed\.W_E\) but model\.cfg\.dtype is float32",
    ):
        collect(model, random_sequences(n=2), transcoder_config(cfg, model))


def test_every_kind_of_hook_is_found_and_a_clean_model_has_none():
    """TransformerLens's hook points by name, torch's forward, pre-forward and backward hooks on any
    submodule; a new model has none, and torch's global module hooks (profilers, device checks,
    which watch every module and change nothing) are not counted."""
    model = tiny_model()
    assert attached_hooks(model) == []
    check_no_hooks(model, "x")
    handles = [
        model.blocks[0].attn.register_forward_pre_hook(lambda m, a: None),
        model.blocks[1].mlp.register_full_backward_hook(lambda m, gi, go: None),
    ]
    model.add_hook("blocks.0.hook_resid_post", lambda x, hook: x, dir="bwd")
    assert attached_hooks(model) == ["blocks.0.attn", "blocks.0.hook_resid_post", "blocks.1.mlp"]
    for h in handles:
        h.remove()
    model.reset_hooks()
    glob = nn.modules.module.register_module_forward_hook(lambda m, a, o: None)
    try:
        assert attached_hooks(model) == []
    finally:
        glob.remove()


def test_the_spliced_metrics_refuse_a_hooked_model():
    """The original run and the spliced ones would all carry the hook: metrics of the hooked model."""
    from tests.transcoders.tc_helpers import random_set
    from transcoders.metrics import spliced_metrics

    model = tiny_model()
    tc = random_set("plt", d_model=model.cfg.d_model, n_layers=model.cfg.n_layers)
    model.add_hook("blocks.0.hook_mlp_out", lambda x, hook: x * 0)
    with pytest.raises(
        ModelStateError, match=r"^hooks are attached to the model at blocks\.0\.hook_mlp_out: .*metrics"
    ):
        spliced_metrics(model, [tc], random_sequences(n=2))

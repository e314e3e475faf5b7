"""Matryoshka BatchTopK (Bussmann et al. 2025) against sae_lens's `MatryoshkaBatchTopKTrainingSAE`, the
oracle: the training activations, the loss with its nested terms and every gradient, on one layer; a
set sae_lens trained and saved (as JumpReLU, its inference form) reads back as sae_lens runs it; and
the config refuses widths that do not nest.

Scale: our MSE averages over `d_model` where sae_lens sums, so ours = theirs / d_model, gradients too."""

import pytest
import torch
from sae_lens import JumpReLUSAE
from sae_lens.saes.matryoshka_batchtopk_sae import (
    MatryoshkaBatchTopKTrainingSAE,
    MatryoshkaBatchTopKTrainingSAEConfig,
)
from sae_lens.saes.sae import SAEMetadata, TrainStepInput

from transcoders import ConfigError, TranscoderConfig, build_transcoders, load_transcoders
from transcoders.base import LossWeights
from transcoders.distributed import Dist

D, S, K, N = 8, 24, 3, 40
WIDTHS = (4, 12)
HOOK = "blocks.{layer}.hook_resid_pre"


def theirs(seed: int = 0) -> MatryoshkaBatchTopKTrainingSAE:
    cfg = MatryoshkaBatchTopKTrainingSAEConfig(
        d_in=D,
        d_sae=S,
        k=K,
        matryoshka_widths=[*WIDTHS, S],
        apply_b_dec_to_input=False,
        rescale_acts_by_decoder_norm=False,
        metadata=SAEMetadata(hook_name=HOOK.format(layer=0)),
    )
    sae = MatryoshkaBatchTopKTrainingSAE(cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name in ("W_enc", "b_enc", "W_dec", "b_dec"):
            p = getattr(sae, name)
            p.copy_(torch.randn(p.shape, generator=g) * (0.3 if name.startswith("b") else 1.0))
    return sae


def ours_like(sae) -> torch.nn.Module:
    cfg = TranscoderConfig(
        kind="sae",
        n_layers=1,
        d_model=D,
        d_sae=S,
        activation="matryoshka_batchtopk",
        k=K,
        matryoshka_widths=WIDTHS,
        input_hook=HOOK,
        output_hook=HOOK,
    )
    tc = build_transcoders(cfg)
    with torch.no_grad():
        tc.W_enc[0].copy_(sae.W_enc)
        tc.b_enc[0].copy_(sae.b_enc)
        tc.W_dec[0].copy_(sae.W_dec)
        tc.b_dec[0].copy_(sae.b_dec)
    return tc.train()


def test_forward_loss_and_gradients_equal_sae_lens():
    sae = theirs()
    tc = ours_like(sae)
    x = torch.randn(N, D, generator=torch.Generator().manual_seed(1))
    step = TrainStepInput(
        sae_in=x, coefficients={}, dead_neuron_mask=None, n_training_steps=0, is_logging_step=False
    )
    out = sae.training_forward_pass(step)
    assert set(out.losses) >= {f"inner_mse_loss_{w}" for w in WIDTHS}
    acts = tc(x[:, None]).acts[:, 0]
    torch.testing.assert_close(acts, out.feature_acts, rtol=0, atol=0)
    assert 0 < (acts > 0).sum() <= K * N  # the batch budget, shared by the tokens

    res = tc.train_forward(x[:, None], x[:, None], LossWeights(), lam=0.0)
    nested = tc.nonlinearity.nested_loss(tc, tc(x[:, None]).acts, res.out, x[:, None], Dist())
    inner = sum(out.losses[f"inner_mse_loss_{w}"] for w in WIDTHS)
    torch.testing.assert_close(nested * D, inner, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(res.loss * D, out.loss, rtol=1e-5, atol=1e-6)

    sae.zero_grad()
    out.loss.backward()
    tc.zero_grad()
    (res.loss * D).backward()
    for name in ("W_enc", "b_enc", "W_dec", "b_dec"):
        torch.testing.assert_close(
            getattr(tc, name).grad[0], getattr(sae, name).grad, rtol=1e-4, atol=1e-5, msg=name
        )


def test_a_set_sae_lens_trained_and_saved_reads_back_as_it_runs(tmp_path):
    """sae_lens saves a Matryoshka BatchTopK SAE as JumpReLU (its estimated threshold); we read that."""
    sae = theirs(seed=3)
    x = torch.randn(64, D, generator=torch.Generator().manual_seed(4))
    step = TrainStepInput(
        sae_in=x, coefficients={}, dead_neuron_mask=None, n_training_steps=0, is_logging_step=False
    )
    sae.training_forward_pass(step)  # estimates its threshold
    sae.save_inference_model(tmp_path / "layer_0")
    loaded = load_transcoders(tmp_path)
    oracle = JumpReLUSAE.load_from_disk(tmp_path / "layer_0")
    assert loaded.cfg.activation == "jumprelu"
    with torch.no_grad():
        got = loaded(x[:, None])
        torch.testing.assert_close(got.acts[:, 0], oracle.encode(x), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(got.out[:, 0], oracle(x), rtol=1e-5, atol=1e-6)
    assert (got.acts > 0).any()


@pytest.mark.parametrize(
    "activation, widths, match",
    [
        ("matryoshka_batchtopk", (), "needs at least one"),
        ("batchtopk", (4,), "go with matryoshka_batchtopk"),
        ("matryoshka_batchtopk", (12, 4), "positive and increase strictly"),
        ("matryoshka_batchtopk", (0, 4), "positive and increase strictly"),
    ],
)
def test_widths_that_do_not_nest_are_refused(activation, widths, match):
    with pytest.raises(ConfigError, match=match):
        TranscoderConfig(
            kind="plt", n_layers=1, d_model=D, d_sae=S, activation=activation, k=K, matryoshka_widths=widths
        )


def test_training_refuses_a_width_of_the_whole_set():
    from transcoders.train import TrainConfig

    with pytest.raises(ConfigError, match=r"matryoshka_widths \[4, 24\] must stay below d_sae 24"):
        TrainConfig(activation="matryoshka_batchtopk", d_sae=S, k=K, matryoshka_widths=(4, 24))


def test_the_cli_refuses_bad_widths_in_one_line_before_loading_anything(capsys):
    from transcoders.train import main

    with pytest.raises(SystemExit) as e:
        main(["--activation", "matryoshka_batchtopk", "--matryoshka-widths", "12", "4", "--d-sae", "64"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "Traceback" not in err
    assert "error: matryoshka_widths [12, 4] must be positive and increase strictly." in err


def test_one_process_training_resumes_exactly(tmp_path):
    """A one-process run stopped and rerun resumes to the uninterrupted run's weights (its tuple option
    reads back from the checkpoint's JSON as equal), and the set trained its inference threshold."""
    from tests.transcoders.tc_helpers import tiny_model
    from tests.transcoders.test_train import random_sequences, small_cfg
    from transcoders.train import train

    model, seqs = tiny_model(), random_sequences()
    kw = dict(
        activation="matryoshka_batchtopk",
        k=4,
        matryoshka_widths=(8, 24),
        n_tokens=256 * 12,
        checkpoint_every=4,
    )
    straight, _ = train(small_cfg(tmp_path / "a", **kw), model=model, sequences=seqs, progress=False)
    cfg = small_cfg(tmp_path / "b", **kw)
    assert train(cfg, model=model, sequences=seqs, progress=False, stop_after=5)[1] == {"stopped_at": 5}
    resumed, _ = train(cfg, model=model, sequences=seqs, progress=False)
    for k, v in straight.state_dict().items():
        torch.testing.assert_close(resumed.state_dict()[k], v, rtol=0, atol=0)
    assert straight.cfg.matryoshka_widths == (8, 24) and bool((straight.threshold > 0).all())

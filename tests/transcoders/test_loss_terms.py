"""Every term of the training loss against a value from outside the code under test.

Oracles: sae_lens's training SAEs, one layer at a time (a set's loss is the sum over its layers of
per-layer losses, `mean_tokens sum_{l,f} = sum_l mean_tokens sum_f`): `JumpReLUTrainingSAE` for the
tanh penalty, the L0 penalty through `Step` and the pre-activation loss, `StandardTrainingSAE` for
the decoder-norm-weighted L1, `TopKTrainingSAE` for AuxK. The circuit-tracing appendix ("ML
details") for the pre-activation loss `sum_f ReLU(-h_f)` and the penalty's ramp "from 0 to its final
value throughout the entire duration of training". Where neither applies, small cases worked out by
hand in the comments beside them.
"""

import dataclasses
import math

import pytest
import torch
from sae_lens.saes.jumprelu_sae import JumpReLUTrainingSAE, JumpReLUTrainingSAEConfig, calculate_pre_act_loss
from sae_lens.saes.sae import TrainStepInput
from sae_lens.saes.standard_sae import StandardTrainingSAE, StandardTrainingSAEConfig
from sae_lens.saes.topk_sae import TopKTrainingSAE, TopKTrainingSAEConfig

from tests.transcoders.tc_helpers import random_set, tiny_model
from tests.transcoders.test_train import random_sequences, small_cfg
from transcoders import TranscoderConfig, build_transcoders
from transcoders.losses import mse_loss, preact_loss, sparsity_schedule, topk_aux_loss
from transcoders.nonlinearity import LOG_THRESHOLD, JumpReLU, Penalty
from transcoders.train import train

L, D, S, N = 2, 8, 6, 40  # layers, d_model, d_sae, tokens


def _step_input(d_in: int, dead: torch.Tensor | None) -> TrainStepInput:
    """What sae_lens's `calculate_aux_loss` reads: the penalty's coefficient (1) and the dead mask."""
    return TrainStepInput(
        sae_in=torch.zeros(1, d_in),
        coefficients={"l0": 1.0, "l1": 1.0},
        dead_neuron_mask=dead,
        n_training_steps=0,
        is_logging_step=False,
    )


def _load_layer(sae, W_dec: torch.Tensor, threshold: torch.Tensor | None = None):
    """sae_lens's SAE holding one layer's decoder [d_sae, d_model] (and threshold) as its own leaves."""
    with torch.no_grad():
        sae.W_dec.copy_(W_dec)
        if threshold is not None:
            sae.threshold.copy_(threshold)
    return sae


def _jumprelu_inputs(seed: int):
    """A JumpReLU PLT, pre-activations spread well beyond the kernel's width (so the L0 estimator's
    window `|h - theta| < eps / 2` excludes many inactive entries) and thresholds in (0.02, 0.32)."""
    tc = random_set("plt", "jumprelu", n_layers=L, d_model=D, d_sae=S, seed=seed)
    g = torch.Generator().manual_seed(seed + 10)
    pre = torch.randn(N, L, S, generator=g) * 1.5
    with torch.no_grad():
        tc.threshold.copy_(torch.rand(L, S, generator=g) * 0.3 + 0.02)
    return tc, pre


# ------------------------------------------------------------------ reconstruction
def test_mse_by_hand():
    """`mean_tokens sum_l ||y[l] - y_hat[l]||^2 / d_model`: token 0 errs by 1, 2, 0, 1 (squares sum
    to 6), token 1 by 3, 0, 1, 1 (11); mean 8.5, over d_model = 2: 4.25."""
    target = torch.tensor([[[1.0, 2.0], [0.0, 1.0]], [[3.0, 0.0], [1.0, -1.0]]])
    assert mse_loss(torch.zeros_like(target), target).item() == pytest.approx(4.25)
    out = target.clone()
    out[1, 1, 0] += 0.5  # one entry off by 0.5: 0.25 / 2 tokens / 2 dims
    assert mse_loss(out, target).item() == pytest.approx(0.0625)


def test_training_scales_make_the_zero_prediction_cost_n_layers(tmp_path):
    """train.py divides layer l's inputs and targets by `s[l] = sqrt(E ||x[l]||^2 / d_model)` on the
    first block, so that `E ||x[l] / s[l]||^2 = d_model` and the all-zero prediction's MSE is exactly
    `n_layers` there (losses.py step 1): checked on the scales the run checkpoints."""
    from transcoders.activation_store import ActivationStore
    from transcoders.checkpoint import read_checkpoint
    from transcoders.train import transcoder_config

    model, seqs = tiny_model(), random_sequences()
    cfg = small_cfg(tmp_path, n_tokens=256 * 4)
    train(cfg, model=model, sequences=seqs, progress=False, stop_after=1)
    _, state = read_checkpoint(tmp_path / "run" / "checkpoint")
    tcfg = transcoder_config(cfg, model)
    x, y = ActivationStore(model, tcfg, seqs, cfg.batch_size, cfg.block_tokens, cfg.seed).block(0)
    for raw, scale in ((x, state["scale.in"]), (y, state["scale.out"])):
        assert scale.shape == (tcfg.n_layers,)
        normalized = raw / scale[:, None]
        torch.testing.assert_close(
            normalized.pow(2).sum(-1).mean(0),
            torch.full((tcfg.n_layers,), float(tcfg.d_model)),
            rtol=1e-5,
            atol=0,
        )
        zero = mse_loss(torch.zeros_like(normalized), normalized).item()
        assert zero == pytest.approx(tcfg.n_layers, rel=1e-5)
        assert not torch.allclose(scale, torch.ones_like(scale))  # the scales do something here


# ------------------------------------------------------------------ JumpReLU's penalties
@pytest.mark.parametrize("c", [1.0, 4.0])
def test_tanh_penalty_equals_sae_lens(c):
    """`mean_tokens sum_{l,f} tanh(c * a * ||W_dec[l,f]||)`: sae_lens's "tanh" mode per layer, summed;
    the value, and the gradients into the activations and the decoder (through its norms)."""
    tc, pre = _jumprelu_inputs(0)
    acts = tc.nonlinearity(pre, tc.threshold.detach()).requires_grad_(True)
    loss = tc.nonlinearity.sparsity(acts, pre, tc.threshold, tc.decoder_norms(), Penalty("tanh", c))
    loss.backward()
    want = 0.0
    for l in range(L):
        cfg = JumpReLUTrainingSAEConfig(
            d_in=D, d_sae=S, jumprelu_sparsity_loss_mode="tanh", jumprelu_tanh_scale=c
        )
        sae = _load_layer(JumpReLUTrainingSAE(cfg), tc.W_dec[l], tc.threshold[l])
        a = acts.detach()[:, l].clone().requires_grad_(True)
        theirs = sae.calculate_aux_loss(_step_input(D, None), a, pre[:, l], None)["l0_loss"]
        theirs.backward()
        want += theirs.item()
        torch.testing.assert_close(acts.grad[:, l], a.grad, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(tc.W_dec.grad[l], sae.W_dec.grad, rtol=1e-5, atol=1e-7)
    assert loss.item() == pytest.approx(want, rel=1e-6)
    assert (acts > 0).any() and (acts == 0).any()


def test_clt_decoder_norm_spans_all_its_decoders():
    """A CLT feature's norm is that of its decoders into every later layer, concatenated (clt.py step
    4): (3, 0) and (0, 4) give 5; the last layer's one decoder (0, 2) gives 2. With a = 0.2 and 0.5,
    the tanh penalty is tanh(0.2 * 5) + tanh(0.5 * 2) = 2 tanh(1)."""
    cfg = TranscoderConfig(kind="clt", n_layers=2, d_model=2, d_sae=1, activation="jumprelu")
    tc = build_transcoders(cfg)
    with torch.no_grad():
        tc.W_dec[0].copy_(torch.tensor([[[3.0, 0.0], [0.0, 4.0]]]))
        tc.W_dec[1].copy_(torch.tensor([[[0.0, 2.0]]]))
    assert tc.decoder_norms().tolist() == [[5.0], [2.0]]
    acts = torch.tensor([[[0.2], [0.5]]])
    loss = tc.nonlinearity.sparsity(acts, acts, tc.threshold, tc.decoder_norms(), Penalty("tanh", 1.0))
    assert loss.item() == pytest.approx(2 * math.tanh(1.0), rel=1e-6)


@pytest.mark.parametrize("ste_to_input", [False, True])
@pytest.mark.parametrize("bandwidth", [1.0, 0.2])
def test_l0_penalty_equals_sae_lens(ste_to_input, bandwidth):
    """`mean_tokens sum_{l,f} H(h - theta)` through `Step` on the pre-activations (Rajamanoharan et al.,
    eq. 12): sae_lens's "step" mode per layer, summed. Its forward equals that of `H(a - theta)` on the
    activations; the gradients into theta and h do not, and are compared here, with the activations
    computed from h as in training (so that a penalty reading them would send gradients through them)."""
    tc, pre = _jumprelu_inputs(1)
    nl = JumpReLU(dataclasses.replace(tc.cfg, bandwidth=bandwidth, ste_to_input=ste_to_input))
    h = pre.clone().requires_grad_(True)
    theta = tc.threshold.detach().clone().requires_grad_(True)
    acts = nl(h, theta)
    loss = nl.sparsity(acts, h, theta, tc.decoder_norms().detach(), Penalty("l0"))
    loss.backward()
    grad_h = torch.zeros_like(pre) if h.grad is None else h.grad
    want = 0.0
    for l in range(L):
        cfg = JumpReLUTrainingSAEConfig(
            d_in=D,
            d_sae=S,
            jumprelu_sparsity_loss_mode="step",
            jumprelu_bandwidth=bandwidth,
            jumprelu_ste_to_input=ste_to_input,
        )
        sae = _load_layer(JumpReLUTrainingSAE(cfg), tc.W_dec[l], theta[l])
        hl = pre[:, l].clone().requires_grad_(True)
        theirs = sae.calculate_aux_loss(_step_input(D, None), acts.detach()[:, l], hl, None)["l0_loss"]
        theirs.backward()
        want += theirs.item()
        torch.testing.assert_close(theta.grad[l], sae.threshold.grad, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(grad_h[:, l], torch.zeros_like(hl) if hl.grad is None else hl.grad)
    assert loss.item() == pytest.approx(want, rel=1e-6)
    assert ((pre - theta.detach()).abs() > bandwidth / 2).any()  # entries outside the window exist


# ------------------------------------------------------------------ ReLU's penalty
def test_l1_penalty_equals_sae_lens():
    """`mean_tokens sum_{l,f} a * ||W_dec[l,f]||` (linear-computation-graphs eq. 1): sae_lens's standard
    SAE with `lp_norm=1` per layer, summed; the value and the gradients into a and the decoder."""
    tc = random_set("plt", "relu", n_layers=L, d_model=D, d_sae=S, seed=2)
    g = torch.Generator().manual_seed(12)
    acts = torch.randn(N, L, S, generator=g).relu().requires_grad_(True)
    loss = tc.nonlinearity.sparsity(acts, acts, None, tc.decoder_norms(), Penalty())
    loss.backward()
    want = 0.0
    for l in range(L):
        sae = _load_layer(
            StandardTrainingSAE(StandardTrainingSAEConfig(d_in=D, d_sae=S, lp_norm=1.0)), tc.W_dec[l]
        )
        a = acts.detach()[:, l].clone().requires_grad_(True)
        theirs = sae.calculate_aux_loss(_step_input(D, None), a, a, None)["l1_loss"]
        theirs.backward()
        want += theirs.item()
        torch.testing.assert_close(acts.grad[:, l], a.grad)
        torch.testing.assert_close(tc.W_dec.grad[l], sae.W_dec.grad, rtol=1e-5, atol=1e-7)
    assert loss.item() == pytest.approx(want, rel=1e-6)


# ------------------------------------------------------------------ pre-activation loss
def test_appendix_preact_loss_by_hand():
    """The appendix's `sum_f ReLU(-h_f)`, averaged over tokens: token 0 has h = (-1, 2, -0.5), so
    1 + 0.5; token 1 (0.3, -2, 0), so 2; mean 1.75. Its gradient lifts negative pre-activations only."""
    h = torch.tensor([[[-1.0, 2.0, -0.5]], [[0.3, -2.0, 0.0]]], requires_grad=True)
    loss = preact_loss(h, "appendix")
    assert loss.item() == pytest.approx(1.75)
    loss.backward()
    assert h.grad.tolist() == [[[-0.5, 0.0, -0.5]], [[0.0, -0.5, 0.0]]]


def test_appendix_preact_loss_is_sae_lens_with_every_feature_dead_at_theta_zero():
    """sae_lens's `calculate_pre_act_loss` is `ReLU(theta - h) * ||W_dec|| * dead`: with theta = 0,
    unit norms and every feature dead it is the appendix's `sum_f ReLU(-h_f)`."""
    _, pre = _jumprelu_inputs(3)
    want = sum(
        calculate_pre_act_loss(1.0, torch.zeros(S), pre[:, l], torch.ones(S, dtype=torch.bool), torch.ones(S))
        for l in range(L)
    )
    assert preact_loss(pre, "appendix").item() == pytest.approx(want.item(), rel=1e-6)


def test_sae_lens_preact_loss_equals_sae_lens():
    """The "sae_lens" form: `ReLU(theta - h) * ||W_dec|| * dead`, per layer as sae_lens computes it,
    summed; 0 with no dead feature."""
    tc, pre = _jumprelu_inputs(4)
    dead = torch.rand(L, S, generator=torch.Generator().manual_seed(14)) < 0.5
    norms = tc.decoder_norms().detach()
    got = preact_loss(pre, "sae_lens", tc.threshold.detach(), norms, dead)
    want = sum(
        calculate_pre_act_loss(1.0, tc.threshold[l].detach(), pre[:, l], dead[l], norms[l]) for l in range(L)
    )
    assert dead.any() and not dead.all()
    assert got.item() == pytest.approx(want.item(), rel=1e-6) and got.item() > 0
    none_dead = torch.zeros(L, S, dtype=torch.bool)
    assert preact_loss(pre, "sae_lens", tc.threshold.detach(), norms, none_dead).item() == 0.0


# ------------------------------------------------------------------ the ramp
@pytest.mark.parametrize(
    "total, step, fraction",
    [
        (5, 0, 0.0),
        (5, 1, 0.25),
        (5, 2, 0.5),
        (5, 4, 1.0),
        (5, 9, 1.0),
        (101, 50, 0.5),
        (101, 100, 1.0),
        (2, 1, 1.0),
    ],
)
def test_sparsity_ramp_by_hand(total, step, fraction):
    """The appendix ramps the penalty "linearly ... from 0 to its final value throughout the entire
    duration of training": steps 0 .. total - 1, so step s has `s / (total - 1)` of it, the last
    step all of it (and any step past the end no more)."""
    assert sparsity_schedule(step, total, 3e-3) == pytest.approx(3e-3 * fraction, rel=1e-12, abs=0)


# ------------------------------------------------------------------ TopK's AuxK
def _one_layer_topk(W_dec: torch.Tensor, k: int = 1):
    d_sae, d_model = W_dec.shape
    cfg = TranscoderConfig(kind="plt", n_layers=1, d_model=d_model, d_sae=d_sae, activation="topk", k=k)
    tc = build_transcoders(cfg)
    with torch.no_grad():
        tc.W_dec[0].copy_(W_dec)
        tc.b_dec.fill_(7.0)  # the aux reconstruction has no bias: b_dec must not enter it
    return tc


def test_auxk_by_hand():
    """Dead features 0, 2, 3 of 4 (feature 1, alive, has the largest pre-activation and is never
    picked); h = (5, 9, -1, 2); decoders (1, 0), (0, 1), (1, 1), (0, 1); residual r = (4, 4).
    k_aux = 2 takes features 0 and 3: aux_out = (5, 2), ||aux_out - r||^2 = 1 + 4 = 5, ||r||^2 = 32.
    With feature 2 the only dead one, its ReLU'd -1 is 0: aux_out = 0, the loss ||r||^2 / ||r||^2 = 1."""
    tc = _one_layer_topk(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [0.0, 1.0]]))
    h = torch.tensor([[[5.0, 9.0, -1.0, 2.0]]])
    r = torch.tensor([[[4.0, 4.0]]])
    dead = torch.tensor([[True, False, True, True]])
    assert topk_aux_loss(tc, h, r, dead, 2).item() == pytest.approx(5 / 32)
    assert topk_aux_loss(tc, h, r, torch.tensor([[False, False, True, False]]), 2).item() == pytest.approx(
        1.0
    )
    assert topk_aux_loss(tc, h, r, torch.zeros(1, 4, dtype=torch.bool), 2).item() == 0.0


def test_auxk_equals_sae_lens_up_to_its_normalization():
    """sae_lens's `calculate_topk_aux_loss` (k_aux = d_in // 2, scale 1 once at least k_aux features are
    dead, no bias, no ReLU: every dead pre-activation is made positive here) is
    `mean_tokens ||aux_out - r||^2`; ours divides the batch's squared error by the residual's,
    `||aux_out - r||^2 / ||r||^2` (Gao et al.'s normalized MSE): ours = theirs * n_tokens / ||r||^2.
    The gradients into h agree by the same factor."""
    k_aux = 4
    tc = random_set("plt", "topk", n_layers=1, d_model=2 * k_aux, d_sae=16, seed=5)
    g = torch.Generator().manual_seed(15)
    dead = torch.rand(1, 16, generator=g) < 0.6
    pre = torch.randn(N, 1, 16, generator=g)
    pre = torch.where(dead, pre.abs() + 0.01, pre + 3.0)  # the live ones are larger: the mask must work
    residual = torch.randn(N, 1, 2 * k_aux, generator=g)
    assert int(dead.sum()) > k_aux
    h = pre.clone().requires_grad_(True)
    ours = topk_aux_loss(tc, h, residual, dead, k_aux)
    ours.backward()
    cfg = TopKTrainingSAEConfig(d_in=2 * k_aux, d_sae=16, k=2, rescale_acts_by_decoder_norm=False)
    sae = _load_layer(TopKTrainingSAE(cfg), tc.W_dec[0])
    h2 = pre[:, 0].clone().requires_grad_(True)
    theirs = sae.calculate_topk_aux_loss(residual[:, 0], torch.zeros(N, 2 * k_aux), h2, dead[0])
    theirs.backward()
    factor = N / residual.pow(2).sum().item()
    assert ours.item() == pytest.approx(theirs.item() * factor, rel=1e-5)
    torch.testing.assert_close(h.grad[:, 0], h2.grad * factor, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("kind", ["clt", "plt"])
def test_training_selects_2k_dead_features_for_auxk(tmp_path, monkeypatch, kind):
    """AuxK's width is `k_aux = 2k` (TrainConfig.auxk_coef: "the top 2k dead features"), on the dense
    step (a CLT: `losses.topk_aux_loss`) and the sparse one (a TopK PLT: `sparse_topk.dead_topk`): the
    width each receives, read while features are dead after 2 steps."""
    import transcoders.losses as losses_module
    import transcoders.sparse_topk as sparse_module
    import transcoders.trainer as trainer_module

    widths: list[int] = []
    if kind == "clt":
        real = losses_module.topk_aux_loss

        def spy(tc, pre_acts, residual, dead, k_aux, *rest):
            widths.append(k_aux)
            return real(tc, pre_acts, residual, dead, k_aux, *rest)

        monkeypatch.setattr(losses_module, "topk_aux_loss", spy)
    else:
        real = sparse_module.dead_topk

        def spy(h, dead, k_aux):
            widths.append(k_aux)
            return real(h, dead, k_aux)

        monkeypatch.setattr(sparse_module, "dead_topk", spy)
    monkeypatch.setattr(trainer_module, "DEAD_TOKENS", 512)  # dead after 2 steps of 256 tokens
    k = 3
    cfg = small_cfg(tmp_path, kind=kind, activation="topk", k=k, n_tokens=256 * 4)
    train(cfg, model=tiny_model(), sequences=random_sequences(), progress=False)
    assert widths and set(widths) == {2 * k}, widths


# ------------------------------------------------------------------ JumpReLU's threshold in checkpoints
THETA = torch.tensor([[math.exp(-1.0), math.exp(0.5), 1.0]])  # log theta: -1, 0.5, 0


def _jumprelu_set():
    cfg = TranscoderConfig(kind="plt", n_layers=1, d_model=2, d_sae=3, activation="jumprelu")
    return build_transcoders(cfg)


def test_adapt_state_stores_a_plain_threshold_as_its_log_while_training():
    """A state holding theta itself (a saved set, or a checkpoint of a set not in training) given to a
    set that trains log(theta) (nonlinearity.py step 5) is stored as log(theta) = (-1, 0.5, 0), and the
    set's threshold is theta again; the other way round, log(theta) becomes theta."""
    training = _jumprelu_set()
    training.nonlinearity.begin_training(training)
    state = {**training.state_dict()}
    del state[LOG_THRESHOLD]
    state["threshold"] = THETA.clone()
    adapted = training.nonlinearity.adapt_state(training, state)
    torch.testing.assert_close(adapted[LOG_THRESHOLD], torch.tensor([[-1.0, 0.5, 0.0]]))
    training.load_state_dict(adapted)
    torch.testing.assert_close(training.threshold.detach(), THETA)

    plain = _jumprelu_set()
    back = plain.nonlinearity.adapt_state(plain, {k: v for k, v in training.state_dict().items()})
    plain.load_state_dict(back)
    torch.testing.assert_close(plain.threshold.detach(), THETA)


def test_a_checkpoint_with_a_plain_threshold_resumes_with_that_threshold(tmp_path):
    """The path training takes (checkpoint.py `load_checkpoint`): a checkpoint written by a set holding
    theta itself, read into a set that trains log(theta), gives it that theta."""
    from transcoders.checkpoint import load_checkpoint, save_checkpoint
    from transcoders.train import TrainConfig

    plain = _jumprelu_set()
    with torch.no_grad():
        plain.threshold.copy_(THETA)
    scales = {"in": torch.ones(1), "out": torch.ones(1)}
    opt = torch.optim.Adam(plain.parameters())
    save_checkpoint(tmp_path / "ckpt", plain, opt, 3, scales, torch.zeros(1, 3), TrainConfig())
    training = _jumprelu_set()
    training.nonlinearity.begin_training(training)
    step, _, _ = load_checkpoint(tmp_path / "ckpt", training, torch.optim.Adam(training.parameters()))
    assert step == 3
    torch.testing.assert_close(training.threshold.detach(), THETA)

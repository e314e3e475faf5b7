"""Several sets spliced in at once (`spliced_metrics`): exact sets recover all the loss, zero sets none,
and two sets at once equal a reference written here with plain PyTorch hooks on the modules."""

import pytest
import torch

from tests.transcoders.tc_helpers import random_set, tiny_model
from transcoders import ConfigError, TranscoderConfig, build_transcoders
from transcoders.metrics import reconstruction_metrics, replacement_metrics, splice_hooks, spliced_metrics

ATTN = "blocks.{layer}.hook_attn_out"


def sequences(n=8, n_ctx=32, seed=0):
    return torch.randint(0, 50, (n, n_ctx), generator=torch.Generator().manual_seed(seed))


def exact_attn_sae(d_model=32, n_layers=2):
    """An SAE on the attention output that reconstructs it exactly: `relu(x) - relu(-x) = x`."""
    cfg = TranscoderConfig(
        kind="sae", n_layers=n_layers, d_model=d_model, d_sae=2 * d_model, activation="relu",
        input_hook=ATTN, output_hook=ATTN,
    )  # fmt: skip
    sae = build_transcoders(cfg)
    eye = torch.eye(d_model)
    with torch.no_grad():
        sae.W_enc.copy_(torch.cat([eye, -eye], 1).expand(n_layers, -1, -1))
        sae.W_dec.copy_(torch.cat([eye, -eye], 0).expand(n_layers, -1, -1))
    return sae


def exact_plt(model):
    """A PLT equal to the model's ReLU MLPs: one feature per neuron."""
    cfg = TranscoderConfig(kind="plt", n_layers=2, d_model=32, d_sae=64, activation="relu")
    tc = build_transcoders(cfg)
    with torch.no_grad():
        for l in range(2):
            tc.W_enc[l] = model.blocks[l].mlp.W_in
            tc.b_enc[l] = model.blocks[l].mlp.b_in
            tc.W_dec[l] = model.blocks[l].mlp.W_out
            tc.b_dec[l] = model.blocks[l].mlp.b_out
    return tc


def test_exact_sets_recover_all_the_loss():
    model = tiny_model(act_fn="relu")
    seqs = sequences()
    for sets in ([exact_attn_sae()], [exact_attn_sae(), exact_plt(model)]):
        m = spliced_metrics(model, sets, seqs)
        assert m["ce_replaced"] == pytest.approx(m["ce_orig"], abs=1e-5) and m["kl_to_orig"] < 1e-6
        assert m["ce_loss_recovered"] == pytest.approx(1.0, abs=1e-4)
        assert abs(m["ce_zero_ablated"] - m["ce_orig"]) > 0.01  # a random model: either sign


def test_zero_sets_recover_none():
    """A set whose output is 0 everywhere is the zero ablation: CE loss recovered 0 exactly."""
    model = tiny_model()
    seqs = sequences()
    sae = random_set("sae")
    plt = random_set("plt")
    with torch.no_grad():
        for tc in (sae, plt):
            tc.W_dec.zero_()
            tc.b_dec.zero_()
    for sets in ([sae], [sae, plt]):
        m = spliced_metrics(model, sets, seqs)
        assert m["ce_replaced"] == pytest.approx(m["ce_zero_ablated"], rel=1e-6)
        assert m["ce_loss_recovered"] == pytest.approx(0.0, abs=1e-5)


@torch.no_grad()
def reference(model, sae, plt, tokens):
    """CE as is, with both sets spliced in, and with both outputs zeroed, from forward hooks on
    `blocks[l].attn` and `blocks[l].mlp` (what each returns is what its hook_*_out holds in this
    model); JumpReLU `h * (h > threshold)`; position 0 keeps the module's own output."""

    def encode(tc, x, l):
        pre = x @ tc.W_enc[l] + tc.b_enc[l]
        return pre * (pre > tc.threshold[l])

    def run(mode):
        handles = []

        def make(tc, reads_input):
            def hook(module, inputs, out, l):
                if mode == "model":
                    return None
                if mode == "zero":
                    new = torch.zeros_like(out)
                else:
                    x = inputs[0] if reads_input else out
                    new = encode(tc, x, l) @ tc.W_dec[l] + tc.b_dec[l]
                new[:, 0] = out[:, 0]
                return new

            return hook

        for l in range(model.cfg.n_layers):
            sae_hook, plt_hook = make(sae, False), make(plt, True)
            handles.append(
                model.blocks[l].attn.register_forward_hook(lambda m, i, o, l=l, h=sae_hook: h(m, i, o, l))
            )
            handles.append(
                model.blocks[l].mlp.register_forward_hook(lambda m, i, o, l=l, h=plt_hook: h(m, i, o, l))
            )
        try:
            return model(tokens).log_softmax(-1)[:, :-1].double()
        finally:
            for h in handles:
                h.remove()

    lp = {mode: run(mode) for mode in ("model", "tc", "zero")}
    target = tokens[:, 1:, None]
    ce = {k: -v.gather(-1, target).mean().item() for k, v in lp.items()}
    return {
        "ce_orig": ce["model"],
        "ce_replaced": ce["tc"],
        "ce_zero_ablated": ce["zero"],
        "ce_loss_recovered": (ce["zero"] - ce["tc"]) / (ce["zero"] - ce["model"]),
        "kl_to_orig": (lp["model"].exp() * (lp["model"] - lp["tc"])).sum(-1).mean().item(),
    }


def test_two_sets_equal_the_module_hook_reference():
    """An attention SAE and a PLT at once (the PLT reading the MLP input of the model whose attention
    outputs are already replaced) equal the reference; and differ from either set alone."""
    model = tiny_model()
    seqs = sequences()
    sae, plt = random_set("sae", seed=1), random_set("plt", seed=2)
    got = spliced_metrics(model, [sae, plt], seqs, batch_size=3)
    ref = reference(model, sae, plt, seqs)
    for key, want in ref.items():
        assert got[key] == pytest.approx(want, rel=1e-5, abs=1e-7), key
    assert got["n_tokens"] == 8 * 31
    alone = [replacement_metrics(model, tc, seqs)["ce_replaced"] for tc in (sae, plt)]
    assert min(abs(a - got["ce_replaced"]) for a in alone) > 1e-3
    # the order of the list does not matter: each hook fires where the forward pass reaches it
    assert spliced_metrics(model, [plt, sae], seqs)["ce_replaced"] == pytest.approx(
        got["ce_replaced"], rel=1e-6
    )


def test_two_sets_on_one_hook_are_refused():
    model = tiny_model()
    with pytest.raises(ConfigError, match="both write 'blocks.0.hook_mlp_out'"):
        splice_hooks(model, [random_set("plt"), random_set("clt")])
    with pytest.raises(ValueError, match="at least one"):
        spliced_metrics(model, [], sequences())


def test_reconstruction_metrics_by_hand():
    """FVU `sum ||y - y_hat||^2 / sum ||y - mean(y)||^2` (metrics.py step 1) on a set whose features never
    fire, so `y_hat = b_dec`: y = (1, 0), (3, 0), (2, 3) has mean (2, 1) and variance sum 2 + 2 + 4 = 8;
    `b_dec = 0` errs by 1 + 9 + 4 + 9 = 23, FVU 23 / 8; `b_dec` = the mean explains nothing, FVU 1.
    L0 is 0 and every feature is dead; a batch size below the token count changes nothing."""
    cfg = TranscoderConfig(kind="plt", n_layers=1, d_model=2, d_sae=3, activation="relu")
    tc = build_transcoders(cfg)  # zero encoder: every pre-activation is 0, every activation too
    x = torch.randn(3, 1, 2, generator=torch.Generator().manual_seed(0))
    y = torch.tensor([[[1.0, 0.0]], [[3.0, 0.0]], [[2.0, 3.0]]])
    m = reconstruction_metrics(tc, x, y, batch_size=2)
    assert m["fvu"] == [pytest.approx(23 / 8)] and m["fvu_mean"] == pytest.approx(23 / 8)
    assert m["l0"] == [0.0] and m["dead_fraction"] == [1.0] and m["n_tokens"] == 3
    with torch.no_grad():
        tc.b_dec.copy_(torch.tensor([[2.0, 1.0]]))
    assert reconstruction_metrics(tc, x, y)["fvu"] == [pytest.approx(1.0)]

"""The shipped sets: load offline, fit the bundled model, and reproduce the README's figures.

The figures ("Bundled transcoders" in README.md) are recomputed here from the weights files on the
same held-out text the manifests were measured on (`transcoders.train.held_out_tokens`: 64
sequences of 128 tokens from corpus seed 987654, position 0 left out: 8,128 tokens), by a
reference written in this file from the module docstring of transcoders/metrics.py:
PyTorch hooks on each `blocks[l].mlp` read what it receives and replace what it returns (on each
`blocks[l].attn`, for the attention SAE, read and replace what it returns), the JumpReLU is
`h * (h > threshold)`, and a CLT's layer l sums the decoders of every source layer <= l. The
attention SAE's figures are quoted alone and spliced in together with `default-plt`.
Nothing is read back from manifest.json.

The whole held-out set is needed to check the figures at the precision they are quoted: on four
disjoint quarters of it (2,032 tokens each) the per-quarter standard deviation is 0.006 (PLT) and
0.003 (CLT) in CE loss recovered, 0.06 / 0.02 in KL, 0.002 in mean FVU and 1-4 in per-layer L0,
and the dead counts go from 12 (PLT) to 100-300, since a feature silent on a quarter is often
active elsewhere. On all of it the reference agrees with the manifests to 1e-7 in CE, KL and FVU and
to 3e-4 in L0 (a token or two at the threshold), and takes 2-5 s a set.
"""

import pytest
import torch
from safetensors.torch import load_file

from transcoders import check_fits, load_transcoders
from transcoders.metrics import reconstruction_metrics, replacement_metrics, spliced_metrics
from transcoders.paths import BUNDLED
from transcoders.sites import collect
from transcoders.train import held_out_tokens

pytestmark = pytest.mark.bundled("default", "default-plt", "default-clt", "default-attn-sae")
NAMES = ["default-plt", "default-clt", "default-attn-sae"]
# kind, d_sae and write site ("mlp" / "attn") of each set
SHAPE = {
    "default-plt": ("plt", 1024, "mlp"),
    "default-clt": ("clt", 1024, "mlp"),
    "default-attn-sae": ("sae", 512, "attn"),
}
ATTN = "blocks.{layer}.hook_attn_out"

# README "Bundled transcoders", as quoted: (value, half a unit of its last digit)
QUOTED = {
    "default-plt": {
        "ce_loss_recovered": (0.998, 5e-4),
        "kl_to_orig": (0.02, 5e-3),
        "fvu_mean": (0.008, 5e-4),
        "l0": ([25, 36, 32, 8], 0.5),
        "dead_fraction_total": (0.103, 5e-4),  # "10.3%"
    },
    "default-clt": {
        "ce_loss_recovered": (0.998, 5e-4),
        "kl_to_orig": (0.02, 5e-3),
        "fvu_mean": (0.008, 5e-4),
        "l0": ([25, 26, 24, 3], 0.5),
        "dead_fraction_total": (0.108, 5e-4),  # "10.8%"
    },
    "default-attn-sae": {  # alone: every attention output replaced; and together with default-plt
        "ce_loss_recovered": (0.999, 5e-4),
        "kl_to_orig": (0.00, 5e-3),
        "fvu_mean": (0.012, 5e-4),
        "l0": ([22, 20, 22, 24], 0.5),
        "dead_fraction_total": (0.137, 5e-4),  # "13.7%"
        "spliced_ce_loss_recovered": (0.995, 5e-4),
        "spliced_kl_to_orig": (0.03, 5e-3),
    },
}


@pytest.fixture(scope="module")
def model():
    from attrgraph.bundled.loading import load_model

    return load_model("default")


@pytest.fixture(scope="module")
def held_out(model):
    tokens = held_out_tokens(model, "bundled", 64)
    assert tokens.shape == (64, 128)
    return tokens


@torch.no_grad()
def reference_metrics(model, weights: dict, tokens, site: str = "mlp", also: tuple = ()) -> dict:
    """CE loss recovered, KL, FVU, L0 and dead fraction of a JumpReLU PLT or CLT (`site` "mlp") or an
    SAE on the attention output (`site` "attn"), from its weights; the CE figures with the sets of
    `also` (pairs of site and weights) spliced in at the same time (the attention SAE with a PLT)."""
    L = model.cfg.n_layers

    def coder(weights):
        """(encode, decode) of a set's weights; `W_dec[s][:, j]` writes layer s + j."""
        clt = "W_dec.0" in weights
        W_dec = [weights[f"W_dec.{s}"] if clt else weights["W_dec"][s][:, None] for s in range(L)]

        def encode(x, l):
            pre = x @ weights["W_enc"][l] + weights["b_enc"][l]
            return pre * (pre > weights["threshold"][l])

        def decode(acts: dict, l):
            out = weights["b_dec"][l]
            for s, a in acts.items():
                if s == l or (clt and s < l):
                    out = out + a @ W_dec[s][:, l - s]
            return out

        return encode, decode

    def run(mode, sets):
        """Log-probs and, per layer, (read, write) of the first set's site with every site of `sets`
        left as is, replaced by the sets (each layer encoding the replaced model's values: an MLP
        set its MLP's input, an attention SAE its attention's output), or zeroed; position 0 keeps
        the module's own output in every mode."""
        seen, handles = {}, []
        for i, (where, w) in enumerate(sets):
            encode, decode = coder(w)
            acts = {}
            for l in range(L):

                def hook(module, inputs, out, l=l, i=i, where=where, encode=encode, decode=decode, acts=acts):
                    x = inputs[0] if where == "mlp" else out
                    if i == 0:
                        seen[l] = (x, out)
                    if mode == "model":
                        return None
                    if mode == "zero":
                        new = torch.zeros_like(out)
                    else:
                        acts[l] = encode(x, l)
                        new = decode(acts, l).clone()
                    new[:, 0] = out[:, 0]
                    return new

                handles.append(getattr(model.blocks[l], where).register_forward_hook(hook))
        try:
            logp = model(tokens).log_softmax(-1)[:, :-1].double()
        finally:
            for h in handles:
                h.remove()
        return logp, seen

    def ce_figures(sets) -> dict:
        (logp, seen), (logp_tc, _), (logp_zero, _) = [run(mode, sets) for mode in ("model", "tc", "zero")]
        target = tokens[:, 1:, None]
        ce = {
            k: -lp.gather(-1, target).mean().item()
            for k, lp in [("model", logp), ("tc", logp_tc), ("zero", logp_zero)]
        }
        kl = (logp.exp() * (logp - logp_tc)).sum(-1).mean().item()
        return seen, {
            "ce_orig": ce["model"],
            "ce_replaced": ce["tc"],
            "ce_zero_ablated": ce["zero"],
            "ce_loss_recovered": (ce["zero"] - ce["tc"]) / (ce["zero"] - ce["model"]),
            "kl_to_orig": kl,
            "n_tokens": int(target.numel()),
        }

    seen, result = ce_figures([(site, weights)])
    if also:
        result["spliced_with"] = ce_figures([(site, weights), *also])[1]

    # reconstruction on the unmodified model's activations, position 0 left out
    encode, decode = coder(weights)
    x = [seen[l][0][:, 1:].flatten(0, 1) for l in range(L)]
    y = [seen[l][1][:, 1:].flatten(0, 1).double() for l in range(L)]
    a = [encode(x[l], l) for l in range(L)]
    fvu, l0, dead = [], [], []
    for l in range(L):
        y_hat = decode({s: a[s] for s in range(l + 1)}, l).double()
        fvu.append(float((y_hat - y[l]).pow(2).sum() / (y[l] - y[l].mean(0)).pow(2).sum()))
        l0.append(float((a[l] > 0).double().sum(-1).mean()))
        dead.append(int((a[l] > 0).any(0).logical_not().sum()))
    d_sae = weights["W_enc"].shape[-1]
    return result | {
        "fvu": fvu,
        "fvu_mean": sum(fvu) / L,
        "l0": l0,
        "dead_fraction": [n / d_sae for n in dead],
        "dead_fraction_total": sum(dead) / (L * d_sae),
    }


def bundled_metrics(model, name, tokens, weights=None):
    """`reference_metrics` of a bundled set (the attention SAE together with default-plt too)."""
    weights = weights if weights is not None else load_file(BUNDLED[name] / "weights.safetensors")
    site = SHAPE[name][2]
    also = (("mlp", load_file(BUNDLED["default-plt"] / "weights.safetensors")),) if site == "attn" else ()
    return reference_metrics(model, weights, tokens, site, also)


@pytest.mark.parametrize("name", NAMES)
def test_bundled_set_loads_and_fits(model, name):
    tc = load_transcoders(name)  # checks every sha256 of the manifest
    check_fits(model, tc)
    kind, d_sae, site = SHAPE[name]
    assert tc.cfg.kind == kind and tc.cfg.activation == "jumprelu" and tc.cfg.d_sae == d_sae
    if site == "attn":
        assert tc.cfg.input_hook == tc.cfg.output_hook == ATTN
    # the loader hands back exactly the tensors of the weights file
    weights = load_file(BUNDLED[name] / "weights.safetensors")
    torch.testing.assert_close(tc.W_enc.detach(), weights["W_enc"], rtol=0, atol=0)
    torch.testing.assert_close(tc.threshold.detach(), weights["threshold"], rtol=0, atol=0)
    for s in range(tc.n_layers):
        want = weights[f"W_dec.{s}"] if tc.cfg.kind == "clt" else weights["W_dec"][s]
        torch.testing.assert_close(tc.W_dec[s].detach(), want, rtol=0, atol=0)


@pytest.mark.parametrize("name", NAMES)
def test_bundled_set_has_the_quoted_quality(model, held_out, name):
    """CE loss recovered, KL, mean FVU, L0 per layer and dead fraction as the README quotes them,
    recomputed from the weights on the 8,128 held-out tokens; the attention SAE spliced in with
    default-plt recovers at least 0.85 of the loss (issue 12's bar)."""
    m = bundled_metrics(model, name, held_out)
    assert m["n_tokens"] == 8128
    assert m["ce_orig"] < m["ce_replaced"] < m["ce_zero_ablated"]
    if "spliced_with" in m:
        assert m["spliced_with"]["ce_loss_recovered"] >= 0.85
        m |= {f"spliced_{k}": v for k, v in m["spliced_with"].items()}
    for key, (want, tol) in QUOTED[name].items():
        got = m[key]
        if isinstance(want, list):
            assert all(abs(g - w) <= tol for g, w in zip(got, want, strict=True)), (name, key, got, want)
        else:
            assert abs(got - want) <= tol, (name, key, got, want)


@pytest.mark.parametrize("override", [False, True])
@pytest.mark.parametrize("name", NAMES)
def test_metrics_module_agrees_with_the_reference(model, held_out, name, override):
    """transcoders/metrics.py, which wrote the manifests, equals the reference above (first 8
    sequences), once with the shipped thresholds and once with the same per-feature thresholds 0, 0.05,
    0.1, 0, ... on both sides."""
    tokens = held_out[:8]
    weights = load_file(BUNDLED[name] / "weights.safetensors")
    tc = load_transcoders(name)
    if override:
        thresholds = 0.05 * (torch.arange(tc.d_sae) % 3).float().expand(tc.n_layers, -1)
        weights["threshold"] = thresholds.clone()
        with torch.no_grad():
            tc.threshold.copy_(thresholds)
    ref = bundled_metrics(model, name, tokens, weights)
    x, y = collect(model, tokens, tc.cfg)
    got = reconstruction_metrics(tc, x[:, 1:].flatten(0, 1), y[:, 1:].flatten(0, 1))
    got.update(replacement_metrics(model, tc, tokens))
    ce_keys = ("ce_orig", "ce_replaced", "ce_zero_ablated", "ce_loss_recovered", "kl_to_orig")
    for key in ce_keys:
        assert got[key] == pytest.approx(ref[key], rel=1e-5, abs=1e-7), key
    for key in ("fvu", "l0", "dead_fraction", "dead_fraction_total"):
        assert got[key] == pytest.approx(ref[key], rel=1e-5, abs=1e-7), key
    assert got["n_tokens"] == ref["n_tokens"] == 8 * 127
    if "spliced_with" in ref:
        joint = spliced_metrics(model, [tc, load_transcoders("default-plt")], tokens)
        for key in ce_keys:
            assert joint[key] == pytest.approx(ref["spliced_with"][key], rel=1e-5, abs=1e-7), key


# issue 20's goals for the retrained sets (README "Bundled transcoders"): held-out mean FVU, the share of
# learned thresholds above 0, and the spliced KL at most half of what the sets trained with the wrong
# threshold gradient gave (PLT 0.63, CLT 0.28, PLT with the attention set 0.79)
GOALS = {
    "default-plt": {"fvu_mean": 0.03, "l0_mean": 45, "kl_to_orig": 0.63 / 2},
    "default-clt": {"fvu_mean": 0.02, "kl_to_orig": 0.28 / 2},
    "default-attn-sae": {"spliced_kl_to_orig": 0.79 / 2},
}


@pytest.mark.parametrize("name", NAMES)
def test_bundled_set_reaches_the_retraining_goals(model, held_out, name):
    weights = load_file(BUNDLED[name] / "weights.safetensors")
    assert (weights["threshold"] > 0).float().mean() >= 0.99  # thresholds that learned
    m = bundled_metrics(model, name, held_out)
    m["l0_mean"] = sum(m["l0"]) / len(m["l0"])
    if "spliced_with" in m:
        m["spliced_kl_to_orig"] = m["spliced_with"]["kl_to_orig"]
    for key, bound in GOALS[name].items():
        assert m[key] <= bound, (name, key, m[key], bound)

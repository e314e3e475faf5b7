"""SAE / PLT / CLT: shapes, hand-computed forward passes, the contract's vector accessors, folding."""

import pytest
import torch

from tests.transcoders.tc_helpers import random_set
from transcoders import CrossLayerTranscoder, TranscoderConfig, TranscoderOutput
from transcoders.errors import ConfigError


@pytest.mark.parametrize("kind", ["sae", "plt", "clt"])
@pytest.mark.parametrize("activation", ["relu", "jumprelu", "topk"])
def test_forward_matches_hand_computation(kind, activation):
    skip = kind != "sae"
    tc = random_set(kind, activation, skip=skip, n_layers=3)
    x = torch.randn(2, 5, 3, 32)
    res = tc(x)
    assert isinstance(res, TranscoderOutput)
    for l in range(3):
        pre = x[:, :, l] @ tc.W_enc[l] + tc.b_enc[l]
        torch.testing.assert_close(res.pre_acts[:, :, l], pre)
        if activation == "relu":
            act = pre.relu()
        elif activation == "jumprelu":
            act = pre * (pre > tc.threshold[l])
        else:
            kth = pre.topk(tc.cfg.k, dim=-1).values[..., -1:]
            act = (pre * (pre >= kth)).relu()
        torch.testing.assert_close(res.acts[:, :, l], act)
    for lo in range(3):  # output layer
        want = tc.b_dec[lo].expand(2, 5, 32).clone()
        for ls in range(3):  # source layer
            if kind == "clt" and ls <= lo:
                want += res.acts[:, :, ls] @ tc.W_dec[ls][:, lo - ls]
            elif kind != "clt" and ls == lo:
                want += res.acts[:, :, ls] @ tc.W_dec[ls]
        if skip:
            want += x[:, :, lo] @ tc.W_skip[lo]
        torch.testing.assert_close(res.out[:, :, lo], want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["plt", "clt"])
def test_contract_shapes_and_vectors(kind):
    L, D, S = 3, 32, 48
    tc = random_set(kind, n_layers=L, d_model=D, d_sae=S)
    assert tc.W_enc.shape == (L, D, S) and tc.b_enc.shape == (L, S) and tc.b_dec.shape == (L, D)
    assert tc.threshold.shape == (L, S)
    feats = torch.tensor([0, 7, 47])
    for l in range(L):
        enc = tc.encoder_vectors(l, feats)
        assert enc.shape == (3, D)
        torch.testing.assert_close(enc, tc.W_enc[l][:, feats].T)
        dec = tc.decoder_vectors(l, feats)
        # PLT: W_dec[l] is [d_sae, d_model] and writes layer l only; CLT: W_dec[l] is
        # [d_sae, n_layers - l, d_model], W_dec[l][:, j] writing layer l + j
        want = tc.W_dec[l][feats][:, None] if kind == "plt" else tc.W_dec[l][feats]
        assert dec.shape == (3, L - l if kind == "clt" else 1, D)
        torch.testing.assert_close(dec, want, rtol=0, atol=0)
    # decode() of one active feature (layer 1, feature 7, activation 2), less b_dec: a PLT writes
    # layer 1 only, a CLT layers 1 and 2; nothing reaches layer 0
    acts = torch.zeros(L, S)
    acts[1, 7] = 2.0
    out = tc.decode(acts) - tc.b_dec
    dec = tc.decoder_vectors(1, torch.tensor([7]))[0]
    written = [1] if kind == "plt" else [1, 2]
    assert dec.shape[0] == len(written)
    for j, l in enumerate(written):
        torch.testing.assert_close(out[l], 2.0 * dec[j])
    for l in set(range(L)) - set(written):
        assert out[l].abs().max() == 0, l


@pytest.mark.parametrize("kind", ["sae", "plt", "clt"])
def test_fold_scales_acts_on_raw_activations(kind):
    tc = random_set(kind, skip=kind != "sae", n_layers=3)
    x = torch.randn(10, 3, 32) * 5
    s_in, s_out = torch.tensor([2.0, 0.5, 3.0]), torch.tensor([4.0, 0.25, 1.5])
    normalized = tc(x / s_in[:, None])
    tc.fold_scales(s_in, s_out)
    raw = tc(x)
    torch.testing.assert_close(raw.acts, normalized.acts, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(raw.out, normalized.out * s_out[:, None], rtol=1e-4, atol=1e-4)


def test_init_follows_appendix():
    cfg = TranscoderConfig(kind="clt", n_layers=4, d_model=64, d_sae=256)
    tc = CrossLayerTranscoder(cfg).init_weights(torch.Generator().manual_seed(0))
    assert tc.W_enc.abs().max() <= (4 * 256) ** -0.5
    assert tc.W_enc.abs().max() > 0.9 * (4 * 256) ** -0.5
    assert all(W.abs().max() <= (4 * 64) ** -0.5 for W in tc.W_dec)
    assert torch.all(tc.threshold == 0.03)


def test_clt_decoder_norms_concatenate_output_layers():
    tc = random_set("clt", n_layers=3)
    norms = tc.decoder_norms()
    assert norms.shape == (3, 48)
    torch.testing.assert_close(norms[0, 5], tc.W_dec[0][5].flatten().norm())


@pytest.mark.parametrize(
    "kw",
    [
        dict(kind="xyz"),
        dict(activation="gelu"),
        dict(d_sae=0),
        dict(activation="topk", k=100),
        dict(input_hook="blocks.0.hook_resid_mid"),
        dict(kind="sae"),  # sae with different in/out hooks
        dict(bandwidth=0.0),
    ],
)
def test_config_rejects_bad_fields(kw):
    base = dict(kind="plt", n_layers=2, d_model=8, d_sae=16)
    base.update(kw)
    with pytest.raises(ConfigError):
        TranscoderConfig(**base)


def test_config_round_trips_through_dict():
    cfg = TranscoderConfig(kind="clt", n_layers=2, d_model=8, d_sae=16, skip=True, model_name="m")
    assert TranscoderConfig.from_dict({**cfg.to_dict(), "future_field": 1}) == cfg


@pytest.mark.parametrize("kind", ["plt", "clt", "sae"])
def test_encoder_vectors_are_what_the_features_read(kind):
    """`h_f = x . v_f + b_enc[l, f]` with `v_f` from `encoder_vectors`, against `encode` (all layers at
    once); all of a layer's features when none are named, in the order named otherwise."""
    tc = random_set(kind, n_layers=2, d_model=32, d_sae=48, seed=3)
    x = torch.randn(5, 2, 32, generator=torch.Generator().manual_seed(4))
    h = tc.encode(x)
    feats = torch.tensor([40, 2, 17])
    for l in range(2):
        v = tc.encoder_vectors(l)
        assert v.shape == (48, 32)
        torch.testing.assert_close(x[:, l] @ v.T + tc.b_enc[l], h[:, l])
        torch.testing.assert_close(tc.encoder_vectors(l, feats), v[feats], rtol=0, atol=0)
        torch.testing.assert_close(tc.encode_layer(x[:, l], l), h[:, l])

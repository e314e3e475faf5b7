"""The global panel's norm scales (`mean_norm_scales`, analysis/global_weights.py step 4) against a
harmonic mean computed by hand: each LayerNorm denominator `sqrt(var(x) + eps)` recomputed from the
residual stream it normalizes, then `statistics.harmonic_mean` over every position but the first.
(`test_interference` and `test_model_panels` take their expected values from the function itself.)"""

import statistics

import pytest
import torch

from attrgraph.analysis.global_weights import mean_norm_scales
from tests.attrgraph.ag_helpers import tiny_model

READS = {"ln1": "hook_resid_pre", "ln2": "hook_resid_mid"}
"""The residual stream each block's LayerNorm reads."""


def ln_scales(x: torch.Tensor, eps: float) -> list[float]:
    """LayerNorm's denominator per position, from its definition (biased variance)."""
    centred = x - x.mean(-1, keepdim=True)
    return torch.sqrt((centred**2).mean(-1) + eps).flatten().tolist()


def test_mean_norm_scales_is_the_harmonic_mean_of_the_layernorm_denominators():
    model = tiny_model("gpt2")
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, 40, (2, 7), generator=gen), torch.randint(0, 40, (3, 5), generator=gen)]
    want: dict[str, list[float]] = {}
    for tokens in batches:
        _, cache = model.run_with_cache(tokens)
        for layer in range(model.cfg.n_layers):
            for ln, read in READS.items():
                x = cache[f"blocks.{layer}.{read}"][:, 1:]  # skip_first=1: the BOS position is left out
                want.setdefault(f"blocks.{layer}.{ln}.hook_scale", []).extend(ln_scales(x, model.cfg.eps))
        last = cache[f"blocks.{model.cfg.n_layers - 1}.hook_resid_post"][:, 1:]
        want.setdefault("ln_final.hook_scale", []).extend(ln_scales(last, model.cfg.eps))

    got = mean_norm_scales(model, batches)

    assert set(got) == set(want)
    for name, scales in want.items():
        assert len(scales) == 2 * 6 + 3 * 4
        assert got[name] == pytest.approx(statistics.harmonic_mean(scales), rel=1e-9), name
        assert got[name] != pytest.approx(statistics.fmean(scales), rel=1e-6)  # not the plain mean


def test_mean_norm_scales_of_three_known_scales():
    """1 / mean(1 / s) of s = 1, 2, 4 is 3 / (1 + 1/2 + 1/4) = 12/7: a model whose residual stream
    at positions 1-3 has those LayerNorm denominators (its embedding written by hand, eps 0)."""
    model = tiny_model("gpt2", n_layers=1)
    model.cfg.eps = 0.0
    for ln in (model.blocks[0].ln1, model.blocks[0].ln2, model.ln_final):
        ln.eps = 0.0
    d = model.cfg.d_model
    unit = torch.tensor([1.0, -1.0] * (d // 2), dtype=model.cfg.dtype)  # mean 0, biased variance 1
    with torch.no_grad():
        model.W_pos.zero_()
        model.W_E.zero_()
        for tok, s in ((1, 1.0), (2, 2.0), (3, 4.0)):
            model.W_E[tok] = s * unit
    tokens = torch.tensor([[0, 1, 2, 3]])
    got = mean_norm_scales(model, [tokens])
    assert got["blocks.0.ln1.hook_scale"] == pytest.approx(12 / 7, rel=1e-12)

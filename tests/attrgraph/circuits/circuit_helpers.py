"""Tiny random TransformerLens models and clean/corrupted pairs for the circuit tests."""

import torch

from attrgraph.circuits.pairs import Pairs

# Tiny matrices: OpenMP threads on a shared 2-core machine cost ~80x in spin-waiting.
torch.set_num_threads(1)

B, T, V = 6, 7, 50


def tiny_model(dtype=torch.float64, attn_only=False):
    from transformer_lens import HookedTransformer, HookedTransformerConfig

    cfg = HookedTransformerConfig(
        n_layers=2,
        d_model=32,
        n_heads=4,
        d_head=8,
        d_mlp=None if attn_only else 64,
        d_vocab=V,
        n_ctx=32,
        act_fn="gelu",
        normalization_type="LN",
        attn_only=attn_only,
        dtype=dtype,
        seed=0,
    )
    model = HookedTransformer(cfg)
    model.eval()
    return model


def make_pairs(seed=0, n=B, kind="logit"):
    g = torch.Generator().manual_seed(seed)
    clean = torch.randint(0, V, (n, T), generator=g)
    corrupt = clean.clone()
    corrupt[:, 2] = torch.randint(0, V, (n,), generator=g)
    corrupt[:, 4] = torch.randint(0, V, (n,), generator=g)
    w = torch.zeros(n, V)
    w[:, 3], w[:, 5] = 1.0, -1.0
    return Pairs(clean, corrupt, torch.full((n,), T - 1), w, kind)

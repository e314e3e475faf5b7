"""The block layout names hooks that TransformerLens really creates, and its q / k are the queries and
keys the attention scores are made of (checked against TransformerLens's own `hook_attn_scores`)."""

import math

import pytest
import torch
from transformer_lens import HookedTransformer, HookedTransformerConfig

from transcoders.block_layout import (
    MLP_INPUT,
    SITES,
    BlockLayout,
    block_hook,
    hook_layer,
    split_block_hook,
)

BASE = dict(n_layers=2, d_model=16, n_heads=4, d_head=4, d_mlp=32, d_vocab=20, n_ctx=16, seed=0)
ARCHS = {
    "gpt2": dict(act_fn="gelu_new", normalization_type="LN"),
    "qwen3": dict(
        act_fn="silu",
        normalization_type="RMS",
        gated_mlp=True,
        positional_embedding_type="rotary",
        rotary_dim=4,
        n_key_value_heads=2,
        use_qk_norm=True,
    ),
    "gemma3": dict(
        act_fn="gelu_pytorch_tanh",
        normalization_type="RMS",
        gated_mlp=True,
        positional_embedding_type="rotary",
        rotary_dim=4,
        n_key_value_heads=2,
        use_qk_norm=True,
        use_local_attn=True,
        attn_types=["local", "global"],
        window_size=3,
        use_normalization_before_and_after=True,
    ),
    "pythia": dict(
        act_fn="gelu",
        normalization_type="LN",
        parallel_attn_mlp=True,
        positional_embedding_type="rotary",
        rotary_dim=4,
    ),
}


def model_of(arch: str) -> HookedTransformer:
    cfg = HookedTransformerConfig(**BASE, **ARCHS[arch])
    cfg.use_attn_result = cfg.use_split_qkv_input = cfg.use_hook_mlp_in = True  # every hook exists
    model = HookedTransformer(cfg)
    with torch.no_grad():  # QK-norm weights away from 1, so that a norm left out would show
        for name, p in model.named_parameters():
            if name.endswith(("q_norm.w", "k_norm.w")):
                p.copy_(torch.linspace(0.5, 1.5, p.numel()).reshape(p.shape))
    return model


@pytest.mark.parametrize("arch", list(ARCHS))
def test_every_site_it_names_exists_in_the_model(arch):
    model = model_of(arch)
    layout = BlockLayout.of(model.cfg)
    for site in SITES:
        for l in range(layout.n_layers):
            if site == "resid_mid" and layout.parallel:
                with pytest.raises(ValueError, match="mlp_reads"):
                    layout.hook(site, l)
                assert "blocks.0.hook_resid_mid" not in model.hook_dict  # TransformerLens has none either
                continue
            name = layout.hook(site, l)
            optional = (
                (("ln1_post", "ln2_post") if not layout.norms_after else ())
                + (("q_norm", "k_norm") if not layout.qk_norm else ())
                + (("rot_",) if not layout.rotary else ())
            )
            if any(o in name for o in optional):
                continue
            assert name in model.hook_dict, f"{arch}: {name}"
    for l in range(layout.n_layers):
        assert layout.mlp_reads(l) in model.hook_dict and layout.q(l) in model.hook_dict
    assert layout.norm_scale("ln_final") in model.hook_dict


@pytest.mark.parametrize("arch", list(ARCHS))
def test_q_and_k_are_what_the_scores_use(arch):
    """scores[h, i, j] = q_i^h . k_j^(h's key head) / sqrt(d_head), TransformerLens's own hook_attn_scores
    (where the causal and window masks leave them); on a QK-norm model `attn.hook_q` is the query before the norm and fails it."""
    model = model_of(arch)
    layout = BlockLayout.of(model.cfg)
    tokens = torch.randint(0, 20, (1, 6), generator=torch.Generator().manual_seed(1))
    _, cache = model.run_with_cache(tokens)
    for l in range(layout.n_layers):
        q, k = cache[layout.q(l)][0], cache[layout.k(l)][0]  # [pos, heads, d_head]
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        scores = torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(q.shape[-1])
        want = cache[layout.hook("attn_scores", l)][0]
        seen = want.isfinite()  # the causal (and sliding-window) mask is in the hook
        assert seen.sum() >= 6 * layout.n_layers
        torch.testing.assert_close(scores[seen], want[seen])
        if layout.qk_norm:
            raw = cache[layout.hook("q_raw", l)][0]
            assert not torch.allclose(raw, cache[layout.q(l)][0], atol=1e-3)


def test_flags_read_from_the_config():
    qwen, gemma, pythia, gpt2 = (
        BlockLayout.of(model_of(a).cfg) for a in ("qwen3", "gemma3", "pythia", "gpt2")
    )
    assert qwen.qk_norm and qwen.grouped_query and qwen.gated_mlp and not qwen.norms_after
    assert gemma.norms_after and gemma.local_layers == (0,) and gemma.qk_norm
    assert pythia.parallel and not pythia.gated_mlp
    assert not (gpt2.parallel or gpt2.qk_norm or gpt2.rotary or gpt2.grouped_query)


def test_one_answer_to_what_is_supported():
    gpt2 = BlockLayout.of(HookedTransformerConfig(**BASE, **ARCHS["gpt2"]))
    assert "use_split_qkv_input" in BlockLayout.of(model_of("gpt2").cfg).unsupported("linear")
    assert all(gpt2.unsupported(use) is None for use in ("replacement", "linear", "circuits", "qk"))
    qwen = BlockLayout.of(model_of("qwen3").cfg)
    assert qwen.grouped_query and qwen.unsupported("circuits") is None  # run ungrouped (circuits/patching.py)
    gemma3 = BlockLayout.of(model_of("gemma3").cfg)
    assert "normalises after each sublayer" in gemma3.unsupported("circuits")
    capped = BlockLayout.of(HookedTransformerConfig(**BASE, act_fn="relu", output_logits_soft_cap=30.0))
    assert "soft-caps its logits" in capped.unsupported("replacement")
    olmo = BlockLayout.of(
        HookedTransformerConfig(**BASE, act_fn="relu", original_architecture="Olmo2ForCausalLM")
    )
    assert olmo.unsupported("replacement") is None  # frozen norms are linear wherever they sit
    assert all("after each sublayer" in olmo.unsupported(u) for u in ("linear", "circuits"))
    with pytest.raises(ValueError, match="one of"):
        gpt2.unsupported("everything")


def test_names_parse_back():
    assert split_block_hook("blocks.3.attn.hook_z") == (3, "attn.hook_z")
    assert split_block_hook(MLP_INPUT) == (None, "ln2.hook_normalized")
    assert split_block_hook("hook_embed") is None
    assert block_hook("mlp_out") == "blocks.{layer}.hook_mlp_out" and block_hook("mlp.hook_in").endswith(
        ".mlp.hook_in"
    )
    assert [
        hook_layer(n, 4) for n in ("blocks.2.hook_resid_post", "hook_embed", "ln_final.hook_normalized")
    ] == [2, -1, 4]

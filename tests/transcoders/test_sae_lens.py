"""sae_lens SAEs and transcoders, built here with random weights: objects and saved directories."""

import pytest
import torch
from sae_lens import JumpReLUSAE, JumpReLUSAEConfig, StandardSAE, StandardSAEConfig, TopKSAE, TopKSAEConfig
from sae_lens.saes.sae import SAEMetadata
from sae_lens.saes.transcoder import (
    JumpReLUTranscoder,
    JumpReLUTranscoderConfig,
    SkipTranscoder,
    SkipTranscoderConfig,
)

from transcoders import CorruptTranscoderError, UnknownFormatError, load_transcoders

D, S = 16, 24


def build(arch: str, layer: int, seed: int):
    hook = f"blocks.{layer}.hook_attn_out"
    meta = SAEMetadata(hook_name=hook)
    tmeta = SAEMetadata(
        hook_name=f"blocks.{layer}.ln2.hook_normalized", hook_name_out=f"blocks.{layer}.hook_mlp_out"
    )
    sae = {
        "standard": lambda: StandardSAE(StandardSAEConfig(d_in=D, d_sae=S, metadata=meta)),
        "jumprelu": lambda: JumpReLUSAE(JumpReLUSAEConfig(d_in=D, d_sae=S, metadata=meta)),
        "topk": lambda: TopKSAE(TopKSAEConfig(d_in=D, d_sae=S, k=5, metadata=meta)),
        "skip_transcoder": lambda: SkipTranscoder(
            SkipTranscoderConfig(d_in=D, d_sae=S, d_out=D, apply_b_dec_to_input=False, metadata=tmeta)
        ),
        "jumprelu_transcoder": lambda: JumpReLUTranscoder(
            JumpReLUTranscoderConfig(d_in=D, d_sae=S, d_out=D, apply_b_dec_to_input=False, metadata=tmeta)
        ),
    }[arch]()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in sae.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        if hasattr(sae, "threshold"):
            sae.threshold.abs_()
    return sae.eval()


ARCHS = ["standard", "jumprelu", "topk", "skip_transcoder", "jumprelu_transcoder"]


@pytest.mark.parametrize("arch", ARCHS)
def test_objects_and_saved_dirs_match_sae_lens(tmp_path, arch):
    saes = [build(arch, l, seed=l) for l in range(2)]
    from_objects = load_transcoders(saes[::-1])  # any order: placed by hook name
    for l, sae in enumerate(saes):
        sae.save_model(tmp_path / f"layer_{l}")
    from_dir = load_transcoders(tmp_path)
    x = torch.randn(6, 2, D)
    for tc in (from_objects, from_dir):
        assert tc.cfg.kind == ("plt" if "transcoder" in arch else "sae")
        res = tc(x)
        for l, sae in enumerate(saes):
            with torch.no_grad():
                torch.testing.assert_close(res.out[:, l], sae(x[:, l]), rtol=1e-4, atol=1e-4)
                torch.testing.assert_close(res.acts[:, l], sae.encode(x[:, l]), rtol=1e-4, atol=1e-4)
    assert from_dir.cfg.input_hook == (
        "blocks.{layer}.ln2.hook_normalized" if "transcoder" in arch else "blocks.{layer}.hook_attn_out"
    )


def test_missing_layer_and_mixed_kinds(tmp_path):
    with pytest.raises(CorruptTranscoderError, match=r"layers \[0\]"):
        load_transcoders([build("standard", 1, 0)])
    with pytest.raises(CorruptTranscoderError, match="differs"):
        load_transcoders([build("standard", 0, 0), build("jumprelu", 1, 0)])


def test_run_time_normalization_is_refused():
    sae = StandardSAE(
        StandardSAEConfig(
            d_in=D,
            d_sae=S,
            normalize_activations="layer_norm",
            metadata=SAEMetadata(hook_name="blocks.0.hook_attn_out"),
        )
    )
    with pytest.raises(UnknownFormatError, match="normalizes"):
        load_transcoders(sae)

"""Per-layer transcoders (PLT): one sparse MLP replacement per layer.

Seed: linear-computation-graphs, section 2.2, eq. 3; circuit-tracing appendix.

1. Layer l reads the MLP input `x[l]` (read site `blocks.{l}.ln2.hook_normalized`, sites.py).
2. `a[l] = act(x[l] @ W_enc[l] + b_enc[l])`.
3. It writes only layer l's MLP output: `y[l] = a[l] @ W_dec[l] + b_dec[l] (+ x[l] @ W_skip[l])`.
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from transcoders.base import SparseCoder
from transcoders.config import TranscoderConfig


class PerLayerTranscoder(SparseCoder):
    """One transcoder per layer; `W_dec` is [n_layers, d_sae, d_model]."""

    kind = "plt"
    one_decoder_per_layer = True
    decoder_feature_axis = 1

    def __init__(self, cfg: TranscoderConfig):
        super().__init__(cfg)
        self.W_dec = nn.Parameter(torch.zeros(cfg.n_layers, cfg.d_sae, cfg.d_model))
        self.declare_features(W_dec=1)
        self.n_features_init = cfg.d_sae
        self.n_out_init = 1

    def decode(self, acts: Float[Tensor, "... n_layers d_sae"]) -> Float[Tensor, "... n_layers d_model"]:
        """`a[l] @ W_dec[l] + b_dec[l]` (no skip)."""
        return torch.einsum("...ls,lsd->...ld", acts, self.W_dec) + self.b_dec

    def decoder_vectors(self, layer: int, features: Int[Tensor, " n"]) -> Float[Tensor, "n 1 d_model"]:
        """Rows of `W_dec[layer]`, with an output-layer axis of length 1."""
        return self.W_dec[layer][features][:, None, :]

    def decoders_into(self, layer: int) -> list[tuple[int, Float[Tensor, "d_sae d_model"]]]:
        return [(layer, self.W_dec[layer])]

    def decoder_weights(self) -> list[Tensor]:
        return [self.W_dec]

    def decoder_norms(self) -> Float[Tensor, "n_layers d_sae"]:
        return self.W_dec.norm(dim=-1)

    def _scale_decoder(self, s_out: Tensor) -> None:
        self.W_dec.mul_(s_out[:, None, None])

"""Cross-layer transcoder (CLT): features read one layer and write every later MLP output.

Seed: circuit-tracing appendix ("CLT Implementation Details", "Attribution Graph Computation").

1. A feature of layer l reads the MLP input of layer l: `a[l] = act(x[l] @ W_enc[l] + b_enc[l])`.
2. It has one decoder per output layer l' >= l: `W_dec[l]` is [d_sae, n_layers - l, d_model],
   `W_dec[l][:, j]` writing layer `l + j`.
3. The output of layer l' sums over source layers: `y[l'] = sum_{l <= l'} a[l] @ W_dec[l][:, l' - l] + b_dec[l']`
   (+ `x[l'] @ W_skip[l']` when there is a skip).
4. Sparsity is penalized with the norm of a feature's concatenated decoders (`decoder_norms`).
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from transcoders.base import SparseCoder
from transcoders.config import TranscoderConfig


class CrossLayerTranscoder(SparseCoder):
    """`W_dec` is an `nn.ParameterList`; `W_dec[l]` is [d_sae, n_layers - l, d_model]."""

    kind = "clt"
    decoder_feature_axis = 0

    def __init__(self, cfg: TranscoderConfig):
        super().__init__(cfg)
        L, D, S = cfg.n_layers, cfg.d_model, cfg.d_sae
        self.W_dec = nn.ParameterList([nn.Parameter(torch.zeros(S, L - l, D)) for l in range(L)])
        self.declare_features(**{f"W_dec.{l}": 0 for l in range(L)})
        self.n_features_init = L * S
        self.n_out_init = L

    def decode(self, acts: Float[Tensor, "... n_layers d_sae"]) -> Float[Tensor, "... n_layers d_model"]:
        """Sum over source layers l <= l' of `a[l] @ W_dec[l][:, l' - l]`, plus `b_dec` (no skip)."""
        out = self.b_dec.expand(*acts.shape[:-2], self.n_layers, self.d_model).clone()
        for l, W in enumerate(self.W_dec):
            out[..., l:, :] += torch.einsum("...s,snd->...nd", acts[..., l, :], W)
        return out

    def decoder_vectors(self, layer: int, features: Int[Tensor, " n"]) -> Float[Tensor, "n n_out d_model"]:
        """Decoders of `features` of source `layer` into output layers layer..n_layers-1."""
        return self.W_dec[layer][features]

    def decoders_into(self, layer: int) -> list[tuple[int, Float[Tensor, "d_sae d_model"]]]:
        return [(source, self.W_dec[source][:, layer - source]) for source in range(layer + 1)]

    def decoder_weights(self) -> list[Tensor]:
        return list(self.W_dec)

    def decoder_norms(self) -> Float[Tensor, "n_layers d_sae"]:
        return torch.stack([W.pow(2).sum(dim=(1, 2)).sqrt() for W in self.W_dec])

    def _scale_decoder(self, s_out: Tensor) -> None:
        for l, W in enumerate(self.W_dec):
            W.mul_(s_out[l:][None, :, None])

"""Sparse autoencoders (SAE): a per-layer sparse code of one hook, read and written there.

Seed: linear-computation-graphs, section 2.1, eq. 1 (`f = ReLU(W_E x + b_E)`,
`x_hat = W_D f`, loss `||x - x_hat||^2 + lambda ||f||_1`), in TransformerLens orientation:

1. `a[l] = act(x[l] @ W_enc[l] + b_enc[l])`, `x[l]` the value of `cfg.input_hook` at layer l.
2. `x_hat[l] = a[l] @ W_dec[l] + b_dec[l]`, written back at the same hook.

The arithmetic is a per-layer transcoder's; only the sites differ (and there is no skip).
"""

from __future__ import annotations

from transcoders.plt import PerLayerTranscoder


class SAE(PerLayerTranscoder):
    """An SAE per layer on one hook (e.g. `blocks.{layer}.hook_attn_out`); `cfg.kind == "sae"`."""

    kind = "sae"

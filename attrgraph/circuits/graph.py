"""The component computation graph of a TransformerLens model (Bhaskar et al., 2024; HAP seed sec. 3.1).

1. Upstream nodes write into the residual stream: the input (token + positional
   embedding, i.e. `blocks.0.hook_resid_pre`), each attention head (its
   `attn.hook_result`, W_O included, b_O excluded) and each MLP (`hook_mlp_out`).
   Upstream order is forward order: input, a0.h0..a0.h{H-1}, m0, a1.h0, ...
2. Downstream inputs read the residual stream: the q, k and v inputs of every head
   (`hook_q_input`, `hook_k_input`, `hook_v_input`, separate edges), each MLP
   (`hook_mlp_in`) and the logits (the last `hook_resid_post`, before `ln_final`).
   With grouped-query attention (Llama-3, Qwen, Mistral) the k and v inputs are still one per
   query head: TransformerLens's ungrouped mode repeats a key/value head's weights for each query
   head of its group (patching.py `component_hooks`), so an edge into `a1.h0.k` changes the key
   head 0 reads and not that of another head of its group, as edges into q, k and v of one head are
   independent in multi-head attention.
3. An edge (u, d) exists when u is written before d is read: a head in layer l reads
   input, heads and MLPs of layers < l; the MLP of layer l also reads the heads of l,
   unless the block is parallel (GPT-J / GPT-NeoX: its MLP reads `resid_pre` as its
   heads do); the logits read everything. `valid[u, d]` holds this.
4. Because the residual stream is a sum, the input of d is `sum_u z_u + biases`; an
   edge is patched by replacing its term z_u with z_u of another run (patching.py).
5. Non-positional edges are one per (u, d); positional edges are per position
   (or per schema span), plus the cross-position attention edges of a head (PEAP
   seed eqs. 3-6): k and v of position t' and q of position t, feeding the head's
   output at t. Their scores live in a tensor `[n_layers, n_heads, 3, n_pos, n_pos]`
   indexed (layer, head, q/k/v, t, t').
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from attrgraph.bundled.loading import check_model
from attrgraph.errors import UnsupportedModelError
from transcoders.block_layout import BlockLayout

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

QKV = ("q", "k", "v")


@dataclass(frozen=True)
class ComponentGraph:
    """Node names, indices and the causal edge mask of a model's component graph."""

    n_layers: int
    """Transformer blocks."""
    n_heads: int
    """Attention heads per block."""
    has_mlp: bool
    """False for attention-only models (no MLP nodes)."""
    parallel: bool = False
    """Attention and MLP of a block read the same residual (step 3): an MLP does not read its layer's heads."""

    @classmethod
    def from_model(cls, model: HookedTransformer) -> ComponentGraph:
        check_model(model)
        cfg = model.cfg
        why = BlockLayout.of(cfg).unsupported("circuits")
        if why is not None:
            raise UnsupportedModelError(f"component circuits cannot run on this model: {why}.")
        return cls(cfg.n_layers, cfg.n_heads, not cfg.attn_only, BlockLayout.of(cfg).parallel)

    # ---- sizes -----------------------------------------------------------------
    @property
    def n_mlp(self) -> int:
        return 1 if self.has_mlp else 0

    @property
    def n_up(self) -> int:
        return 1 + self.n_layers * (self.n_heads + self.n_mlp)

    @property
    def n_down(self) -> int:
        return self.n_layers * (3 * self.n_heads + self.n_mlp) + 1

    # ---- indices ---------------------------------------------------------------
    def up_head(self, layer: int, head: int) -> int:
        return 1 + layer * (self.n_heads + self.n_mlp) + head

    def up_mlp(self, layer: int) -> int:
        return 1 + layer * (self.n_heads + self.n_mlp) + self.n_heads

    def down_head(self, layer: int, slot: int, head: int) -> int:
        """Index of the q (slot 0), k (1) or v (2) input of a head."""
        return layer * (3 * self.n_heads + self.n_mlp) + slot * self.n_heads + head

    def down_mlp(self, layer: int) -> int:
        return layer * (3 * self.n_heads + self.n_mlp) + 3 * self.n_heads

    @property
    def down_logits(self) -> int:
        return self.n_down - 1

    def n_up_before(self, layer: int, mlp: bool = False) -> int:
        """How many upstream nodes (a prefix in forward order) a layer's heads (or MLP) read."""
        return 1 + layer * (self.n_heads + self.n_mlp) + (self.n_heads if mlp and not self.parallel else 0)

    # ---- names -----------------------------------------------------------------
    @cached_property
    def up_names(self) -> tuple[str, ...]:
        names = ["input"]
        for layer in range(self.n_layers):
            names += [f"a{layer}.h{h}" for h in range(self.n_heads)]
            names += [f"m{layer}"] * self.n_mlp
        return tuple(names)

    @cached_property
    def down_names(self) -> tuple[str, ...]:
        names = []
        for layer in range(self.n_layers):
            names += [f"a{layer}.h{h}.{s}" for s in QKV for h in range(self.n_heads)]
            names += [f"m{layer}"] * self.n_mlp
        return tuple(names + ["logits"])

    @cached_property
    def down_node(self) -> tuple[int, ...]:
        """For each downstream input, the node it feeds (upstream index; n_up for the logits)."""
        nodes = []
        for layer in range(self.n_layers):
            nodes += [self.up_head(layer, h) for _ in QKV for h in range(self.n_heads)]
            nodes += [self.up_mlp(layer)] * self.n_mlp
        return tuple(nodes + [self.n_up])

    @cached_property
    def valid(self) -> Tensor:
        """Bool `[n_up, n_down]`: which (upstream, downstream) pairs are edges."""
        valid = torch.zeros(self.n_up, self.n_down, dtype=torch.bool, device="cpu")  # structure: host
        for layer in range(self.n_layers):
            for s in range(3):
                for h in range(self.n_heads):
                    valid[: self.n_up_before(layer), self.down_head(layer, s, h)] = True
            if self.has_mlp:
                valid[: self.n_up_before(layer, mlp=True), self.down_mlp(layer)] = True
        valid[:, self.down_logits] = True
        return valid

    @property
    def n_edges(self) -> int:
        return int(self.valid.sum())

    def edge_name(self, u: int, d: int) -> str:
        return f"{self.up_names[u]}->{self.down_names[d]}"

"""Edge scores and circuits over the component graph, positional or not.

1. Non-positional: one value per edge (u, d), a `[n_up, n_down]` tensor masked by
   `graph.valid`.
2. Positional (PEAP seed sec. 3): one value per residual edge per position (or
   schema span), `[n_pos, n_up, n_down]`, plus cross-position attention edges
   `[n_layers, n_heads, 3, n_pos, n_pos]` indexed (layer, head, q/k/v, t, t'),
   masked by `attn_valid [n_pos, n_pos]` (t' <= t for token positions; for spans,
   the pairs that occur causally in some example).
3. A circuit is the same layout of booleans. To run it, each example gets keep
   masks for patching.py: position t of example b uses the entry of its span
   `span_index[b, t]` (its own position for templatic data); padding (-1) keeps all.
4. Flat edge order (used by construction, storage and tests): residual edges in
   (position, u, d) order, then attention edges in (layer, head, q/k/v, t, t') order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from jaxtyping import Int
from torch import Tensor

from attrgraph.circuits.graph import QKV, ComponentGraph


@dataclass(frozen=True)
class EdgeLayout:
    """Which entries of the residual and attention tensors are edges."""

    graph: ComponentGraph
    """The component graph."""
    positions: tuple[str, ...] | None = None
    """Names of positions or spans; None for a non-positional layout."""
    attn_valid: Tensor | None = None
    """Bool `[n_pos, n_pos]`: which (t, t') attention pairs are edges (positional only)."""

    @property
    def positional(self) -> bool:
        return self.positions is not None

    @property
    def n_pos(self) -> int:
        return len(self.positions) if self.positions is not None else 0

    def resid_valid(self) -> Tensor:
        v = self.graph.valid
        return v if not self.positional else v.expand(self.n_pos, -1, -1)

    def attn_valid_full(self) -> Tensor | None:
        if not self.positional:
            return None
        g = self.graph
        return self.attn_valid.expand(g.n_layers, g.n_heads, 3, -1, -1)

    def flatten(self, resid: Tensor, attn: Tensor | None) -> Tensor:
        """Values of every edge in flat order (module docstring, step 4)."""
        flat = resid[self.resid_valid()]
        if self.positional:
            flat = torch.cat([flat, attn[self.attn_valid_full()]])
        return flat

    def unflatten(self, flat: Tensor) -> tuple[Tensor, Tensor | None]:
        rv = self.resid_valid()
        resid = torch.zeros(rv.shape, dtype=flat.dtype, device=flat.device)
        n = int(rv.sum())
        resid[rv] = flat[:n]
        attn = None
        if self.positional:
            av = self.attn_valid_full()
            attn = torch.zeros(av.shape, dtype=flat.dtype, device=flat.device)
            attn[av] = flat[n:]
        return resid, attn

    @property
    def n_edges(self) -> int:
        n = int(self.resid_valid().sum())
        return n + (int(self.attn_valid_full().sum()) if self.positional else 0)

    def edge_names(self) -> list[str]:
        g = self.graph
        names = []
        for p in self.positions or [None]:
            at = f"@{p}" if p is not None else ""
            names += [f"{g.up_names[u]}{at}->{g.down_names[d]}{at}" for u, d in g.valid.nonzero().tolist()]
        if self.positional:
            for layer, h, s, t, tp in self.attn_valid_full().nonzero().tolist():
                src = self.positions[t if s == 0 else tp]
                names.append(
                    f"a{layer}.h{h}.{QKV[s]}@{src}->a{layer}.h{h}@{self.positions[t]}[{self.positions[tp]}]"
                )
        return names


@dataclass(frozen=True)
class EdgeScores:
    """Attribution scores of every edge (signed; larger |score| = more important)."""

    layout: EdgeLayout
    """Which entries are edges."""
    resid: Tensor
    """`[n_up, n_down]` or `[n_pos, n_up, n_down]`."""
    attn: Tensor | None = None
    """`[n_layers, n_heads, 3, n_pos, n_pos]` (positional only)."""
    method: str = "eap"
    """How they were computed."""

    def flat(self) -> Tensor:
        return self.layout.flatten(self.resid, self.attn)


@dataclass(frozen=True)
class Circuit:
    """A set of edges of the component graph."""

    layout: EdgeLayout
    """Which entries are edges."""
    resid: Tensor
    """Bool, the residual edges kept."""
    attn: Tensor | None = None
    """Bool, the cross-position attention edges kept (positional only)."""
    method: str = ""
    """How it was found."""
    meta: dict = field(default_factory=dict, compare=False)
    """Method settings (n, sparsity, ...) for the record."""

    @classmethod
    def from_flat(
        cls, layout: EdgeLayout, flat: Tensor, method: str = "", meta: dict | None = None
    ) -> Circuit:
        resid, attn = layout.unflatten(flat.bool())
        return cls(layout, resid.bool(), None if attn is None else attn.bool(), method, meta or {})

    def flat(self) -> Tensor:
        return self.layout.flatten(self.resid, self.attn)

    @property
    def n_edges(self) -> int:
        return int(self.flat().sum())

    def keep_masks(
        self, span_index: Int[Tensor, "batch pos"] | None = None, n_pos: int | None = None
    ) -> tuple[Tensor, Tensor | None]:
        """Keep coefficients for `patching.run_edges` (module docstring, step 3).

        span_index: the span of each token position (-1: padding, -2: a span outside the circuit's);
            None means span = position
        (templatic data), with `n_pos` the prompt length.
        """
        if not self.layout.positional:
            return self.resid.float(), None
        if span_index is None:
            span_index = torch.arange(n_pos or self.layout.n_pos, device=self.resid.device).unsqueeze(0)
        return expand_to_positions(self.resid.float(), self.attn.float(), span_index)


def expand_to_positions(
    resid: Tensor, attn: Tensor, span_index: Int[Tensor, "batch pos"]
) -> tuple[Tensor, Tensor]:
    """Per-example, per-position values from span values; padding (-1) gets 1 (keep), positions
    in a span the circuit does not know (-2) get 0 (ablated)."""
    pad, unknown = span_index == -1, span_index == -2
    idx = span_index.clamp(min=0)
    r = resid[idx]  # [b t u d]
    r[unknown] = 0.0
    r[pad] = 1.0
    a = attn[:, :, :, idx[:, :, None], idx[:, None, :]]  # [l h 3 b t t']
    a = a.permute(3, 0, 1, 2, 4, 5).clone()
    for mask, value in ((unknown, 0.0), (pad, 1.0)):
        both = mask[:, :, None] | mask[:, None, :]
        a[both[:, None, None, None].expand_as(a)] = value
    return r, a

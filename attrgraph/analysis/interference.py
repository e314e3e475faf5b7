"""Interference weights over many features: how many large virtual weights are ever used.

Seed: circuit-tracing appendix, "Interference Weights over More Features". Steps:

1. Sample features with equal representation across layers (and sites): `n_per_layer` of each
   (site, layer) among the features that fire at least once on the corpus (the appendix samples
   among features active on its prompts).
2. Their virtual weights (global_weights.py) to every feature they write to (output) and from
   every feature that writes to them (input), with the norm denominators fixed at their corpus
   means (`mean_norm_scales`; "Residual Stream Norms Growth").
3. Coactivation of every such pair over the corpus in one streamed pass
   (`transcoders.coactivation`): a weight whose pair never fires together on one token is "unused".
4. Per weight bin: how many weights, how many of them coactive, and the share (the appendix's
   text labels); `plot_interference` draws both distributions.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from attrgraph.analysis.global_weights import SITES, GlobalWeights, mean_norm_scales
from attrgraph.engine.sets import transcoder_sets
from attrgraph.errors import OptionError
from transcoders.coactivation import compute_coactivation, flat_activations


@dataclass
class Interference:
    """Every sampled feature's input and output virtual weights, and whether each pair coactivates."""

    features: list[tuple[str, int, int]]
    """The sampled features (site, layer, index)."""
    direction: np.ndarray
    """"input" or "output" per weight (relative to the sampled feature)."""
    sampled: np.ndarray
    """Index into `features` of the sampled end of each weight."""
    other: np.ndarray
    """[n, 3] (site number 0 attn / 1 mlp, layer, index) of the other end of each weight."""
    weight: np.ndarray
    """The virtual weight, source to target."""
    n_both: np.ndarray
    """Positions where source and target fire together."""
    mean_source_given_target: np.ndarray
    """`E[a_s | t active]` over the corpus (NaN if t never fires)."""
    n_positions: int
    """Corpus positions counted."""

    @property
    def ever(self) -> np.ndarray:
        return self.n_both > 0


def _coders(sets) -> list:
    return [sets.mlp] if sets.attn is None else [sets.attn, sets.mlp]


def _site_number(sets, site: str) -> int:
    return 0 if (site == "attn" or sets.attn is None) else 1


def live_features(model, sets, sequences: torch.Tensor, chunk_seqs: int = 32) -> dict:
    """(site, layer) -> the indices of the features that fire at least once on `sequences` (BOS skipped)."""
    coders = _coders(sets)
    counts = None
    for tokens in sequences.split(chunk_seqs):
        a = flat_activations(model, coders, tokens)[:, 1:] > 0
        c = a.reshape(-1, a.shape[-1]).sum(0)
        counts = c if counts is None else counts + c
    out, offset = {}, 0
    for c, site in zip(coders, ("attn", "mlp") if len(coders) == 2 else ("mlp",)):
        for l in range(c.cfg.n_layers):
            n = counts[offset + l * c.cfg.d_sae : offset + (l + 1) * c.cfg.d_sae]
            out[(site, l)] = torch.nonzero(n > 0)[:, 0].cpu().numpy()
        offset += c.cfg.n_layers * c.cfg.d_sae
    return out


def sample_features(live: dict, n_per_layer: int, seed: int = 0) -> list[tuple[str, int, int]]:
    """Step 1: `n_per_layer` features of each (site, layer), drawn without replacement (all when fewer)."""
    if n_per_layer < 1:
        raise OptionError(f"n_per_layer is {n_per_layer}; pass at least 1.")
    rng = np.random.default_rng(seed)
    out = []
    for (site, layer), idx in sorted(live.items(), key=lambda kv: (kv[0][1], SITES.index(kv[0][0]))):
        pick = rng.choice(idx, size=min(n_per_layer, len(idx)), replace=False) if len(idx) else []
        out += [(site, layer, int(f)) for f in sorted(pick)]
    return out


def interference(
    model,
    transcoders,
    sequences: torch.Tensor,
    *,
    n_per_layer: int = 25,
    seed: int = 0,
    chunk_seqs: int = 32,
) -> Interference:
    """Steps 1-3 on `sequences` [n_seq, n_ctx] (token ids, BOS first)."""
    sets = transcoder_sets(model, transcoders)
    coders = _coders(sets)
    sequences = torch.as_tensor(sequences, device=model.cfg.device).long()
    features = sample_features(live_features(model, sets, sequences, chunk_seqs), n_per_layer, seed)
    scales = mean_norm_scales(model, sequences.split(chunk_seqs))
    gw = GlobalWeights(model, sets, scales)
    offsets = {"attn": 0, "mlp": 0}
    if sets.attn is not None:
        offsets["mlp"] = sets.attn.cfg.n_layers * sets.attn.cfg.d_sae
    width = {"attn": sets.attn.cfg.d_sae if sets.attn is not None else 0, "mlp": sets.mlp.cfg.d_sae}

    def flat(site, layer, f):
        site = np.asarray(site)
        off = np.where(site == "attn", offsets["attn"], offsets["mlp"])
        return off + np.asarray(layer) * np.where(site == "attn", width["attn"], width["mlp"]) + np.asarray(f)

    rows = []  # (direction, sampled index, other site, other layer, other index, weight, source flat, target flat)
    for i, (site, layer, f) in enumerate(features):
        me = int(flat(site, layer, f))
        for direction, conn in (
            ("output", gw.output_weights(site, layer, f)),
            ("input", gw.input_weights(site, layer, f)),
        ):
            other = flat(conn.site, conn.layer, conn.feature).astype(np.int64)
            src, tgt = (
                (np.full_like(other, me), other)
                if direction == "output"
                else (other, np.full_like(other, me))
            )
            rows.append((direction, i, conn, src, tgt))
    blocks = [
        np.concatenate([np.stack([r[3], r[4]], 1) for r in rows if r[0] == d]) for d in ("output", "input")
    ]
    out_co, in_co = compute_coactivation(model, coders, sequences, blocks, chunk_seqs=chunk_seqs)
    rows = [r for r in rows if r[0] == "output"] + [r for r in rows if r[0] == "input"]  # the blocks' order
    return Interference(
        features=features,
        direction=np.concatenate([np.full(len(r[2]), r[0]) for r in rows]),
        sampled=np.concatenate([np.full(len(r[2]), r[1]) for r in rows]),
        other=np.concatenate(
            [
                np.stack(
                    [np.where(r[2].site == "attn", 0, _site_number(sets, "mlp")), r[2].layer, r[2].feature], 1
                )
                for r in rows
            ]
        ),
        weight=np.concatenate([r[2].weight for r in rows]),
        n_both=np.concatenate([out_co.n_both, in_co.n_both]),
        mean_source_given_target=np.concatenate(
            [out_co.mean_source_given_target, in_co.mean_source_given_target]
        ),
        n_positions=out_co.n_positions,
    )


def bin_table(weight: np.ndarray, ever: np.ndarray, n_bins: int = 30) -> dict:
    """Step 4: equal-width weight bins over [min, max]: count, coactive count and share per bin."""
    if len(weight) == 0:
        raise OptionError("no weights to bin; sample at least one feature that has connections.")
    edges = np.linspace(weight.min(), weight.max(), n_bins + 1)
    which = np.clip(np.searchsorted(edges, weight, side="right") - 1, 0, n_bins - 1)
    count = np.bincount(which, minlength=n_bins)
    coactive = np.bincount(which, weights=ever.astype(float), minlength=n_bins).astype(int)
    with np.errstate(invalid="ignore", divide="ignore"):
        share = np.where(count > 0, coactive / np.maximum(count, 1), np.nan)
    return dict(edges=edges, count=count, coactive=coactive, share=share)


def plot_interference(table: dict, path=None, title: str = ""):
    """Histogram of all weights and of the coactive ones per bin (log count), each bin labelled with
    its coactive share (the appendix's figure); saves to `path` when given, returns the figure."""
    import matplotlib

    if path is not None:
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    edges, count, coactive, share = table["edges"], table["count"], table["coactive"], table["share"]
    mid, width = (edges[1:] + edges[:-1]) / 2, np.diff(edges)
    fig, ax = plt.subplots(figsize=(10, 4.5))
    ax.bar(mid, count, width=width, color="#bbbbbb", label="all virtual weights", log=True)
    ax.bar(
        mid,
        np.maximum(coactive, 0),
        width=width * 0.6,
        color="#d62728",
        label="pair ever coactivates",
        log=True,
    )
    for x, c, s in zip(mid, count, share):
        if c > 0:
            ax.text(x, c * 1.15, f"{100 * s:.0f}%", ha="center", va="bottom", fontsize=7, rotation=90)
    ax.set_xlabel("virtual weight (norm denominators at their corpus means)")
    ax.set_ylabel("number of weights")
    ax.set_title(title or "virtual weights of sampled features vs. those whose pair ever coactivates")
    ax.legend(loc="upper right")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig

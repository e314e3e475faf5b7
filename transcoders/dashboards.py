"""Feature dashboards: `python -m transcoders.dashboards --transcoders default-plt`.

For every feature of a transcoder set, over a corpus (the bundled task corpus by default, a `.txt`
of one text per line, or a `.npy` of token ids [n_seq, n_ctx]), one streaming pass computes:

1. Statistics over every counted position (all but position 0, the BOS attention sink): how often
   the feature is active (> 0), the smallest / largest / mean nonzero activation, and a histogram
   of nonzero activations in fixed log-spaced bins (so chunks add up exactly).
2. The `n_top` largest activations, each with a window of `before + 1 + after` tokens and the
   feature's activation on each of them. Ties are broken by the earlier token, so the result does
   not depend on the chunk size: candidates are ranked by one int64 key (the float's bits, then the
   token index), and each chunk merges into the per-feature state by a segmented top-k.
3. A uniform sample of `reservoir` active positions per feature (the `reservoir` smallest values of
   a hash of (token index, feature), merged the same way), split at the end into `n_quantiles`
   equal-count bins of activation; `n_per_quantile` examples of each bin are kept (evenly spaced
   in the bin), with their bounds (sample quantiles).
4. Direct-path logits: the feature's decoder through the unembedding, `d @ W_U` with no final
   LayerNorm, where `d` is `W_dec[l][f]` for a per-layer transcoder or SAE, and for a cross-layer
   transcoder the *sum* of its decoders over every layer it writes (each MLP output adds to the
   residual stream, so the sum is its total direct effect); `n_logits` largest and smallest.
5. An automatic label: the (at most two) tokens carrying most activation among the top examples,
   then the top direct-path logit token: `"Mary"/"John" -> Mary` (dead features: "dead");
   computed from the stored examples when the file is read (`dashboard_file.auto_labels`).

Memory is bounded: the state is per feature (`n_features * ((n_top + reservoir) * (16 + 8 W) +
8 n_bins)` bytes) plus one chunk's activations; it does not grow with the corpus. Results go to one
HDF5 file per set (`dashboard_file.py`, written atomically, user labels kept), which stores the
example activations as float16 fractions of the feature's max and the per-token ones as uint8.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from transcoders.config import is_real, is_whole
from transcoders.config_cli import add_fields
from transcoders.dashboard_file import check_output, default_path, write_dashboards
from transcoders.errors import ConfigError
from transcoders.fingerprint import fingerprint

LOW32 = (1 << 32) - 1


@dataclass(frozen=True)
class DashboardConfig:
    transcoders: str = "default-plt"
    """The transcoder set: "default-plt", "default-clt" or a folder in a format load_transcoders reads."""
    model: str = "default"
    """The bundled model ("default"), a model folder, or a TransformerLens name."""
    corpus: str = "bundled"
    """"bundled" (the task corpus), a .npy of token ids [n_seq, n_ctx], or a .txt of one text per line."""
    n_tokens: int = 100_000
    """Corpus tokens to read (whole sequences of n_ctx; fewer if the corpus ends first)."""
    seed: int = 1
    """Seed of the bundled corpus stream (training used 0)."""
    chunk_seqs: int = 16
    """Sequences per chunk (memory: one chunk's activations; results do not depend on it)."""
    n_top: int = 4
    """Largest activations kept per feature, with their contexts."""
    n_quantiles: int = 3
    """Activation-quantile bins of the sampled examples."""
    n_per_quantile: int = 1
    """Examples kept per quantile bin."""
    reservoir: int = 24
    """Active positions sampled uniformly per feature, from which the quantile examples are drawn."""
    before: int = 4
    """Context tokens before the active token."""
    after: int = 0
    """Context tokens after the active token (a feature of a causal model cannot see them)."""
    n_logits: int = 4
    """Top and bottom direct-path logits kept per feature."""
    n_bins: int = 24
    """Histogram bins, log-spaced over [hist_min, hist_max] (values outside go to the end bins)."""
    hist_min: float = 1e-3
    """Lower edge of the histogram."""
    hist_max: float = 1e3
    """Upper edge of the histogram."""
    out: str = ""
    """The HDF5 file written (default: dashboards.h5 in the transcoder set's folder)."""
    progress: bool = True
    """Show a progress bar."""

    def __post_init__(self):
        positive = ("n_tokens", "chunk_seqs", "n_top", "n_quantiles", "n_per_quantile", "n_logits", "n_bins")
        for name in (*positive, "reservoir", "before", "after", "seed"):
            value = getattr(self, name)
            if not is_whole(value):
                raise ConfigError(f"{name} is {value!r}; pass an integer.")
        for name in positive:
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} is {getattr(self, name)}; it must be at least 1.")
        if self.reservoir < self.n_quantiles * self.n_per_quantile:
            raise ConfigError(
                f"reservoir {self.reservoir} is below n_quantiles * n_per_quantile "
                f"({self.n_quantiles * self.n_per_quantile}); raise it."
            )
        if self.before < 0 or self.after < 0:
            raise ConfigError("before and after must be >= 0; pass context lengths.")
        if (
            not (is_real(self.hist_min) and is_real(self.hist_max))
            or not 0 < self.hist_min < self.hist_max < math.inf
        ):
            raise ConfigError(
                f"histogram range [{self.hist_min}, {self.hist_max}] is empty or not finite; pass finite 0 < min < max."
            )

    @property
    def window(self) -> int:
        return self.before + 1 + self.after


# ---------------------------------------------------------------------- keys and selection
def _float_bits(x: Tensor) -> Tensor:
    """int64 whose order is the order of the (non-negative) float32 values `x`."""
    return x.float().contiguous().view(torch.int32).long()


def _hash(index: Tensor, feature: Tensor, n_features: int) -> Tensor:
    """A deterministic 31-bit hash of (token index, feature) (no int64 overflow)."""
    x = (index * n_features + feature) & LOW32
    for mult in (0x5BD1E995, 0x27D4EB2D):
        x = ((x ^ (x >> 15)) * mult) & LOW32
    return (x ^ (x >> 13)) & 0x7FFFFFFF


def segmented_topk(segment: Tensor, key: Tensor, k: int, n_segments: int) -> Tensor:
    """[n_segments, k] positions into `key` of each segment's `k` largest keys (descending), -1 padded."""
    out = torch.full((n_segments, k), -1, dtype=torch.long)
    if key.numel() == 0:
        return out
    order = torch.argsort(key, descending=True, stable=True)
    order = order[torch.argsort(segment[order], stable=True)]
    seg = segment[order]
    counts = torch.bincount(seg, minlength=n_segments)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(len(seg)) - starts[seg]
    keep = rank < k
    out[seg[keep], rank[keep]] = order[keep]
    return out


class _Selection:
    """Per feature, the `k` entries of largest int64 key seen so far, with their contexts."""

    def __init__(self, n_features: int, k: int, window: int):
        self.F, self.k = n_features, k
        self.key = torch.full((n_features, k), -1, dtype=torch.long)
        self.act = torch.zeros(n_features, k)
        self.index = torch.full((n_features, k), -1, dtype=torch.long)
        self.tokens = torch.full((n_features, k, window), -1, dtype=torch.int32)
        self.token_acts = torch.zeros(n_features, k, window)

    def merge(self, feat: Tensor, key: Tensor, act: Tensor, index: Tensor, context) -> None:
        """Merge new candidates (1-D, one per (position, feature)); `context(sel)` gives the
        (tokens, token_acts) windows of the selected new candidates."""
        old = self.key.flatten() >= 0
        old_pos = old.nonzero().squeeze(1)
        n_old = len(old_pos)
        old_feat = old_pos // self.k
        sel = segmented_topk(
            torch.cat([old_feat, feat]), torch.cat([self.key.flatten()[old_pos], key]), self.k, self.F
        )
        filled = sel >= 0
        from_old = filled & (sel < n_old)
        from_new = filled & (sel >= n_old)
        key_, act_, index_ = self.key.clone(), self.act.clone(), self.index.clone()
        tok_, tact_ = self.tokens.clone(), self.token_acts.clone()
        flat = lambda t: t.flatten(0, 1)  # noqa: E731
        src = old_pos[sel[from_old]]
        for new_t, old_t in ((key_, self.key), (act_, self.act), (index_, self.index)):
            new_t[from_old] = flat(old_t)[src]
        tok_[from_old], tact_[from_old] = flat(self.tokens)[src], flat(self.token_acts)[src]
        new = sel[from_new] - n_old
        key_[from_new], act_[from_new], index_[from_new] = key[new], act[new], index[new]
        tok_[from_new], tact_[from_new] = context(new)
        key_[~filled], index_[~filled] = -1, -1
        self.key, self.act, self.index, self.tokens, self.token_acts = key_, act_, index_, tok_, tact_


class DashboardAccumulator:
    """The streaming state; `update(tokens, acts)` per chunk of whole sequences, `result()` at the end."""

    def __init__(self, n_layers: int, d_sae: int, cfg: DashboardConfig):
        self.L, self.S, self.cfg = n_layers, d_sae, cfg
        F = self.F = n_layers * d_sae
        self.count = torch.zeros(F, dtype=torch.long)
        self.sum = torch.zeros(F, dtype=torch.float64)
        self.min = torch.full((F,), float("inf"))
        self.max = torch.zeros(F)
        self.edges = torch.logspace(np.log10(cfg.hist_min), np.log10(cfg.hist_max), cfg.n_bins + 1)
        self.hist = torch.zeros(F * cfg.n_bins, dtype=torch.long)
        self.top = _Selection(F, cfg.n_top, cfg.window)
        self.sample = _Selection(F, cfg.reservoir, cfg.window)
        self.n_seqs = 0
        self.n_tokens = 0
        self.n_counted = 0

    def state_bytes(self) -> int:
        tensors = [self.count, self.sum, self.min, self.max, self.hist]
        for s in (self.top, self.sample):
            tensors += [s.key, s.act, s.index, s.tokens, s.token_acts]
        return sum(t.numel() * t.element_size() for t in tensors)

    @torch.no_grad()
    def update(self, tokens: Tensor, acts: Tensor) -> None:
        """`tokens` [B, n_ctx] (the next B sequences of the corpus), `acts` [B, n_ctx, L, S]."""
        cfg = self.cfg
        B, T = tokens.shape
        acts = acts.reshape(B, T, self.F).float()
        counted = acts[:, 1:]  # position 0 (BOS) is not counted
        b, p, f = (counted > 0).nonzero(as_tuple=True)
        p = p + 1
        a = acts[b, p, f]
        seq = b + self.n_seqs
        index = seq * T + p
        self.n_seqs += B
        self.n_tokens += B * T
        self.n_counted += B * (T - 1)
        self.count += torch.bincount(f, minlength=self.F)
        self.sum.index_add_(0, f, a.double())
        self.min.scatter_reduce_(0, f, a, "amin")
        self.max.scatter_reduce_(0, f, a, "amax")
        bins = (torch.bucketize(a, self.edges[1:-1], right=True)).long()
        self.hist += torch.bincount(f * cfg.n_bins + bins, minlength=self.F * cfg.n_bins)
        offsets = torch.arange(-cfg.before, cfg.after + 1)

        def context(sel: Tensor):
            pp = p[sel, None] + offsets
            ok = (pp >= 0) & (pp < T)
            pc = pp.clamp(0, T - 1)
            toks = torch.where(ok, tokens[b[sel, None], pc], -1).to(torch.int32)
            tacts = torch.where(ok, acts[b[sel, None], pc, f[sel, None]], 0.0) + 0.0  # no -0.0
            return toks, tacts

        tiebreak = LOW32 - index  # earlier tokens first
        self.top.merge(f, (_float_bits(a) << 32) | tiebreak, a, index, context)
        rand = _hash(index, f, self.F)
        self.sample.merge(f, ((0x7FFFFFFF - rand) << 32) | tiebreak, a, index, context)

    def result(self) -> tuple[dict[str, np.ndarray], dict]:
        """The arrays of the dashboards file (see dashboard_file.py), less vocab, logits and labels."""
        cfg, L, S = self.cfg, self.L, self.S
        shape = lambda t, *rest: t.reshape(L, S, *rest).numpy()  # noqa: E731
        count = self.count
        out = {
            "stats/count": shape(count),
            "stats/min": shape(torch.where(count > 0, self.min, 0.0)),
            "stats/max": shape(self.max),
            "stats/mean": shape((self.sum / count.clamp(min=1)).float()),
            "hist/edges": self.edges.numpy().astype(np.float32),
            "hist/counts": shape(self.hist.to(torch.int32), cfg.n_bins),
            "top/act": shape(self.top.act, cfg.n_top),
            "top/index": shape(self.top.index, cfg.n_top),
            "top/tokens": shape(self.top.tokens, cfg.n_top, cfg.window),
            "top/token_acts": shape(self._quantize(self.top.token_acts), cfg.n_top, cfg.window),
        }
        out.update(self._quantiles())
        return out, {"n_tokens": self.n_tokens, "n_counted": self.n_counted}

    def _quantize(self, token_acts: Tensor) -> Tensor:
        """uint8 per-token activations, in units of the feature's max / 255 (`dequantize` undoes it)."""
        scale = self.max.clamp(min=1e-30).reshape(self.F, *[1] * (token_acts.dim() - 1))
        return (token_acts.clamp(min=0) / scale * 255).round().clamp(0, 255).to(torch.uint8)

    def _quantiles(self) -> dict[str, np.ndarray]:
        """Sort each feature's sample by activation, cut into equal-count bins, take evenly spaced ones."""
        cfg, s = self.cfg, self.sample
        Q, P, R = cfg.n_quantiles, cfg.n_per_quantile, cfg.reservoir
        n = (s.index >= 0).sum(1)  # sampled per feature
        act = torch.where(s.index >= 0, s.act, float("inf"))
        order = torch.argsort(act, dim=1, stable=True)  # ascending, empties last
        q = torch.arange(Q)
        lo = (q[None] * n[:, None]) // Q  # [F, Q] bin starts
        hi = ((q[None] + 1) * n[:, None]) // Q
        j = torch.arange(P)
        pos = lo[..., None] + ((hi - lo)[..., None] * (2 * j + 1)) // (2 * P)  # [F, Q, P]
        valid = pos < hi[..., None]
        valid[..., 1:] &= pos[..., 1:] != pos[..., :-1]  # a bin smaller than P: each example once
        rows = torch.arange(self.F)[:, None, None]
        pick = order[rows, pos.clamp(max=R - 1)]
        take = lambda t: t[rows, pick]  # noqa: E731
        a, idx = torch.where(valid, take(s.act), 0.0), torch.where(valid, take(s.index), -1)
        toks = torch.where(valid[..., None], take(s.tokens), -1)
        tacts = torch.where(valid[..., None], take(s.token_acts), 0.0)
        sorted_act = torch.gather(torch.where(s.index >= 0, s.act, 0.0), 1, order)
        edge = torch.cat([lo, hi[:, -1:]], 1)  # [F, Q + 1]
        bounds = torch.gather(sorted_act, 1, (edge - (edge == n[:, None]).long()).clamp(min=0, max=R - 1))
        bounds = torch.where(n[:, None] > 0, bounds, 0.0)
        L, S, W = self.L, self.S, cfg.window
        return {
            "quantile/act": a.reshape(L, S, Q, P).numpy(),
            "quantile/index": idx.reshape(L, S, Q, P).numpy(),
            "quantile/tokens": toks.reshape(L, S, Q, P, W).numpy(),
            "quantile/token_acts": self._quantize(tacts).reshape(L, S, Q, P, W).numpy(),
            "quantile/bounds": bounds.reshape(L, S, Q + 1).numpy(),
        }


# ---------------------------------------------------------------------- logits and labels
def direct_vectors(tc) -> Tensor:
    """[n_layers, d_sae, d_model] each feature's direct write into the residual stream: its decoder
    (per-layer transcoder, SAE) or the sum of its decoders over the layers it writes (cross-layer)."""
    with torch.no_grad():
        if tc.cfg.kind == "clt":
            return torch.stack([W.sum(1) for W in tc.W_dec]).float()
        return tc.W_dec.float()


def direct_logits(tc, W_U: Tensor, n: int) -> dict[str, np.ndarray]:
    """Top and bottom `n` of `direct_vectors(tc) @ W_U` per feature."""
    with torch.no_grad():
        logits = direct_vectors(tc) @ W_U.float().to(tc.W_enc.device)
    top = logits.topk(min(n, logits.shape[-1]), dim=-1)
    bottom = logits.topk(min(n, logits.shape[-1]), dim=-1, largest=False)
    return {
        "logits/top_tokens": top.indices.int().cpu().numpy(),
        "logits/top_values": top.values.half().cpu().numpy(),
        "logits/bottom_tokens": bottom.indices.int().cpu().numpy(),
        "logits/bottom_values": bottom.values.half().cpu().numpy(),
    }


def vocab_strings(model) -> np.ndarray:
    tok = model.tokenizer
    n = model.cfg.d_vocab
    if tok is None:
        return np.array([str(i) for i in range(n)], dtype=object)
    return np.array([tok.decode([i]) for i in range(n)], dtype=object)


# ---------------------------------------------------------------------- the pass
def _chunks(sequences, chunk_seqs: int, max_seqs: int):
    """Tensors [<= chunk_seqs, n_ctx] of the first `max_seqs` sequences of `sequences`
    (a tensor, or a callable / iterable of token-id lists)."""
    if isinstance(sequences, Tensor | np.ndarray):
        seqs = torch.as_tensor(sequences)[:max_seqs].long()
        yield from seqs.split(chunk_seqs)
        return
    it = iter(sequences() if callable(sequences) else sequences)
    taken, buf = 0, []
    for s in it:
        if taken >= max_seqs:
            break
        buf.append(s)
        taken += 1
        if len(buf) == chunk_seqs:
            yield torch.tensor(buf)
            buf = []
    if buf:
        yield torch.tensor(buf)


@torch.no_grad()
def accumulate(model, tc, sequences, cfg: DashboardConfig) -> DashboardAccumulator:
    """Run the streaming pass over `sequences` (see `_chunks`)."""
    from tqdm import tqdm

    from transcoders.sites import collect

    n_ctx = model.cfg.n_ctx
    n_seqs = -(-cfg.n_tokens // n_ctx)
    acc = DashboardAccumulator(tc.cfg.n_layers, tc.cfg.d_sae, cfg)
    bar = tqdm(total=n_seqs * n_ctx, disable=not cfg.progress, desc="dashboards", unit="tok", mininterval=2.0)
    for tokens in _chunks(sequences, cfg.chunk_seqs, n_seqs):
        x, _ = collect(model, tokens.to(tc.W_enc.device), tc.cfg)
        acts = tc.activation(tc.encode(x.to(tc.dtype)))
        acc.update(tokens.cpu(), acts.cpu())
        bar.update(tokens.numel())
    bar.close()
    return acc


def compute_dashboards(
    cfg: DashboardConfig | None = None,
    model=None,
    tc=None,
    sequences=None,
    out: str | Path | None = None,
    **kw,
) -> Path:
    """Compute every feature's dashboard and write the HDF5 file; returns its path.

    `cfg` (or keyword fields of `DashboardConfig`) says what; `model` / `tc` / `sequences` override
    `cfg.model` / `cfg.transcoders` / `cfg.corpus` (tests pass tiny ones; `sequences` is a tensor
    [n_seq, n_ctx] or an iterable of token-id lists); `out` overrides `cfg.out`."""
    cfg = dataclasses.replace(cfg or DashboardConfig(), **kw)
    t0 = time.time()
    out = Path(out or cfg.out or default_path(cfg.transcoders))
    check_output(out)  # a folder, a graph file or an unwritable place: before anything loads
    if sequences is None:
        from transcoders.train_config import check_corpus

        check_corpus(cfg.corpus)  # no file, no token ids, no text: before the model loads
    if model is None:
        from transcoders.train import load_any_model

        model = load_any_model(cfg.model)
    if tc is None:
        from transcoders import check_fits, load_transcoders

        tc = load_transcoders(cfg.transcoders)
        check_fits(model, tc)
    # another set's dashboards there (or its user labels): refused before the pass
    set_fingerprint = fingerprint(tc)
    check_output(out, (tc.cfg.kind, tc.cfg.n_layers, tc.cfg.d_sae), set_fingerprint)
    tc.eval()
    if sequences is None:
        from transcoders.train import sequence_source

        sequences = sequence_source(model, cfg.corpus, cfg.seed)
    acc = accumulate(model, tc, sequences, cfg)
    data, counts = acc.result()
    if counts["n_tokens"] == 0:  # nothing to show: no file of empty dashboards
        raise ConfigError(
            f"the corpus gave no sequence of {model.cfg.n_ctx} tokens (corpus {cfg.corpus!r}); pass a longer one."
        )
    vocab = vocab_strings(model)
    data["vocab"] = vocab
    data.update(direct_logits(tc, model.W_U.detach(), cfg.n_logits))
    token_dtype = np.int16 if len(vocab) < 2**15 else np.int32
    for name in ("top/tokens", "quantile/tokens", "logits/top_tokens", "logits/bottom_tokens"):
        data[name] = data[name].astype(token_dtype)
    for name in ("top/index", "quantile/index"):  # the token indices stay in memory: the file stays small
        del data[name]
    attrs = {
        "transcoders": cfg.transcoders,
        "transcoder_fingerprint": set_fingerprint,  # which set: a graph's provenance records the same
        "kind": tc.cfg.kind,
        "n_layers": tc.cfg.n_layers,
        "d_sae": tc.cfg.d_sae,
        "corpus": cfg.corpus,
        "before": cfg.before,
        "after": cfg.after,
        "config": dataclasses.asdict(cfg),
        "direct_path": "sum over output layers of W_dec @ W_U"
        if tc.cfg.kind == "clt"
        else "W_dec @ W_U (no final LayerNorm)",
        "state_bytes": acc.state_bytes(),
        "wall_s": round(time.time() - t0, 2),
        **counts,
    }
    return write_dashboards(out, data, attrs)


# ---------------------------------------------------------------------- command line
def build_parser() -> argparse.ArgumentParser:
    return add_fields(
        argparse.ArgumentParser(prog="python -m transcoders.dashboards", description=__doc__.split("\n")[0]),
        DashboardConfig,
    )


def main(argv: list[str] | None = None) -> int:
    import os

    from transcoders.command import INTERRUPTED, close_progress_bars, interrupt_once, restore_interrupt
    from transcoders.errors import AttrgraphError  # the root of both packages' errors

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
    previous = interrupt_once()
    try:
        fields = {f.name for f in dataclasses.fields(DashboardConfig)}
        path = compute_dashboards(DashboardConfig(**{k: v for k, v in vars(args).items() if k in fields}))
    except AttrgraphError as e:
        close_progress_bars()
        print(f"transcoders.dashboards: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # the file is written atomically (dashboard_file.atomic_h5)
        close_progress_bars()
        print("transcoders.dashboards: interrupted; no dashboards file was changed.", file=sys.stderr)
        return INTERRUPTED
    finally:
        restore_interrupt(previous)
    print(f"wrote {path} ({path.stat().st_size / 1e3:.0f} kB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

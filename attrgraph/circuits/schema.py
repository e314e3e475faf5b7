"""Dataset schemas: named spans that align positions across examples (PEAP seed sec. 3.3-4).

1. A schema names spans (e.g. BOS, IO, S1, S1+1, S2, END) and, per example, the
   span of every token position: `span_index[b, t]` in 0..n_spans-1 (-1 for padding
   after the prompt). A span may be empty in an example.
2. Aggregation of per-example positional scores (eap.example_scores):
   residual edge (s, u, d) <- combine over t in span s;
   attention edge (s, s') <- combine over pairs t in s, t' in s' with t' <= t;
   combine = "avg", "sum" or "maxabs" (the signed value of largest magnitude);
   then the mean over the examples where the span (pair) occurs.
3. Files: JSON {"spans": [...], "examples": [{"IO": [start, end], ...}, ...]} or a
   CSV with columns example,span,start,end; start/end are token positions of the
   model input (BOS = 0), end exclusive. Every prompt position must be covered once.
4. Automatic proposal (our stand-in for the seed's LLM step, documented rule):
   BOS and END (the scored position) are spans; positions where clean and corrupted
   tokens differ form CHANGED; earlier positions repeating a changed clean token form
   CHANGED_ECHO; positions holding the answer token form ANSWER_ECHO; of the other
   positions, a token gets its own span "tok:X" when it appears in at least half the
   examples and, in at least half of those, its saliency (sum of |edge scores| at that
   position) ranks in the example's top `top_frac`; every remaining run of positions
   becomes the gap span named after the span before it ("after:X"). A held-out set
   reuses the discovery set's salient tokens; `align_schema` maps its spans onto a
   circuit's (span index -2: a span the circuit lacks, ablated).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path

import torch
from jaxtyping import Int
from torch import Tensor

from attrgraph.errors import OptionError, SchemaError
from transcoders.arguments import shown

AGGREGATIONS = ("avg", "sum", "maxabs")


@dataclass(frozen=True)
class Schema:
    """Span names and the span of each token position in each example."""

    spans: tuple[str, ...]
    """Span names, in a fixed order."""
    span_index: Int[Tensor, "batch pos"]
    """Span of each position (-1 = padding)."""

    def __post_init__(self):
        if self.span_index.numel() and int(self.span_index.max()) >= len(self.spans):
            raise SchemaError(
                f"span_index refers to span {int(self.span_index.max())} but only {len(self.spans)} exist."
            )

    @classmethod
    def from_ranges(cls, spans, examples: list[dict], lengths: list[int]) -> Schema:
        """Build from per-example {span: (start, end)} ranges; `lengths` are the prompt lengths."""
        spans = tuple(spans)
        if len(examples) != len(lengths):
            raise SchemaError(f"the schema has {len(examples)} examples but the data {len(lengths)}.")
        idx = torch.full((len(examples), max(lengths)), -1, dtype=torch.long, device="cpu")
        for b, (ranges, n) in enumerate(zip(examples, lengths, strict=True)):
            for name, (start, end) in ranges.items():
                if name not in spans:
                    raise SchemaError(
                        f"example {b} names span {name!r}, which is not among the schema's spans {spans}."
                    )
                if not 0 <= start <= end <= n:
                    raise SchemaError(
                        f"example {b}: span {name!r} = [{start}, {end}) lies outside its {n} positions."
                    )
                if bool((idx[b, start:end] >= 0).any()):
                    raise SchemaError(
                        f"example {b}: span {name!r} overlaps another span; spans must be disjoint."
                    )
                idx[b, start:end] = spans.index(name)
            if bool((idx[b, :n] < 0).any()):
                missing = (idx[b, :n] < 0).nonzero().flatten().tolist()
                raise SchemaError(
                    f"example {b}: positions {missing[:5]} belong to no span; cover every position once."
                )
        return cls(spans, idx)

    def check(self, last: Tensor) -> None:
        if self.span_index.shape[0] != last.shape[0]:
            raise SchemaError(
                f"the schema has {self.span_index.shape[0]} examples but the data {last.shape[0]}."
            )


def read_schema(path: str | Path, lengths: list[int]) -> Schema:
    """Read a schema from JSON or CSV (module docstring, step 3); a file that is missing or not
    such a schema raises `SchemaError` in one line."""
    path = Path(path)
    if not path.is_file():
        raise SchemaError(f"schema file {path} does not exist or is not a file; {_SCHEMA_FORMAT}")
    try:
        return _read_json(path, lengths) if path.suffix == ".json" else _read_csv(path, lengths)
    except SchemaError:
        raise
    except (
        OSError,
        UnicodeDecodeError,
        json.JSONDecodeError,
        KeyError,
        TypeError,
        ValueError,
        AttributeError,
    ) as e:
        reason = str(e).splitlines()[0][:200] if str(e) else "no detail"
        raise SchemaError(
            f"{path} is not a schema ({type(e).__name__}: {reason}); {_SCHEMA_FORMAT}"
        ) from None


_SCHEMA_FORMAT = (
    'pass JSON {"spans": [...], "examples": [{"SPAN": [start, end], ...}, ...]} or a CSV with the '
    "columns example,span,start,end (end exclusive)."
)


def _read_json(path: Path, lengths: list[int]) -> Schema:
    data = json.loads(path.read_text(encoding="utf-8"))
    examples = [{k: tuple(v) for k, v in e.items()} for e in data["examples"]]
    for b, e in enumerate(examples):
        for name, r in e.items():
            if len(r) != 2 or not all(isinstance(x, int) and not isinstance(x, bool) for x in r):
                raise SchemaError(
                    f"{path}: example {b}, span {name!r} is {list(r)}, not [start, end] in whole token "
                    f"positions; {_SCHEMA_FORMAT}"
                )
    return Schema.from_ranges(data["spans"], examples, lengths)


def _read_csv(path: Path, lengths: list[int]) -> Schema:
    with path.open(encoding="utf-8", newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows or not {"example", "span", "start", "end"} <= set(rows[0]):
        raise SchemaError(f"{path} needs the CSV columns example,span,start,end.")
    spans = tuple(dict.fromkeys(r["span"] for r in rows))
    examples: list[dict] = [{} for _ in lengths]
    for r in rows:
        b = int(r["example"])
        if not 0 <= b < len(lengths):
            raise SchemaError(
                f"{path}: example {b} does not exist; the data has examples 0-{len(lengths) - 1}."
            )
        examples[b][r["span"]] = (int(r["start"]), int(r["end"]))
    return Schema.from_ranges(spans, examples, lengths)


def write_schema_json(schema: Schema, path: str | Path) -> None:
    examples = []
    for row in schema.span_index.tolist():
        ranges: dict[str, list[int]] = {}
        for t, s in enumerate(row):
            if s >= 0:
                name = schema.spans[s]
                ranges[name] = [ranges.get(name, [t])[0], t + 1]
        examples.append(ranges)
    Path(path).write_text(json.dumps({"spans": list(schema.spans), "examples": examples}, indent=1))


def _combine(x: Tensor, member: Tensor, how: str) -> Tensor:
    """Combine x[b, n, ...] over n where member[b, n, k] (bool) -> [b, k, ...]."""
    m = member.to(x.dtype)
    if how == "maxabs":
        xs = x.unsqueeze(2).expand(-1, -1, member.shape[2], *x.shape[2:])
        mask = member.view(*member.shape, *([1] * (x.dim() - 2)))
        mag = torch.where(mask, xs.abs(), torch.full_like(xs, -1.0))
        pick = mag.argmax(1, keepdim=True)
        return torch.gather(xs, 1, pick).squeeze(1) * mask.any(1).to(x.dtype)
    total = torch.einsum("bn...,bnk->bk...", x, m)
    if how == "sum":
        return total
    count = m.sum(1).clamp(min=1)
    return total / count.view(*count.shape, *([1] * (x.dim() - 2)))


def check_schema(schema) -> None:
    """`OptionError` in one line unless `schema` is a `Schema` or None."""
    if schema is not None and not isinstance(schema, Schema):
        raise OptionError(
            f"schema is a {type(schema).__name__} ({shown(schema)}), not a Schema; make one with "
            "ioi_schema(examples) or read_schema(path, lengths), or pass None."
        )


def aggregate(example, schema: Schema, how: str = "avg"):
    """Span-level scores from per-example positional ones (module docstring, step 2).

    Returns (resid `[n_spans n_up n_down]`, attn `[n_layers n_heads 3 n_spans n_spans]`, attn_valid).
    """
    if how not in AGGREGATIONS:
        raise OptionError(f"aggregation {how!r} is unknown; use one of {AGGREGATIONS}.")
    idx = schema.span_index
    B, T = example.resid.shape[:2]
    idx = idx[:, :T]
    S = len(schema.spans)
    member = idx[:, :, None] == torch.arange(S, device=idx.device)  # [b t s]
    present = member.any(1).to(example.resid.dtype)  # [b s]
    resid = _combine(example.resid, member, how)  # [b s u d]
    resid = (resid * present[:, :, None, None]).sum(0) / present.sum(0).clamp(min=1)[:, None, None]
    causal = torch.ones(T, T, dtype=torch.bool, device=idx.device).tril()
    pair = member[:, :, None, :, None] & member[:, None, :, None, :] & causal[None, :, :, None, None]
    pair = pair.reshape(B, T * T, S * S)  # [b (t t') (s s')]
    attn = example.attn.reshape(*example.attn.shape[:4], T * T).movedim(-1, 1)  # [b (t t') l h 3]
    attn = _combine(attn, pair, how)  # [b (s s') l h 3]
    pres = pair.any(1).to(attn.dtype)
    attn = (attn * pres[:, :, None, None, None]).sum(0) / pres.sum(0).clamp(min=1)[:, None, None, None]
    attn = attn.movedim(0, -1).reshape(*attn.shape[1:], S, S)
    return resid, attn, pres.sum(0).reshape(S, S) > 0


def ioi_schema(examples) -> Schema:
    """A hand-written IOI schema after Wang et al. (2022): BOS, prefix, IO, and, S1, mid, S2, post, END.

    Every template reads "... [first] and [second] ... [S2] ... to [IO]", so the two names
    and "and" sit at fixed offsets; Wang's S1+1 is "and" (BABA) or the first "mid" token
    (ABBA). Positions count the BOS token (model position = word index + 1).
    """
    spans = ("BOS", "prefix", "IO", "and", "S1", "mid", "S2", "post", "END")
    ranges, lengths = [], []
    for ex in examples:
        n = ex.graded[0] + 1  # BOS + the prompt's words
        f = ex.tokens.index(ex.meta["io"] if ex.meta["order"] == "ABBA" else ex.meta["s"]) + 1
        io, s1 = (f, f + 2) if ex.meta["order"] == "ABBA" else (f + 2, f)
        s2 = ex.meta["s2_pos"] + 1
        ranges.append(
            {
                "BOS": (0, 1),
                "prefix": (1, f),
                "IO": (io, io + 1),
                "and": (f + 1, f + 2),
                "S1": (s1, s1 + 1),
                "mid": (f + 3, s2),
                "S2": (s2, s2 + 1),
                "post": (s2 + 1, n - 1),
                "END": (n - 1, n),
            }
        )
        lengths.append(n)
    return Schema.from_ranges(spans, ranges, lengths)


def propose_schema(
    pairs, example, tokens: list[list[str]] | None = None, top_frac: float = 0.3, salient_tokens=None
) -> Schema:
    """Saliency-guided automatic spans (module docstring, step 4).

    tokens: the token strings of each prompt (BOS included), used to name token spans.
    salient_tokens: reuse the salient-token set of another schema (e.g. the discovery set's,
        from `salient_token_set`) so that a held-out set gets the same kinds of spans.
    """
    clean, corrupt, last = pairs.clean.tolist(), pairs.corrupt.tolist(), pairs.last.tolist()
    answer = pairs.weights.argmax(-1).tolist()
    words = tokens or [[str(i) for i in row] for row in clean]
    if salient_tokens is None:
        salient_tokens = salient_token_set(pairs, example, words, top_frac)
    roles = []
    for b in range(len(clean)):
        n = last[b] + 1
        changed = {t for t in range(n) if clean[b][t] != corrupt[b][t]}
        changed_tok = {clean[b][t] for t in changed}
        role = []
        for t in range(n):
            if t == 0:
                r = "BOS"
            elif t == n - 1:
                r = "END"
            elif t in changed:
                r = "CHANGED"
            elif clean[b][t] in changed_tok:
                r = "CHANGED_ECHO"
            elif clean[b][t] == answer[b]:
                r = "ANSWER_ECHO"
            elif words[b][t] in salient_tokens:
                r = f"tok:{words[b][t]}"
            else:
                r = "after:" + (
                    role[-1][6:] if role and role[-1].startswith("after:") else role[-1] if role else "BOS"
                )
            role.append(r)
        roles.append(role)
    spans = tuple(dict.fromkeys(r for role in roles for r in role))
    idx = torch.full(pairs.clean.shape, -1, dtype=torch.long, device="cpu")
    for b, role in enumerate(roles):
        idx[b, : len(role)] = torch.tensor([spans.index(r) for r in role], device="cpu")
    return Schema(spans, idx)


def salient_token_set(pairs, example, words: list[list[str]], top_frac: float = 0.3) -> frozenset[str]:
    """Tokens that rank in their example's top `top_frac` saliency in at least half the examples holding them."""
    sal = (
        example.resid.abs().sum((2, 3))
        + example.attn.abs().sum((1, 2, 3, 4))
        + example.attn.abs().sum((1, 2, 3, 5))
    )
    held: dict[str, int] = {}
    top_count: dict[str, int] = {}
    for b, row in enumerate(words):
        n = int(pairs.last[b]) + 1
        top = set(sal[b, :n].topk(max(1, round(top_frac * n))).indices.tolist())
        for t, w in enumerate(row[:n]):
            held[w] = held.get(w, 0) + 1
            top_count[w] = top_count.get(w, 0) + (t in top)
    return frozenset(w for w in held if 2 * top_count[w] >= held[w] and 2 * held[w] >= len(words))


def align_schema(schema: Schema, spans: tuple[str, ...]) -> Schema:
    """Re-index `schema` onto `spans` (a circuit's); positions in spans it lacks get -2 (ablated)."""
    lookup = torch.tensor(
        [spans.index(s) if s in spans else -2 for s in schema.spans] + [-1], device=schema.span_index.device
    )
    return Schema(spans, lookup[schema.span_index])

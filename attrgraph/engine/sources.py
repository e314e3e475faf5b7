"""What every attribution method shares: source nodes, target injections, the node table, provenance.

1. Sources (`build_sources`): in node order, an embedding node per position, an error node per
   (layer, position >= n_excluded), and a feature node per active (layer, position, feature); each
   feature's output vectors `a_s * W_dec_s^l` (one per written layer for a CLT) grouped by
   (layer, position). With an attention set (replacement.py step 6) the MLP error nodes are
   followed by one attention error node per (layer, position >= n_excluded), and the features are
   ordered by (layer, site, position, feature) with the attention site before the MLP site of a
   layer (attention runs first in a block); attention features' vectors `a_s * W_dec_s` are
   grouped by (layer, position) apart (`attn_groups`).
2. Injections (`feature_injections`, and one per target): the vector each target's row is read
   against, and where it is read: a feature's encoder vector `W_enc[:, f]` at its layer's read
   site (an attention feature's at its layer's attention output, `site="attn"`), a logit's
   `e_tok - 1/V` on the logits, a custom direction at its hook.
3. The node table (`node_table`) and the provenance record (`graph_provenance`) every method
   stores with its graph.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
from jaxtyping import Float, Int
from torch import Tensor

from attrgraph.engine.precision import compute_dtype
from attrgraph.engine.replacement import ReplacementModel, ReplacementState
from attrgraph.engine.targets import Target, token_str
from attrgraph.errors import OptionError, PromptError, PromptWarning
from attrgraph.graph.graph import Nodes
from transcoders.fingerprint import fingerprint

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer


@dataclass
class Sources:
    """Output vectors of every source node, in node order."""

    embed: Float[Tensor, "n_pos d_model"]
    """Embedding nodes' vectors (columns 0..n_pos-1)."""
    errors: Float[Tensor, "n_layers n_pos d_model"]
    """Error vectors; nodes exist for positions >= n_excluded, layer-major."""
    n_excluded: int
    """Positions without error or feature nodes."""
    features: Int[Tensor, "n_features 3"]
    """(layer, position, feature) of each feature node, sorted."""
    decoders: Float[Tensor, "n_features n_out d_model"] | list
    """Per (layer, position) group: `a_s * W_dec_s` [k, n_layers - layer (CLT) or 1, d_model]."""
    groups: list[tuple[int, int, int, int]]
    """(layer, position, first column, end column) of each MLP feature group."""
    attn_errors: Float[Tensor, "n_layers n_pos d_model"] | None = None
    """Attention error vectors (step 1; None without an attention set), after the MLP errors."""
    attn: Tensor | None = None
    """[n_features] bool: which features are attention features (None without an attention set)."""
    attn_groups: list[tuple[int, int, int, int]] = field(default_factory=list)
    """(layer, position, first column, end column) of each attention feature group."""
    attn_decoders: list = field(default_factory=list)
    """Per attention group: `a_s * W_dec_s` [k, 1, d_model]."""

    @property
    def n_errors(self) -> int:
        n = self.errors.shape[0] * (self.errors.shape[1] - self.n_excluded)
        return n if self.attn_errors is None else 2 * n

    def error_column(self, layer: int, site: str = "mlp") -> int:
        """Column of the error node of (layer, position n_excluded) at `site`; the layer's others follow."""
        L, P = self.errors.shape[:2]
        per_layer = P - self.n_excluded
        return P + (L if site == "attn" else 0) * per_layer + layer * per_layer

    def feature_sites(self) -> np.ndarray:
        """[n_features] "attn" or "mlp"."""
        if self.attn is None:
            return np.full(len(self.features), "mlp")
        return np.where(self.attn.cpu().numpy(), "attn", "mlp")

    @property
    def n_columns(self) -> int:
        return self.embed.shape[0] + self.n_errors + len(self.features)


@dataclass
class Injection:
    """Where a target's input vector goes: a read site (`layer` >= 0), the logits, or a hook."""

    vector: Tensor
    position: int
    layer: int = -1
    hook: str | None = None
    logits: bool = False
    site: str = "mlp"
    """Read site of a feature target: "mlp" (the transcoders' read site) or "attn" (the attention output)."""


def build_sources(rm: ReplacementModel, state: ReplacementState) -> Sources:
    """Step 2 (sources) and the scaled decoders of step 5."""
    if rm.attn is not None:
        return _build_sources_with_attention(rm, state)
    L, P = state.acts.shape[:2]
    active = state.acts > 0
    features = active.nonzero()  # sorted by (layer, position, feature)
    offset = P + L * (P - state.n_excluded)
    decoders, groups = [], []
    dt = compute_dtype(state.errors.dtype)  # a * W_dec is not exact in a half-precision dtype (precision.py)
    if len(features):
        keys = features[:, 0] * P + features[:, 1]
        bounds = torch.cat(
            [
                torch.tensor([0], device=keys.device),
                (keys[1:] != keys[:-1]).nonzero()[:, 0] + 1,
                torch.tensor([len(keys)], device=keys.device),
            ]
        )
        # each group's (layer, position) in one read: a read per group waits for a GPU each time
        firsts, bounds = features[bounds[:-1], :2].tolist(), bounds.tolist()
        for (l, p), i0, i1 in zip(firsts, bounds[:-1], bounds[1:]):
            f = features[i0:i1, 2]
            a = state.acts[l, p, f].to(dt)
            with torch.no_grad():
                dec = rm.tc.decoder_vectors(l, f.to(rm.tc.device)).to(dt)
            decoders.append(dec * a[:, None, None])
            groups.append((l, p, offset + i0, offset + i1))
    return Sources(state.embed, state.errors, state.n_excluded, features, decoders, groups)


def _build_sources_with_attention(rm: ReplacementModel, state: ReplacementState) -> Sources:
    """Step 1 with an attention set: features in (layer, site, position, feature) order, attention
    site first; MLP and attention groups apart."""
    L, P = state.acts.shape[:2]
    parts = []
    for site, acts in ((0, state.attn_acts), (1, state.acts)):  # 0: attention, 1: MLP
        f = (acts > 0).nonzero()
        parts.append(torch.cat([f[:, :1], torch.full_like(f[:, :1], site), f[:, 1:]], 1))
    both = torch.cat(parts)  # (layer, site, position, feature)
    width = max(state.acts.shape[-1], state.attn_acts.shape[-1])
    key = ((both[:, 0] * 2 + both[:, 1]) * P + both[:, 2]) * width + both[:, 3]
    both = both[torch.argsort(key)]
    features, is_attn = both[:, [0, 2, 3]], both[:, 1] == 0
    n_err = L * (P - state.n_excluded)
    offset = P + 2 * n_err
    decoders, groups, attn_decoders, attn_groups = [], [], [], []
    dt = compute_dtype(state.errors.dtype)
    if len(both):
        keys = (both[:, 0] * 2 + both[:, 1]) * P + both[:, 2]
        bounds = torch.cat(
            [
                torch.tensor([0], device=keys.device),
                (keys[1:] != keys[:-1]).nonzero()[:, 0] + 1,
                torch.tensor([len(keys)], device=keys.device),
            ]
        )
        firsts, bounds = both[bounds[:-1], :3].tolist(), bounds.tolist()  # one read (as above)
        for (l, site, p), i0, i1 in zip(firsts, bounds[:-1], bounds[1:]):
            attn, f = site == 0, both[i0:i1, 3]
            tc, acts = (rm.attn, state.attn_acts) if attn else (rm.tc, state.acts)
            with torch.no_grad():
                dec = tc.decoder_vectors(l, f.to(tc.device)).to(dt)  # as build_sources: at least float32
            (attn_decoders if attn else decoders).append(dec * acts[l, p, f].to(dt)[:, None, None])
            (attn_groups if attn else groups).append((l, p, offset + i0, offset + i1))
    return Sources(
        state.embed,
        state.errors,
        state.n_excluded,
        features,
        decoders,
        groups,
        attn_errors=state.attn_errors,
        attn=is_attn,
        attn_groups=attn_groups,
        attn_decoders=attn_decoders,
    )


def feature_injection(
    rm: ReplacementModel, layer: int, position: int, feature: int, site: str = "mlp"
) -> Injection:
    """The injection of one feature target: its encoder vector at its read site (step 2)."""
    tc = rm.attn if site == "attn" else rm.tc
    with torch.no_grad():
        v = tc.encoder_vectors(int(layer), torch.tensor([int(feature)], device=tc.device))[0].detach()
    return Injection(v, int(position), layer=int(layer), site=site)


def feature_injections(
    rm: ReplacementModel, features: Int[Tensor, "n_features 3"], attn: Tensor | None = None
) -> list[Injection]:
    """One injection per feature node: its encoder vector at its layer's read site and position
    (`attn[i]`: feature i is an attention feature), in the order of `features`."""
    if attn is not None and bool(attn.any()):
        out: list = [None] * len(features)
        for site, tc in (("attn", rm.attn), ("mlp", rm.tc)):
            mine = attn if site == "attn" else ~attn
            with torch.no_grad():
                for l in range(rm.cfg.n_layers):
                    at = torch.nonzero(mine & (features[:, 0] == l))[:, 0]
                    enc = tc.encoder_vectors(l, features[at, 2].to(tc.device))
                    for i, v, p in zip(at.tolist(), enc, features[at, 1].tolist()):
                        out[i] = Injection(v, int(p), layer=l, site=site)
        return out
    out = []
    with torch.no_grad():
        for l in range(rm.cfg.n_layers):  # encoder vectors of one layer's features in one gather
            at = features[:, 0] == l
            enc = rm.tc.encoder_vectors(l, features[at, 2].to(rm.tc.device))
            out += [Injection(v, int(p), layer=l) for v, p in zip(enc, features[at, 1].tolist())]
    return out


def to_tokens(
    model, prompt: str | list[int] | Tensor | np.ndarray, *, strict: bool = False, truncate: bool = False
) -> Int[Tensor, " n_pos"]:
    """The prompt as ids (a string is tokenized with the model's default BOS handling).

    Raises `PromptError` for an empty prompt, text that is not valid UTF-8 (on Linux, bytes of
    another encoding in `sys.argv` arrive as lone surrogates), ids outside the vocabulary, and a
    prompt longer than the model's context unless `truncate=True`, which keeps the first `n_ctx`
    tokens and says what it dropped in a `PromptWarning`. Words the tokenizer does not know
    (they become its unknown token) give a `PromptWarning` naming them, a `PromptError` when
    `strict=True`.
    """
    if isinstance(prompt, str):
        check_prompt_text(prompt)
        if getattr(model, "tokenizer", None) is None:
            raise PromptError("the model has no tokenizer; pass the prompt as token ids.")
        tokens = model.to_tokens(prompt, truncate=False)[0]
        _check_known_words(model.tokenizer, prompt, tokens, strict)
        _check_special_tokens(model.tokenizer, prompt, tokens, strict)
    else:
        tokens = _token_ids(prompt).to(model.cfg.device)
    if tokens.numel() == 0:
        raise PromptError("prompt has 0 tokens; pass at least one.")
    n_ctx = model.cfg.n_ctx
    if tokens.numel() > n_ctx:
        if not truncate:
            raise PromptError(
                f"prompt has {tokens.numel()} tokens but the model's context is {n_ctx}; shorten it, "
                f"or keep its first {n_ctx} tokens with truncate=True (CLI: --truncate)."
            )
        dropped = prompt_strings(model, tokens[n_ctx:])
        shown = " ".join(dropped[:8]) + (" ..." if len(dropped) > 8 else "")
        warnings.warn(
            PromptWarning(
                f"prompt has {tokens.numel()} tokens but the model's context is {n_ctx}; truncated: "
                f"dropped the last {len(dropped)} tokens ({shown!r})."
            ),
            stacklevel=2,
        )
        tokens = tokens[:n_ctx]
    if int(tokens.min()) < 0 or int(tokens.max()) >= model.cfg.d_vocab:
        raise PromptError(
            f"prompt has token ids outside [0, {model.cfg.d_vocab}); pass ids of this model's vocabulary."
        )
    return tokens


def _token_ids(prompt) -> Int[Tensor, " n_pos"]:
    """A prompt given as ids (a list, array or tensor of integers: one sequence, or a batch of one
    as `model.to_tokens` returns it) as a flat long tensor; `PromptError` for anything else."""
    if isinstance(prompt, Tensor):
        ids = prompt.detach().cpu()
    elif isinstance(prompt, list | tuple | range | np.ndarray):
        try:
            ids = torch.as_tensor(np.asarray(prompt), device="cpu")  # not the default device
        except (TypeError, ValueError):  # strings, ragged lists, objects
            ids = None
    else:
        ids = None
    if ids is not None and ids.numel() == 0:
        return torch.zeros(0, dtype=torch.long, device="cpu")  # to_tokens: "prompt has 0 tokens"
    if ids is None or ids.dtype == torch.bool or ids.is_floating_point() or ids.is_complex():
        what = type(prompt).__name__
        if isinstance(prompt, list | tuple | range | np.ndarray | Tensor):
            what += " of " + (str(ids.dtype).removeprefix("torch.") if ids is not None else "non-integers")
        raise PromptError(
            f"prompt has type {what}; pass text (a str) or token ids (integers: a list, array or tensor)."
        )
    if ids.ndim > 1 and ids.numel() > 0 and ids.shape[:-1].numel() != 1:
        raise PromptError(
            f"prompt ids have shape {tuple(ids.shape)}, {ids.shape[:-1].numel()} sequences; a graph is "
            "one prompt's: pass one sequence of ids (or a batch of one)."
        )
    return ids.to(torch.long).flatten()


def check_prompt_text(prompt: str) -> None:
    """The checks of a text prompt that need no model (the CLI runs them before loading one):
    `PromptError` for an empty prompt, or naming the first character that is not text: a byte
    of another encoding (Python's surrogate escapes U+DC80..U+DCFF in argv) or a lone surrogate."""
    if not prompt.strip():
        raise PromptError("prompt is empty; pass at least one token of text.")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as e:
        ch = ord(prompt[e.start])
        what = f"byte 0x{ch - 0xDC00:02x}" if 0xDC80 <= ch <= 0xDCFF else f"lone surrogate U+{ch:04X}"
        before = prompt[max(0, e.start - 10) : e.start].encode("utf-8", "backslashreplace").decode()
        raise PromptError(
            f"prompt is not valid UTF-8: {what} at character {e.start} (after {before!r}); "
            "convert the text to UTF-8 first (e.g. iconv -f latin1 -t utf-8)."
        ) from None


def _check_known_words(tokenizer, prompt: str, tokens: Tensor, strict: bool) -> None:
    """Warn (`strict`: raise) when the prompt holds pieces the tokenizer maps to its unknown
    token, naming them and their share of the prompt's tokens (BOS not counted)."""
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is None or not bool((tokens == unk).any()):
        return
    try:  # the unknown pieces as written, from a fast tokenizer's offsets
        enc = tokenizer(prompt, add_special_tokens=False, return_offsets_mapping=True)
        words = [prompt[a:b] for i, (a, b) in zip(enc["input_ids"], enc["offset_mapping"]) if i == unk]
        n = len(enc["input_ids"])
    except (NotImplementedError, TypeError, ValueError, KeyError):
        words, n = [], int(tokens.numel())
    n_unk = max(len(words), 1)
    names = ", ".join(repr(w) for w in list(dict.fromkeys(words))[:10]) or "some pieces"
    share = f"{n_unk} of {n} prompt tokens ({100 * n_unk / max(n, 1):.0f}%)"
    if strict:
        raise PromptError(
            f"{share} are not in the model's vocabulary: {names}; rephrase with words the model "
            "knows, or leave out strict=True (CLI: --strict) to run with the unknown token in their place."
        )
    warnings.warn(
        PromptWarning(
            f"{share} are not in the model's vocabulary and become {tokenizer.unk_token!r}: {names}; "
            "the model sees that token, not these words (strict=True / --strict refuses such prompts)."
        ),
        stacklevel=3,
    )


def _check_special_tokens(tokenizer, prompt: str, tokens: Tensor, strict: bool) -> None:
    """Warn (`strict`: raise) when the prompt's text holds special tokens written out ("<bos>",
    "<eos>"), which the tokenizer reads as those tokens, not as words: a written "<bos>" is a second
    BOS, with feature and error nodes of its own. The unknown token is `_check_known_words`'s."""
    special = set(getattr(tokenizer, "all_special_ids", ())) - {getattr(tokenizer, "unk_token_id", None)}
    if not special:
        return
    try:
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    except (NotImplementedError, TypeError, ValueError, KeyError):
        return
    offset = int(tokens.numel()) - len(ids)  # what the model added in front (its BOS)
    bos = getattr(tokenizer, "bos_token_id", None)
    # a written BOS in front of a model that adds none is the one BOS it needs
    found = [(offset + i, t) for i, t in enumerate(ids) if t in special and (offset + i, t) != (0, bos)]
    if not found:
        return
    names = ", ".join(
        f"{tokenizer.convert_ids_to_tokens(t)!r} at token {p}"
        + (" (a second BOS)" if t == bos and p > 0 else "")
        for p, t in found[:5]
    ) + (" ..." if len(found) > 5 else "")
    message = (
        f"prompt text holds special tokens, which the model reads as those tokens and not as words: {names}; "
        "remove them" + (" (the model adds its own BOS)" if offset > 0 else "")
    )
    if strict:
        raise PromptError(f"{message}.")
    warnings.warn(
        PromptWarning(f"{message}, or keep them as tokens (strict=True / --strict refuses such prompts)."),
        stacklevel=3,
    )


def resolve_exclude_bos(model: HookedTransformer, tokens: Tensor, exclude_bos: bool | None) -> bool:
    """`exclude_bos`, or when it is None whether position 0 holds the tokenizer's BOS token
    (circuit-tracer's convention: no feature or error nodes there)."""
    if exclude_bos is not None:
        if not isinstance(exclude_bos, bool | np.bool_):  # "no" or "false" would read as True
            raise OptionError(
                f"exclude_bos is {exclude_bos!r}; pass True, False or None (exclude position 0 when it holds BOS)."
            )
        return bool(exclude_bos)
    bos = getattr(getattr(model, "tokenizer", None), "bos_token_id", None)
    return bos is not None and int(tokens[0]) == int(bos)


def graph_provenance(
    model: HookedTransformer, rm: ReplacementModel, state: ReplacementState, exclude_bos: bool, embedding: str
) -> dict:
    """The `meta` entries every attribution method records: which model and transcoders, and how."""
    cfg = rm.tc.cfg
    attn = {}
    if rm.attn is not None:
        acfg = rm.attn.cfg
        attn = dict(
            attn_transcoder_kind=acfg.kind,
            attn_transcoder_d_sae=int(acfg.d_sae),
            attn_transcoder_hooks=f"{acfg.input_hook} -> {acfg.output_hook}",
            attn_transcoder_model_name=str(acfg.model_name),
            attn_transcoder_fingerprint=fingerprint(rm.attn),
        )
    return dict(
        model_name=str(getattr(model.cfg, "model_name", "")),
        model_fingerprint=fingerprint(model),
        transcoder_kind=cfg.kind,
        transcoder_d_sae=int(cfg.d_sae),
        transcoder_hooks=f"{cfg.input_hook} -> {cfg.output_hook}",
        transcoder_model_name=str(cfg.model_name),
        transcoder_fingerprint=fingerprint(rm.tc),
        n_layers=int(model.cfg.n_layers),
        exclude_bos=bool(exclude_bos),
        embedding=embedding,
        dtype=str(state.errors.dtype).replace("torch.", ""),
        **attn,
    )


def prompt_strings(model: HookedTransformer, tokens: Tensor) -> list[str]:
    """Each prompt token as text (ids as text when the model has no tokenizer)."""
    tokenizer = getattr(model, "tokenizer", None)
    return [token_str(tokenizer, int(t)) for t in tokens.tolist()]


@torch.no_grad()
def target_values(
    rm: ReplacementModel, state: ReplacementState, targets: list[Target], positions: list[int]
) -> list[float]:
    """Each target's value `v_in . read value` on the recorded forward (the demeaned logit for logits)."""
    hooks = tuple(sorted({t.hook for t in targets if t.hook is not None}))
    captured = {}
    if hooks:
        with rm.frozen(state, rm.constant(state), capture=hooks) as run:
            rm.model(state.tokens[None])
            captured = {k: v[0] for k, v in run.captured.items()}
    out = []
    for t, p in zip(targets, positions):
        value = state.logits[p] if t.hook is None else captured[t.hook][p]
        out.append(float(value.double() @ t.vector.to(value.device).double()))
    return out


def node_table(state, sources: Sources, targets, positions, values, n_layers: int) -> Nodes:
    """The node table in node order: embeddings, errors, features, targets (graph.NODE_ORDER)."""
    P, L, n_exc = state.tokens.shape[0], n_layers, sources.n_excluded
    feats = sources.features.cpu().numpy().reshape(-1, 3)
    err_l, err_p = np.meshgrid(np.arange(L), np.arange(n_exc, P), indexing="ij")
    n_err, n_feat, n_t = err_l.size, len(feats), len(targets)
    err_norm = state.errors[:, n_exc:].norm(dim=-1).reshape(-1)
    site = None
    if sources.attn_errors is None:
        acts = state.acts[tuple(sources.features.T)] if n_feat else torch.zeros(0, device=state.acts.device)
    else:  # attention errors after the MLP errors; features of both sites
        err_l, err_p = np.concatenate([err_l, err_l]), np.concatenate([err_p, err_p])
        n_err = err_l.size
        err_norm = torch.cat([err_norm, sources.attn_errors[:, n_exc:].norm(dim=-1).reshape(-1)])
        acts = torch.zeros(n_feat, dtype=state.acts.dtype, device=state.acts.device)
        for mine, a in ((sources.attn, state.attn_acts), (~sources.attn, state.acts)):
            acts[mine] = a[tuple(sources.features[mine].T)]
        site = np.concatenate(
            [
                np.full(P, ""),
                np.repeat(["mlp", "attn"], n_err // 2),
                sources.feature_sites(),
                np.full(n_t, ""),
            ]
        )
    return Nodes(
        kind=np.array(["embedding"] * P + ["error"] * n_err + ["feature"] * n_feat + ["logit"] * n_t),
        layer=np.concatenate([np.full(P, -1), err_l.ravel(), feats[:, 0], [t.layer(L) for t in targets]]),
        position=np.concatenate([np.arange(P), err_p.ravel(), feats[:, 1], positions]),
        feature=np.concatenate([np.full(P + n_err, -1), feats[:, 2], np.full(n_t, -1)]),
        activation=np.concatenate(
            [
                state.embed.norm(dim=-1).double().cpu().numpy(),
                err_norm.double().cpu().numpy(),
                acts.double().cpu().numpy(),
                values,
            ]
        ),
        token=np.concatenate(
            [state.tokens.cpu().numpy(), np.full(n_err + n_feat, -1), [t.token for t in targets]]
        ),
        site=site,
    )

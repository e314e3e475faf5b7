"""Attribution: one batched backward pass per group of targets through the frozen replacement model.

Seed: circuit-tracing appendix, "Attribution Graph Computation". Algorithm:

1. Run the model once (`ReplacementModel.run`): record patterns, norm scales, MLP inputs and
   outputs; compute feature activations `a` and errors `e`, held constant.
2. Nodes (graph.NODE_ORDER): an embedding per position, an error per (layer, position), a feature
   per active (layer, position, feature) with `a > 0`, and the targets (logits by default: the
   smallest top-K past 0.95 probability, K <= 10; see targets.py).
3. Build the frozen model once with a batch of `batch_size` copies of the prompt: patterns and
   scales replaced by the recorded values, MLP outputs replaced by constants plus the live skip
   term, and zero "probe" leaves added at the embedding and at every MLP write site.
4. For each batch of targets, inject each target's input vector at its read point (a feature:
   its encoder vector `W_enc[:, f]` at its layer's MLP input and position; a logit: `e_tok - 1/V`
   on the logits at the last position; a custom target: its vector at its hook) and run one
   backward pass (`torch.autograd.grad`, graph retained). The gradient at the embedding probe
   and the write-site probes is `J^T v_in` for every source position and layer at once.
5. Edges (target t, source s): embedding and error sources `A[t, s] = v_out_s . grad`;
   a feature source `A[t, s] = a_s * sum_{l >= l_s} W_dec_s^l . grad_l[pos_s]`, which covers a
   cross-layer transcoder's decoders to every later layer (gradients at layers >= l_t are zero).
6. Rows are stored sparse (CSR, rows = targets); embedding and error rows are empty.

The cost is one backward per `batch_size` targets, linear in the number of active features. Steps
3-5 live in `backward_rows`, the swappable engine: it sees only the replacement model, the state,
the sources and the injections, and returns the rows.
"""

from __future__ import annotations

import hashlib
import math
import time
import warnings
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp
import torch
from jaxtyping import Float, Int
from torch import Tensor
from tqdm.auto import tqdm

from attrgraph.csr_rows import CsrRowWriter
from attrgraph.errors import PromptError, PromptWarning, TargetError
from attrgraph.graph import Graph, Nodes
from attrgraph.replacement import ReplacementModel, ReplacementState
from attrgraph.scores import scores_from_shares
from attrgraph.streamed_influence import layer_blocks, streamed_influence
from attrgraph.targets import Target, check_targets, select_logit_targets
from attrgraph.targets import _token_str as _tok


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
    """(layer, position, first column, end column) of each feature group."""

    @property
    def n_errors(self) -> int:
        return self.errors.shape[0] * (self.errors.shape[1] - self.n_excluded)

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


def build_sources(rm: ReplacementModel, state: ReplacementState) -> Sources:
    """Step 2 (sources) and the scaled decoders of step 5."""
    L, P = state.acts.shape[:2]
    active = state.acts > 0
    features = active.nonzero()  # sorted by (layer, position, feature)
    offset = P + L * (P - state.n_excluded)
    decoders, groups = [], []
    if len(features):
        keys = features[:, 0] * P + features[:, 1]
        bounds = torch.cat(
            [torch.tensor([0]), (keys[1:] != keys[:-1]).nonzero()[:, 0] + 1, torch.tensor([len(keys)])]
        )
        for i0, i1 in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
            l, p = int(features[i0, 0]), int(features[i0, 1])
            f = features[i0:i1, 2]
            a = state.acts[l, p, f]
            with torch.no_grad():
                dec = rm.tc.decoder_vectors(l, f.to(rm.tc.device)).to(state.errors.dtype)
            decoders.append(dec * a[:, None, None])
            groups.append((l, p, offset + i0, offset + i1))
    return Sources(state.embed, state.errors, state.n_excluded, features, decoders, groups)


def backward_rows(
    rm: ReplacementModel,
    state: ReplacementState,
    sources: Sources,
    injections: list[Injection],
    batch_size: int = 256,
    progress: bool = False,
) -> sp.csr_array:
    """Steps 3-5: one row per injection, over the `sources.n_columns` source columns (CSR)."""
    n_pos, n_layers = state.tokens.shape[0], state.acts.shape[0]
    B = max(1, min(batch_size, len(injections)))
    dtype, device = state.errors.dtype, state.errors.device
    constant = rm.constant(state)
    hooks = tuple(sorted({j.hook for j in injections if j.hook is not None}))
    n_emb, n_exc = n_pos, sources.n_excluded
    err_cols = [n_emb + l * (n_pos - n_exc) for l in range(n_layers)]
    written = CsrRowWriter(len(injections), sources.n_columns, torch.empty(0, dtype=dtype).numpy().dtype)
    bar = tqdm(total=len(injections), desc="attribution", unit="target", disable=not progress)
    with torch.enable_grad(), rm.frozen(state, constant, batch=B, probes=True, capture=hooks) as run:
        logits = rm.model(state.tokens[None].expand(B, n_pos))
        for start in range(0, len(injections), B):
            batch = injections[start : start + B]
            outputs, grads = [], []
            by_site: dict = {}
            for i, j in enumerate(batch):
                key = ("logits",) if j.logits else (("hook", j.hook) if j.hook else ("read", j.layer))
                by_site.setdefault(key, []).append((i, j))
            for key, items in by_site.items():
                out = (
                    logits
                    if key[0] == "logits"
                    else run.captured[key[1]]
                    if key[0] == "hook"
                    else run.reads[key[1]]
                )
                g = torch.zeros_like(out)
                for i, j in items:
                    g[i, j.position] += j.vector.to(g)
                outputs.append(out)
                grads.append(g)
            inputs = [run.embed_probe, *run.write_probes]
            got = torch.autograd.grad(outputs, inputs, grads, retain_graph=True, allow_unused=True)
            g_embed, g_write = got[0], got[1:]
            rows = torch.zeros(B, sources.n_columns, dtype=dtype, device=device)
            if g_embed is not None:
                rows[:, :n_emb] = torch.einsum("bpd,pd->bp", g_embed, sources.embed)
            for l, g in enumerate(g_write):
                if g is not None:
                    cols = slice(err_cols[l], err_cols[l] + n_pos - n_exc)
                    rows[:, cols] = torch.einsum("bpd,pd->bp", g[:, n_exc:], sources.errors[l, n_exc:])
            reached = [l for l, g in enumerate(g_write) if g is not None]
            if reached and sources.groups:
                # [B, P, L, d]: a (layer range, position) slice is a view, and flattens without a copy
                G = torch.zeros(B, n_pos, n_layers, g_write[reached[0]].shape[-1], dtype=dtype, device=device)
                for l in reached:
                    G[:, :, l] = g_write[l]
                for (l, p, c0, c1), dec in zip(sources.groups, sources.decoders):
                    if l > reached[-1]:
                        continue
                    n_out = dec.shape[1]
                    rows[:, c0:c1] = G[:, p, l : l + n_out].reshape(B, -1) @ dec.reshape(len(dec), -1).T
            written.append(np.arange(start, start + len(batch)), rows[: len(batch)].cpu().numpy())
            bar.update(len(batch))
    bar.close()
    return written.to_csr()


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
    else:
        tokens = torch.as_tensor(np.asarray(prompt), dtype=torch.long).flatten()
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


def fingerprint(module: torch.nn.Module) -> str:
    """A cheap identity hash: sha256 over parameter names, shapes and a strided sample of values."""
    h = hashlib.sha256()
    for name, p in sorted(module.state_dict().items()):
        flat = p.detach().reshape(-1)
        sample = flat[:: max(1, flat.numel() // 4096)].double().cpu().numpy()
        h.update(name.encode())
        h.update(str(tuple(p.shape)).encode())
        h.update(sample.tobytes())
    return h.hexdigest()[:16]


def resolve_exclude_bos(model, tokens: Tensor, exclude_bos: bool | None) -> bool:
    """`exclude_bos`, or when it is None whether position 0 holds the tokenizer's BOS token
    (circuit-tracer's convention: no feature or error nodes there)."""
    if exclude_bos is not None:
        return bool(exclude_bos)
    bos = getattr(getattr(model, "tokenizer", None), "bos_token_id", None)
    return bos is not None and int(tokens[0]) == int(bos)


def graph_provenance(
    model, rm: ReplacementModel, state: ReplacementState, exclude_bos: bool, embedding: str
) -> dict:
    """The `meta` entries every attribution method records: which model and transcoders, and how."""
    cfg = rm.tc.cfg
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
    )


def prompt_strings(model, tokens: Tensor) -> list[str]:
    """Each prompt token as text (ids as text when the model has no tokenizer)."""
    tokenizer = getattr(model, "tokenizer", None)
    return [_tok(tokenizer, int(t)) for t in tokens.tolist()]


def attribute(
    model,
    transcoders,
    prompt: str | list[int] | Tensor | np.ndarray,
    *,
    max_n_logits: int = 10,
    desired_logit_prob: float = 0.95,
    targets: list[Target] | None = None,
    batch_size: int = 256,
    exclude_bos: bool | None = None,
    embedding: str = "token+position",
    progress: bool = False,
    backend: str = "auto",
    method: str = "standard",
    tau: float = 0.0,
    max_feature_nodes: int | None = None,
) -> Graph:
    """The attribution graph of `prompt` (module docstring, steps 1-6).

    `targets` replaces the default logit targets (targets.py: `logit_difference`, `direction`).
    `exclude_bos=None` excludes position 0 (no features, no error nodes; circuit-tracer's
    convention) exactly when it holds the tokenizer's BOS token. `embedding` folds the positional
    embedding into the embedding node ("token+position", default) or leaves it in the bias ("token").
    Influence on the logits (prune.compute_influence) is filled in on the returned graph.
    `batch_size` is the most targets per backward (the linear engine also closes a batch when its
    working tensors would pass 1 MiB, linear_backward.py step 4). `backend` picks the rows engine:
    "autograd" (`backward_rows`, this module), "linear" (the frozen backward as explicit matrix
    products, linear_backward.py) or "auto" (linear wherever it applies, else autograd; the
    default); all share `backward_rows`' signature and give equal rows.
    `method="hierarchical"` runs hierarchical attribution (hierarchical.py) from the first target
    (default: the top logit) with threshold `tau`; `max_feature_nodes` builds an adaptive partial
    graph exploring at most that many features (adaptive.py). The graph's meta carries its
    replacement and completeness scores (scores.py) as `unpruned_*_score`.
    """
    if method not in ("standard", "hierarchical"):
        raise ValueError(f"method is {method!r}; pass 'standard' or 'hierarchical'.")
    common = dict(exclude_bos=exclude_bos, embedding=embedding, batch_size=batch_size, backend=backend)
    if method == "hierarchical":
        from attrgraph.hierarchical import attribute_hierarchical

        return attribute_hierarchical(
            model, transcoders, prompt, tau=tau, root=targets[0] if targets else None, **common
        )
    if max_feature_nodes is not None:
        if targets is not None:
            raise TargetError(
                "max_feature_nodes builds adaptive graphs for the logit targets only; leave targets=None."
            )
        from attrgraph.adaptive import attribute_adaptive

        return attribute_adaptive(
            model,
            transcoders,
            prompt,
            max_feature_nodes=max_feature_nodes,
            max_n_logits=max_n_logits,
            desired_logit_prob=desired_logit_prob,
            **common,
        )
    t0 = time.perf_counter()
    rm = transcoders if isinstance(transcoders, ReplacementModel) else ReplacementModel(model, transcoders)
    tokens = to_tokens(model, prompt)
    if batch_size < 1:
        raise ValueError(f"batch_size is {batch_size}; pass at least 1.")
    tokenizer = getattr(model, "tokenizer", None)
    exclude_bos = resolve_exclude_bos(model, tokens, exclude_bos)
    if targets is not None:
        check_targets(targets, model, len(tokens))
    state = rm.run(tokens, exclude_bos=bool(exclude_bos), embedding=embedding)
    n_pos, L = len(tokens), model.cfg.n_layers
    if targets is None:
        targets = select_logit_targets(state.logits[-1], max_n_logits, desired_logit_prob, tokenizer)
    weights = np.array([t.weight for t in targets], np.float64)
    weights = np.where(np.isnan(weights), 1.0 / len(targets), weights)

    sources = build_sources(rm, state)
    feats = sources.features
    injections = []
    with torch.no_grad():
        for l in range(L):  # encoder vectors of one layer's features in one gather
            at = feats[:, 0] == l
            enc = rm.tc.encoder_vectors(l, feats[at, 2].to(rm.tc.device))
            injections += [Injection(v, int(p), layer=l) for v, p in zip(enc, feats[at, 1].tolist())]
    positions = [t.position % n_pos for t in targets]
    injections += [
        Injection(t.vector, pos, hook=t.hook, logits=t.hook is None) for t, pos in zip(targets, positions)
    ]
    from attrgraph.linear_backward import linear_rows, rows_engine

    engine = rows_engine(backend, rm, injections)
    stats: dict = {}
    extra = dict(stats=stats) if engine is linear_rows else {}
    rows = engine(rm, state, sources, injections, batch_size=batch_size, progress=progress, **extra)

    n_src = n_pos + sources.n_errors
    N = sources.n_columns + len(targets)
    # rows only for features and targets; embeddings and errors have no inputs (empty rows)
    # keep the rows' index dtype, so that scipy does not copy the (large) indices
    indptr = np.concatenate([np.zeros(n_src, rows.indptr.dtype), rows.indptr])
    adjacency = sp.csr_array((rows.data, rows.indices, indptr), shape=(N, N))

    target_values = _target_values(rm, state, targets, positions)
    nodes = _node_table(state, sources, targets, positions, target_values, L)
    graph = Graph(
        nodes=nodes,
        adjacency=adjacency,
        prompt_ids=tokens.cpu().numpy(),
        prompt_tokens=prompt_strings(model, tokens),
        logit_tokens=np.array([t.token for t in targets]),
        logit_probs=weights,
        logit_strings=[t.name for t in targets],
        meta=dict(
            **graph_provenance(model, rm, state, exclude_bos, embedding),
            backend="linear" if engine is linear_rows else "autograd",
            backward_gflop=round(stats.get("flops", 0) / 1e9, 3),
            max_n_logits=int(max_n_logits),
            desired_logit_prob=float(desired_logit_prob),
            custom_targets=any(
                t.hook is not None or t.token < 0 or not math.isfinite(t.weight) for t in targets
            ),
            attribution_seconds=round(time.perf_counter() - t0, 4),
        ),
    )
    # influence and scores in one streamed pass (no copies of a possibly huge adjacency)
    w = graph.logit_weights()
    pass_ = streamed_influence(
        graph.adjacency, w, layer_blocks(graph.nodes), graph.nodes.kind == "error", progress=progress
    )
    graph.nodes.influence = pass_.influence.astype(np.float32)
    scores = scores_from_shares(graph.nodes.kind, pass_.influence, pass_.error_share, w)
    graph.meta.update(
        unpruned_replacement_score=scores.replacement, unpruned_completeness_score=scores.completeness
    )
    return graph


@torch.no_grad()
def _target_values(
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


def _node_table(state, sources: Sources, targets, positions, values, n_layers: int) -> Nodes:
    P, L, n_exc = state.tokens.shape[0], n_layers, sources.n_excluded
    feats = sources.features.cpu().numpy().reshape(-1, 3)
    err_l, err_p = np.meshgrid(np.arange(L), np.arange(n_exc, P), indexing="ij")
    n_err, n_feat, n_t = err_l.size, len(feats), len(targets)
    err_norm = state.errors[:, n_exc:].norm(dim=-1).reshape(-1)
    acts = state.acts[tuple(sources.features.T)] if n_feat else torch.zeros(0)
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
    )

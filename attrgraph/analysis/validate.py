"""`attrgraph validate FILE`: how far to trust a graph, measured by interventions on the real model.

Seed: circuit-tracing appendix, "Validating the Replacement Model" (all three evaluations).

1. Node to logit: ablate each graph feature (set to 0) with constrained patching over
   [l, l + w] for each window w in `windows` (the appendix sweeps the range), under frozen
   attention; record `KL(clean || ablated)` of the next-token distribution at the last position.
   Correlate `log KL` with the log of the node's influence, its activation and its direct logit
   edge `sum_t p_t |A[t, n]|` (Pearson of the logs, per window).
2. Feature to feature: ablate each graph feature s with constrained patching over [l_s, l_s + 2];
   the effect on every downstream graph feature t (layer > l_s, position >= p_s) is
   `|a_t' - a_t| / a_t`; its graph influence is `B[t, s]` with `B = (I - A)^-1 - I`, `A` the
   normalized unsigned adjacency (one sparse triangular solve per source). Spearman over the pairs.
3. Local replacement faithfulness: at a single position add to the residual stream
   that the MLP of layer l reads (`hook_resid_mid`; `hook_resid_pre` on a parallel block, where the
   layer's attention reads it too, in both models alike) (a) a feature's encoder vector scaled so that its pre-activation
   rises by `delta` (linearized through ln2's recorded scale), (b) a random direction of the same
   norm; or (c) raise an upstream feature's activation by `delta` in the replacement model up to
   layer m = l + 1, copy the residual stream into the underlying model there and run both on.
   Patterns are frozen in both models (norms live); the replacement model recomputes its features
   (iterative patching over every layer). Per downstream layer, compare the net perturbations of
   `hook_resid_post` (positions >= the perturbed one): cosine and normalized MSE
   `|d_rep - d_model|^2 / |d_model|^2`.
4. Graphs with attention features (`[mlp_set, attn_set]`): steps 1-2 ablate and read the MLP-site
   features only (constrained patching also holds the attention outputs of the range, so direct
   effects stay direct); step 3 perturbs MLP features. Attention features enter as the paths
   between them.
5. `attrgraph validate` (cli/validate.py) validates every graph of FILE (or `--name`) with the model and transcoders recorded by
   `attrgraph build` (or `--model` / `--transcoders`) and writes validation_report.py's report.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import scipy.sparse as sp
import torch
from jaxtyping import Float
from scipy.sparse.linalg import spsolve_triangular
from torch import Tensor
from tqdm import tqdm

from attrgraph.analysis.intervene import Add, patched_forward, resolve_edits
from attrgraph.analysis.stats import loglog_pearson, nan_stat, spearman
from attrgraph.engine.frozen import frozen_forward
from attrgraph.engine.replacement import ReplacementModel, ReplacementState
from attrgraph.errors import ValidationError
from attrgraph.graph.graph import Graph, check_graph
from attrgraph.graph.provenance import provenance_mismatch
from attrgraph.graph.prune import normalize_matrix
from transcoders.arguments import shown
from transcoders.block_layout import BlockLayout
from transcoders.config import is_real, is_whole

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer

    from transcoders.base import SparseCoder


@dataclass(frozen=True)
class ValidateConfig:
    """Sizes of the three evaluations."""

    max_features: int = 200
    """Features ablated per graph (the most influential ones)."""
    windows: tuple[int, ...] = (0, 1, 2, 99)
    """Constrained ranges [l, l + w] for node-to-logit (99: to the last layer)."""
    ff_window: int = 2
    """Feature to feature: constrained range [l_s, l_s + ff_window] (the appendix uses 2)."""
    n_perturbations: int = 16
    """Samples per perturbation kind for faithfulness."""
    delta: float = 0.1
    """Activation / pre-activation increase of a perturbation (the appendix uses 0.1)."""
    batch_size: int = 32
    """Ablations per batched forward."""
    seed: int = 0
    """Seed of the faithfulness samples."""

    def __post_init__(self):
        low = {"max_features": 1, "batch_size": 1, "n_perturbations": 0}
        for name in (*low, "ff_window", "seed"):
            if not is_whole(getattr(self, name)):
                raise ValidationError(f"{name} is {shown(getattr(self, name))}; pass a whole number.")
        if not isinstance(self.windows, tuple | list) or not all(is_whole(w) for w in self.windows):
            raise ValidationError(
                f"windows is {shown(self.windows)}; pass a tuple of layer counts such as (0, 1, 2, 99)."
            )
        if not is_real(self.delta):
            raise ValidationError(
                f"delta is {shown(self.delta)}; pass a number above 0 (the appendix uses 0.1)."
            )
        for name, least in low.items():
            if getattr(self, name) < least:
                raise ValidationError(
                    f"{name} is {getattr(self, name)}; max_features and batch_size must be >= 1 and "
                    "n_perturbations >= 0; fix the config."
                )
        bad = [w for w in (*self.windows, self.ff_window) if w < 0]
        if not self.windows or bad:
            raise ValidationError(
                f"windows {self.windows} and ff_window {self.ff_window} must be layer counts of 0 or more "
                "(at least one window; 99 reaches the last layer); fix the config."
            )
        if not (math.isfinite(self.delta) and self.delta > 0):
            raise ValidationError(
                f"delta is {self.delta}; pass the perturbation's size, a finite number above 0 (the appendix uses 0.1)."
            )


def _features(graph: Graph, cfg: ValidateConfig) -> np.ndarray:
    feats = np.flatnonzero(graph.nodes.mask("feature", "mlp"))  # step 4
    infl = np.nan_to_num(graph.nodes.influence[feats], nan=0.0)
    return feats[np.argsort(-infl, kind="stable")[: cfg.max_features]]


def _ablations(rm, state, graph, nodes, windows, select=None, batch_size=32, bar=None):
    """Yield (node, window, PatchedRun row) of SetTo(0) on each node over [l, l + w]; `bar` (a
    tqdm, or None) advances by the nodes of each batch once the caller has used it."""
    L = state.acts.shape[0]
    n = graph.nodes
    for w in windows:
        for c0 in range(0, len(nodes), batch_size):
            chunk = nodes[c0 : c0 + batch_size]
            # group by layer so that one batch shares a range
            for layer in np.unique(n.layer[chunk]):
                sub = chunk[n.layer[chunk] == layer]
                edits = [
                    resolve_edits(
                        {(int(layer), int(n.position[i]), int(n.feature[i])): 0.0}, L, *state.acts.shape[1:]
                    )
                    for i in sub
                ]
                rng = (int(layer), min(int(layer) + w, L - 1))
                yield sub, w, patched_forward(rm, state, edits, "constrained", rng, select=select)
                if bar is not None:
                    bar.update(len(sub))


def node_to_logit(
    rm: ReplacementModel, state: ReplacementState, graph: Graph, cfg: ValidateConfig, bar=None
) -> dict:
    """Step 1: ablation KL against influence, activation and direct logit edge (`bar`: a tqdm
    advanced by each ablation, or None)."""
    feats = _features(graph, cfg)
    n = graph.nodes
    clean = torch.log_softmax(state.logits[-1].double(), -1)
    w = np.zeros(graph.n_nodes)
    w[n.mask("logit")] = graph.logit_probs
    edge = np.abs(graph.adjacency.T @ sp.diags_array(w)).sum(axis=1)
    edge = np.asarray(edge).ravel()
    kl = {wd: np.zeros(len(feats)) for wd in cfg.windows}
    pos = {int(i): k for k, i in enumerate(feats)}
    for sub, wd, run in _ablations(rm, state, graph, feats, cfg.windows, batch_size=cfg.batch_size, bar=bar):
        logp = torch.log_softmax(run.logits[:, -1].double(), -1)
        values = (clean.exp() * (clean - logp)).sum(-1).clamp_min(0).cpu().numpy()
        for i, v in zip(sub, values):
            kl[wd][pos[int(i)]] = v
    out = {"n_features": int(len(feats)), "windows": {}}
    predictors = {
        "influence": n.influence[feats].astype(float),
        "activation": n.activation[feats].astype(float),
        "direct_logit_edge": edge[feats],
    }
    for wd in cfg.windows:
        out["windows"][str(wd)] = {k: loglog_pearson(kl[wd], x) for k, x in predictors.items()}
    out["mean"] = {
        k: nan_stat(np.mean, [out["windows"][str(wd)][k] for wd in cfg.windows]) for k in predictors
    }
    out["_scatter"] = {"kl": kl[cfg.windows[-1]].tolist(), **{k: v.tolist() for k, v in predictors.items()}}
    return out


def influence_columns(graph: Graph, sources: np.ndarray) -> np.ndarray:
    """[n_nodes, len(sources)] columns of `B = (I - A)^-1 - I` for the normalized adjacency."""
    A = normalize_matrix(graph.adjacency)
    M = sp.csr_array(sp.eye_array(graph.n_nodes, format="csr") - A)
    E = np.zeros((graph.n_nodes, len(sources)))
    E[sources, np.arange(len(sources))] = 1.0
    X = spsolve_triangular(M, E, lower=True, unit_diagonal=True)
    return np.asarray(X) - E


def feature_to_feature(
    rm: ReplacementModel, state: ReplacementState, graph: Graph, cfg: ValidateConfig, bar=None
) -> dict:
    """Step 2: Spearman between graph influence and the normalized ablation effect (`bar` as in
    node_to_logit; advanced by every source, ablated or not)."""
    n = graph.nodes
    feats = np.flatnonzero(n.mask("feature", "mlp"))  # step 4
    sources = _features(graph, cfg)
    if len(feats) < 2:
        if bar is not None:
            bar.update(len(sources))
        return {"spearman": math.nan, "n_pairs": 0, "_scatter": {"influence": [], "effect": []}}
    B = influence_columns(graph, sources)
    select = torch.tensor(
        np.stack([n.layer[feats], n.position[feats], n.feature[feats]], 1),
        dtype=torch.long,
        device=state.acts.device,
    )
    base = state.acts[tuple(select.T)].double().cpu().numpy()
    col = {int(s): k for k, s in enumerate(sources)}
    infl, eff = [], []
    for sub, _, run in _ablations(
        rm, state, graph, sources, (cfg.ff_window,), select=select, batch_size=cfg.batch_size, bar=bar
    ):
        after = run.acts.double().cpu().numpy()
        for s, row in zip(sub, after):
            down = (n.layer[feats] > n.layer[s]) & (n.position[feats] >= n.position[s]) & (base > 0)
            infl.append(B[feats[down], col[int(s)]])
            eff.append(np.abs(row[down] - base[down]) / base[down])
    infl_a, eff_a = (np.concatenate(x) if x else np.zeros(0) for x in (infl, eff))
    rho = spearman(infl_a, eff_a)
    return {
        "spearman": rho,
        "n_pairs": int(len(infl_a)),
        "n_sources": int(len(sources)),
        "_scatter": {"influence": infl_a.tolist(), "effect": eff_a.tolist()},
    }


# ---------------------------------------------------------------------------------- faithfulness
def _underlying(rm, state, hooks, capture, start_at_layer=None, resid=None) -> dict:
    """The real model with frozen attention patterns (norms live); returns the captured hook values."""
    with (
        torch.no_grad(),
        frozen_forward(
            rm.model, rm.tc.cfg, state.frozen, freeze_norms=False, capture=capture, hooks=hooks
        ) as got,
    ):
        if start_at_layer is None:
            rm.model(state.tokens[None])
        else:
            rm.model(resid, start_at_layer=start_at_layer)
    return got


def _replacement(rm, state, hooks, capture, edits=()) -> dict:
    L = state.acts.shape[0]
    run = patched_forward(
        rm, state, [list(edits)], "iterative", (0, L - 1), True, False, hooks=hooks, capture=capture
    )
    return run.captured


def _compare(
    a: dict, b: dict, a0: dict, b0: dict, names: list[str], p: int
) -> tuple[list[float], list[float]]:
    cos, nmse = [], []
    for name in names:
        da = (a[name] - a0[name])[0, p:].double().reshape(-1)
        db = (b[name] - b0[name])[0, p:].double().reshape(-1)
        denom = float(da.norm() * db.norm())
        cos.append(float(da @ db) / denom if denom > 0 else math.nan)
        ref = float(db.pow(2).sum())
        nmse.append(float((da - db).pow(2).sum()) / ref if ref > 0 else math.nan)
    return cos, nmse


def encoder_perturbation(
    model: HookedTransformer, tc: SparseCoder, state: ReplacementState, l: int, p: int, f: int, delta: float
) -> Float[Tensor, " d_model"]:
    """Step 3 (a): feature f's encoder vector `v` (the set's `encoder_vectors`), scaled so that adding
    it to what the MLP of layer l reads at position p (`BlockLayout.mlp_reads`: `hook_resid_mid`, or
    `hook_resid_pre` on a parallel block) raises f's pre-activation by `delta` with ln2's scale held
    at its recorded value: `delta / (v . (w * P(v)) / s)`, `P` centering (LayerNorm only)."""
    v = tc.encoder_vectors(l, torch.tensor([f], device=tc.device))[0].detach().to(state.y_out.dtype)
    ln2 = model.blocks[l].ln2
    w = ln2.w.detach() if getattr(ln2, "w", None) is not None else torch.ones_like(v)
    centered = v if "RMS" in type(ln2).__name__ else v - v.mean()
    scale = state.frozen[BlockLayout.of(model.cfg).norm_scale("ln2", l)][0, p].squeeze()
    gain = float(v @ (w * centered)) / float(scale)
    return v * (delta / gain) if abs(gain) > 1e-12 else v * 0


def faithfulness(rm: ReplacementModel, state: ReplacementState, cfg: ValidateConfig, bar=None) -> dict:
    """Step 3: cosine and normalized MSE per downstream layer, for the three perturbation kinds
    (`bar` as in node_to_logit; advanced by each perturbation)."""
    model, tc = rm.model, rm.tc
    L, P, _ = state.acts.shape
    gen = np.random.default_rng(cfg.seed)
    layout = rm.layout
    resid = layout.hooks("resid_post")
    rep0 = _replacement(rm, state, [], resid)
    und0 = _underlying(rm, state, [], resid)
    active = state.acts.nonzero().cpu().numpy()
    active = active[active[:, 1] >= 1] if (active[:, 1] >= 1).any() else active
    out = {}
    for kind in ("encoder", "random", "upstream"):
        rows: dict[int, list] = {}
        pool = active[active[:, 0] < L - 1] if kind == "upstream" else active
        if len(pool) == 0:
            if bar is not None:
                bar.update(cfg.n_perturbations)
            continue
        for _ in range(cfg.n_perturbations):
            if bar is not None:
                bar.update(1)
            l, p, f = (int(v) for v in pool[gen.integers(len(pool))])
            if kind == "upstream":
                m = l + 1
                names = resid[m:]
                pre_m = layout.hook("resid_pre", m)
                rep = _replacement(
                    rm,
                    state,
                    [],
                    resid + [pre_m],
                    edits=resolve_edits({(l, p, f): Add(cfg.delta)}, L, P, tc.cfg.d_sae),
                )
                und = _underlying(rm, state, [], resid, start_at_layer=m, resid=rep[pre_m])
            else:
                vec = encoder_perturbation(model, tc, state, l, p, f, cfg.delta)
                if kind == "random":
                    r = torch.as_tensor(gen.standard_normal(vec.shape[0]), dtype=vec.dtype, device=vec.device)
                    vec = r / r.norm() * vec.norm()

                def add(x, hook, vec=vec, p=p):
                    x = x.clone()
                    x[:, p] += vec
                    return x

                hooks = [(layout.mlp_reads(l), add)]
                names = resid[l:]
                rep = _replacement(rm, state, hooks, resid)
                und = _underlying(rm, state, hooks, resid)
            cos, nmse = _compare(rep, und, rep0, und0, names, p)
            for k, (c, e) in enumerate(zip(cos, nmse)):
                rows.setdefault(k, []).append((c, e))
        out[kind] = {
            "cosine": [nan_stat(np.nanmean, [c for c, _ in rows[k]]) for k in sorted(rows)],
            "nmse": [nan_stat(np.nanmedian, [e for _, e in rows[k]]) for k in sorted(rows)],
            "n": [len(rows[k]) for k in sorted(rows)],
        }
    return out


# ---------------------------------------------------------------------------------- whole graph
def validate_graph(
    model: HookedTransformer,
    transcoders: SparseCoder | ReplacementModel,
    graph: Graph,
    cfg: ValidateConfig | None = None,
    progress: bool = False,
) -> dict:
    """All three evaluations of one graph (module docstring); keys starting with `_` hold plot data.
    `progress=True` shows a tqdm bar on stderr counting the ablations and perturbations."""
    check_graph(graph, "validate_graph")
    cfg = cfg or ValidateConfig()
    rm = ReplacementModel.of(model, transcoders)
    why = provenance_mismatch(graph, rm.model, rm.tc, rm.attn)
    if why is not None:
        raise ValidationError(
            f"{why}; pass the model and the sets ([mlp_set, attn_set] with attention features) it was built with."
        )
    if graph.n_features == 0:
        raise ValidationError("the graph has no feature nodes; there is nothing to ablate.")
    state = rm.run(torch.as_tensor(graph.prompt_ids, device=rm.cfg.device), exclude_bos=False)
    n_ablated = len(_features(graph, cfg))
    total = n_ablated * (len(cfg.windows) + 1) + 3 * cfg.n_perturbations  # steps 1, 2 and 3
    with tqdm(total=total, desc="validate", unit="run", disable=not progress) as bar:
        return {
            "prompt": " ".join(graph.prompt_tokens),
            "node_to_logit": node_to_logit(rm, state, graph, cfg, bar),
            "feature_to_feature": feature_to_feature(rm, state, graph, cfg, bar),
            "faithfulness": faithfulness(rm, state, cfg, bar),
        }

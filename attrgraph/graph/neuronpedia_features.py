"""The feature files of the circuit-tracer / Neuronpedia export (neuronpedia.py, step 5), filled
from the dashboards of the graph's transcoder set (transcoders/dashboard_file.py) when it has some.

Seed: circuit-tracer's `frontend/feature_models.py` (the fields) and the frontend code that reads
them (`feature_examples/*.js`, `attribution_graph/render-act-histogram.js`).

1. Which dashboards, per site ("mlp": the graph's transcoder set; "attn": its attention set, for
   its attention features): dashboard_lookup.py's, from `dashboards=` / `attn_dashboards=` (a
   path, a set folder, a bundled name or a loaded `Dashboards`; a missing or unreadable one is an
   error, one that does not fit the graph an `ExportError`), else those of the set the graph
   names or whose fingerprint it records. None found for a site with features, or one found
   that cannot be read or does not fit: that site's files hold only what the graph knows and one
   `ExportWarning` line says so. Dashboards that lack a layer or feature of the graph: `ExportError`.
2. One file per feature (layer l, feature f) of the graph, index feature_index(l, f) (cantor(l, f),
   plus ATTN_INDEX_OFFSET for attention features, filled from the attention set's dashboards):
     examples_quantiles   "Top activations" (the dashboards' top examples), then one entry per
                          activation-quantile bin, highest first, named with its range; an
                          example is its tokens (with a space before each but the first when
                          the vocabulary's tokens carry none, as the frontend joins them),
                          `tokens_acts_list` (the feature's activation on
                          each), `train_token_ind` (the index of the active token) and
                          `is_repeated_datapoint` (the same window and activations shown above)
     top_logits, bottom_logits   the direct-path logits' token strings
     act_min, act_max     0 and the feature's largest activation (over the corpus, or over the
                          graph's nodes if larger): the frontend's colour scale and histogram axis
     histogram            nonzero activations in `n_bins` equal bins over [act_min, act_max]. The
                          dashboards count them in log-spaced bins; each is spread over the equal
                          bins as a log-uniform density over its part of [min, max], so the
                          counts are estimates (the totals are exact)
     quantile_values      the 1st, 2nd, ..., 100th percentiles of the nonzero activations under the
                          same piecewise log-uniform density (the frontend shows "Act 1.2 87pct")
     activation_frequency the share of counted corpus positions where the feature is active
   Without dashboards: no examples, logits, histogram or percentiles; act_min / act_max over the
   feature's graph nodes; frequency = the share of prompt positions holding it.
3. Labels for the node `clerp`s (neuronpedia.py, step 3): the dashboards' user labels and, apart,
   their automatic ones ("dead" ones left out), keyed `("attn", l, f)` for the attention set's.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from attrgraph.errors import ExportError, ExportWarning
from attrgraph.graph.dashboard_lookup import SET_NAMES, find_dashboards
from attrgraph.graph.graph import Graph

if TYPE_CHECKING:
    from transcoders.dashboard_file import Dashboards

N_PERCENTILES = 100


ATTN_INDEX_OFFSET = 1 << 40
"""Added to an attention feature's `cantor(layer, feature)` index, so that its feature file never
collides with an MLP feature's."""


def cantor(x: int, y: int) -> int:
    """circuit-tracer's feature index of (layer, feature): the Cantor pairing."""
    return (x + y) * (x + y + 1) // 2 + y


def feature_index(layer: int, feature: int, attn: bool = False) -> int:
    """The feature-file index of a feature node: `cantor(layer, feature)`, offset by
    `ATTN_INDEX_OFFSET` for an attention feature."""
    return cantor(layer, feature) + (ATTN_INDEX_OFFSET if attn else 0)


# ------------------------------------------------------------------------------ step 1
_HINT = "compute them with `python -m transcoders.dashboards --transcoders SET` or pass the file"


def export_dashboards(
    graph: Graph,
    dashboards: str | os.PathLike | Dashboards | None = None,
    attn_dashboards: str | os.PathLike | Dashboards | None = None,
) -> dict[str, Dashboards | None]:
    """The dashboards for `graph`'s feature files by site, "mlp" and "attn" (step 1): found by
    dashboard_lookup.py, one ExportWarning line for each site that has features but none, an
    ExportError for given ones that do not fit or dashboards that lack a feature of the graph."""
    n = graph.nodes
    out: dict[str, Dashboards | None] = {}
    for site, given in (("mlp", dashboards), ("attn", attn_dashboards)):
        attn = site == "attn"
        if attn and given is None and not ((n.kind == "feature") & (n.site == "attn")).any():
            out[site] = None  # no attention features: nothing to fill, nothing to say
            continue
        found = find_dashboards(graph.meta, site, given)
        if found.dashboards is None and found.given:
            raise ExportError(f"{found.reason}; pass the dashboards of the graph's {SET_NAMES[site]}.")
        if found.dashboards is None:
            what, flag = (
                ("attention feature files", "--attn-dashboards")
                if attn
                else ("feature files", "--dashboards")
            )
            _warn(f"{found.reason}, so {what} have no examples; {_HINT} ({flag}).")
        else:
            _check_fits(graph, found.dashboards, site, found.caveat)
        out[site] = found.dashboards
    return out


def _warn(message: str) -> None:
    warnings.warn(message, ExportWarning, stacklevel=4)


def _check_fits(graph: Graph, d: Dashboards, site: str, caveat: str | None = None) -> None:
    n = graph.nodes
    feats = (n.kind == "feature") & ((n.site == "attn") == (site == "attn"))
    if feats.any():
        layer, feature = n.layer[feats], n.feature[feats]
        bad = (layer < 0) | (layer >= d.n_layers) | (feature < 0) | (feature >= d.d_sae)
        if bad.any():
            k = int(np.argmax(bad))
            raise ExportError(
                f"the dashboards {d.path} cover {d.n_layers} layers x {d.d_sae} features but the graph has "
                f"{'A' if site == 'attn' else 'L'}{int(layer[k])}/F{int(feature[k])}; pass the dashboards "
                f"of the graph's {SET_NAMES[site]}."
            )
    name = graph.meta.get("attn_transcoders" if site == "attn" else "transcoders")
    theirs = d.attrs.get("transcoders")
    if name and theirs and Path(str(name).rstrip("/\\")).name != Path(str(theirs).rstrip("/\\")).name:
        _warn(
            f"the dashboards {d.path} were computed for transcoder set {theirs!r}, the graph's "
            f"{SET_NAMES[site]} is {name!r}; their examples describe that set."
        )
    elif caveat:  # the same name, another fingerprint (dashboard_lookup.other_set)
        _warn(f"{caveat}; their examples describe that set.")


# ------------------------------------------------------------------------------ step 2: histogram
def bin_ranges(edges: np.ndarray, vmin: float, vmax: float) -> tuple[np.ndarray, np.ndarray]:
    """[B] lower and upper ends of the values each log-spaced dashboard bin can hold: the first
    holds everything below edges[1], the last everything from edges[-2] on, all within [vmin, vmax]."""
    e = np.asarray(edges, np.float64)
    lo, hi = e[:-1].copy(), e[1:].copy()
    lo[0], hi[-1] = vmin, vmax
    lo, hi = np.clip(lo, vmin, vmax), np.clip(hi, vmin, vmax)
    return np.minimum(lo, hi), hi


def _mass_below(x: np.ndarray, lo: np.ndarray, hi: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Count below each x under a log-uniform density on [lo, hi] per bin (a point mass at hi when lo == hi)."""
    x = np.asarray(x, np.float64)[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.log(np.maximum(x, 1e-300) / lo) / np.log(hi / lo)
    frac = np.where(hi > lo, np.clip(frac, 0.0, 1.0), (x >= hi).astype(np.float64))
    return frac @ counts


def linear_histogram(
    edges: np.ndarray, counts: np.ndarray, vmin: float, vmax: float, top: float, n_bins: int
) -> np.ndarray:
    """[n_bins] the counts of log-spaced bins `edges` (values in [vmin, vmax]) over equal bins of [0, top]."""
    counts = np.asarray(counts, np.float64)
    if counts.sum() == 0 or not vmax > 0:
        return np.zeros(n_bins)
    lo, hi = bin_ranges(edges, vmin, vmax)
    below = _mass_below(np.linspace(0.0, top, n_bins + 1), lo, hi, counts)
    below[-1] = counts.sum()  # top >= vmax: everything
    return np.diff(below)


def percentiles(
    edges: np.ndarray, counts: np.ndarray, vmin: float, vmax: float, n: int = N_PERCENTILES
) -> np.ndarray:
    """[n] the values below which 1/n, 2/n, ..., all of the counted activations lie (step 2)."""
    counts = np.asarray(counts, np.float64)
    total = counts.sum()
    if total == 0:
        return np.zeros(0)
    lo, hi = bin_ranges(edges, vmin, vmax)
    cum = np.cumsum(counts)
    target = total * np.arange(1, n + 1) / n
    j = np.minimum(np.searchsorted(cum, target - 1e-9 * total), len(counts) - 1)
    before = cum[j] - counts[j]
    frac = np.clip((target - before) / np.maximum(counts[j], 1e-300), 0.0, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(hi[j] > lo[j], lo[j] * (hi[j] / lo[j]) ** frac, hi[j])
    out[-1] = vmax
    return np.maximum.accumulate(out)


# ------------------------------------------------------------------------------ step 2: files
def _examples(examples: list[dict], seen: set, spaced: bool) -> list[dict]:
    out = []
    for ex in examples:
        key = (tuple(ex["token_ids"]), tuple(ex["acts"]))
        tokens = ex["tokens"] if spaced else [t if k == 0 else f" {t}" for k, t in enumerate(ex["tokens"])]
        out.append(
            {
                "tokens": tokens,
                "tokens_acts_list": [float(f"{a:.4g}") for a in ex["acts"]],
                "train_token_ind": ex["center"],
                "is_repeated_datapoint": key in seen,
            }
        )
        seen.add(key)
    return out


def dashboard_fields(d: Dashboards, layer: int, feature: int, graph_max: float) -> dict:
    """The feature-file fields step 2 fills from dashboards `d` for one feature."""
    f = d.feature(layer, feature)
    top = max(f["max"], graph_max)
    seen: set = set()
    # the frontend joins tokens as they are: words of a word-level vocabulary get their spaces here
    spaced = any(str(t)[:1].isspace() for t in d.vocab)
    quantiles = [{"quantile_name": "Top activations", "examples": _examples(f["top"], seen, spaced)}]
    n_q = len(f["quantiles"])
    for b in reversed(range(n_q)):
        q = f["quantiles"][b]
        if q["examples"]:
            lo, hi = q["range"]
            quantiles.append(
                {
                    "quantile_name": f"Quantile {b + 1} of {n_q} ({lo:.3g} to {hi:.3g})",
                    "examples": _examples(q["examples"], seen, spaced),
                }
            )
    edges, counts = np.asarray(f["histogram"]["edges"]), np.asarray(f["histogram"]["counts"])
    hist = linear_histogram(edges, counts, f["min"], f["max"], top, len(counts))
    return {
        "examples_quantiles": quantiles if f["count"] else [],
        "top_logits": [t for t, _ in f["top_logits"]],
        "bottom_logits": [t for t, _ in f["bottom_logits"]],
        "act_min": 0.0,
        "act_max": float(top),
        "quantile_values": [float(f"{v:.4g}") for v in percentiles(edges, counts, f["min"], f["max"])],
        "histogram": [round(float(v), 2) for v in hist],
        "activation_frequency": f["frequency"],
    }


def feature_files(
    graph: Graph,
    transcoder_id: str,
    dashboards: Dashboards | None = None,
    attn_dashboards: Dashboards | None = None,
) -> dict[int, dict]:
    """One feature file (feature_models.Model) per feature of the graph, by feature index (step 2).
    Attention features (site "attn") get `ATTN_INDEX_OFFSET`, a `{set}/attn/{layer}` transcoder id
    and the fields of `attn_dashboards` (the attention set's); the others those of `dashboards`."""
    n = graph.nodes
    groups: dict[tuple[int, int, bool], list[int]] = {}
    for i in np.flatnonzero(n.kind == "feature"):
        groups.setdefault((int(n.layer[i]), int(n.feature[i]), n.site[i] == "attn"), []).append(i)
    out = {}
    for (layer, feat, attn), rows in groups.items():
        acts = n.activation[rows].astype(np.float64)
        graph_max = float(np.nanmax(acts, initial=0.0))
        index = feature_index(layer, feat, attn)
        file = {
            "transcoder_id": f"{transcoder_id}/{'attn/' if attn else ''}{layer}",
            "index": index,
            "examples_quantiles": [],
            "top_logits": [],
            "bottom_logits": [],
            "act_min": float(np.nanmin(acts, initial=0.0)),
            "act_max": graph_max,
            "quantile_values": [],
            "histogram": [],
            "activation_frequency": len(set(n.position[rows].tolist())) / max(graph.n_pos, 1),
        }
        source = attn_dashboards if attn else dashboards
        if source is not None:
            file.update(dashboard_fields(source, layer, feat, graph_max))
        out[index] = file
    return out


# ------------------------------------------------------------------------------ step 3
def dashboard_labels(d: Dashboards, site: str = "mlp") -> tuple[dict[tuple, str], dict[tuple, str]]:
    """(user labels, automatic labels) of dashboards `d`, by (layer, feature), or by ("attn", layer,
    feature) for site "attn"; "dead" ones left out."""
    key = (lambda l, i: ("attn", int(l), int(i))) if site == "attn" else (lambda l, i: (int(l), int(i)))
    auto = d["labels/auto"]
    automatic = {key(l, i): str(auto[l, i]) for l, i in zip(*np.nonzero(auto != "dead"))}
    return {key(l, i): v for (l, i), v in d.user_labels.items()}, automatic

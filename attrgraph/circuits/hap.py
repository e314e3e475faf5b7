"""HAP, hybrid attribution and pruning (seeds/hap-hybrid-attribution-pruning.txt, sec. 3 and appendix B).

1. EAP scores every edge (eap.py); the `keep_frac` fraction with the largest |score|
   is the high-potential subgraph (a generous fraction keeps weakly scored but
   cooperative edges, such as the S-inhibition heads of IOI).
2. Edge Pruning (edge_pruning.py) runs on that subgraph only; every other edge is
   fixed to its corrupted value.
3. Its log_alphas start from the normalized EAP scores (appendix B):
       n_e = (|s_e| - min |s|) / (max |s| - min |s|)  over the subgraph,
       log_alpha_e = init_low + n_e (init_high - init_low),
   so EP starts near the EAP ranking instead of from a uniform mask.
4. The target sparsity is over the whole graph, as for EP, so HAP and EP circuits
   of one sparsity have the same number of edges.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING

import torch

from attrgraph.bundled.loading import check_model
from attrgraph.circuits.circuit import EdgeScores
from attrgraph.circuits.eap import eap
from attrgraph.circuits.edge_pruning import PruneConfig, PruneResult, check_config, prune_edges
from attrgraph.circuits.pairs import Pairs
from attrgraph.errors import OptionError, SparsityError
from transcoders.arguments import check_real, shown
from transcoders.config import is_real

if TYPE_CHECKING:
    from transformer_lens import HookedTransformer


def _check_fraction(keep_frac: float) -> None:
    if not is_real(keep_frac) or not 0.0 < keep_frac < 1.0:
        raise SparsityError(f"the kept fraction must lie strictly between 0 and 1, got {shown(keep_frac)}.")


def check_keep_frac(sparsity: float, keep_frac: float) -> None:
    """Refuse a `keep_frac` outside (0, 1), or one that keeps fewer edges than the sparsity leaves
    (step 4: the circuit must fit in the subgraph), before any scoring."""
    _check_fraction(keep_frac)
    if 1 - sparsity > keep_frac:
        raise SparsityError(
            f"sparsity {sparsity} keeps {1 - sparsity:.3f} of the edges, more than the "
            f"{keep_frac} EAP keeps; raise keep_frac or the sparsity."
        )


def hap_subgraph(scores: EdgeScores, keep_frac: float) -> torch.Tensor:
    """Flat bool mask of the `keep_frac` edges of largest |EAP score|."""
    _check_fraction(keep_frac)
    flat = scores.flat().abs()
    allowed = torch.zeros(flat.shape, dtype=torch.bool, device=flat.device)
    allowed[flat.topk(max(1, round(keep_frac * flat.numel()))).indices] = True
    return allowed


def hap(
    model: HookedTransformer,
    pairs: Pairs,
    config: PruneConfig,
    keep_frac: float = 0.3,
    init_low: float = 0.0,
    init_high: float = 4.0,
    scores: EdgeScores | None = None,
) -> PruneResult:
    """EAP narrows the graph to `keep_frac` of its edges; EP, initialised from the scores, decides."""
    start = time.perf_counter()
    check_model(model)
    check_config(config)
    check_keep_frac(config.sparsity, keep_frac)
    for what, value in (("init_low", init_low), ("init_high", init_high)):
        check_real(value, what, OptionError)
    if scores is not None and not isinstance(scores, EdgeScores):
        raise OptionError(
            f"scores is a {type(scores).__name__} ({shown(scores)}); pass what eap returns, or None."
        )
    scores = scores if scores is not None else eap(model, pairs)
    allowed = hap_subgraph(scores, keep_frac)
    mag = scores.flat().abs().to(next(model.parameters()).dtype)
    lo, hi = mag[allowed].min(), mag[allowed].max()
    norm = (mag - lo) / (hi - lo).clamp(min=torch.finfo(mag.dtype).tiny)
    init = init_low + norm * (init_high - init_low)
    result = prune_edges(model, pairs, config, allowed=allowed, init=init)
    circuit = replace(result.circuit, method="hap", meta={**result.circuit.meta, "keep_frac": keep_frac})
    return result._replace(circuit=circuit, seconds=time.perf_counter() - start)

"""The statistics the validation reports: Spearman, Pearson of logs, and NaN-safe summaries.

Each returns NaN (without a warning) where the statistic is undefined: fewer than 3 usable points
or a constant input.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.stats import pearsonr, spearmanr


def loglog_pearson(y: np.ndarray, x: np.ndarray) -> float:
    """Pearson correlation of log(y) and log(x) over the points where both are positive and finite."""
    ok = (y > 0) & (x > 0) & np.isfinite(y) & np.isfinite(x)
    if ok.sum() < 3:
        return math.nan
    return float(pearsonr(np.log(y[ok]), np.log(x[ok])).statistic)


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    """Spearman correlation; NaN (without a warning) for fewer than 3 points or a constant input."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    if len(x) < 3 or np.ptp(x) == 0 or np.ptp(y) == 0:
        return math.nan
    return float(spearmanr(x, y).statistic)


def nan_stat(fn, values) -> float:
    """`fn` over the finite values; NaN (without a warning) when there are none."""
    v = np.asarray(values, float)
    v = v[np.isfinite(v)]
    return float(fn(v)) if len(v) else math.nan

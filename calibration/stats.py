"""Rank statistics in numpy (no scipy): average ranks with ties, Spearman's rho, log errors."""
from __future__ import annotations

import math
from typing import Optional, Sequence

import numpy as np


def rankdata(x: Sequence[float]) -> np.ndarray:
    """Ranks 1..n; tied values get the average of the ranks they span (scipy's 'average')."""
    a = np.asarray(x, dtype=float)
    n = a.size
    if n == 0:
        return np.zeros(0)
    order = np.argsort(a, kind="mergesort")
    sa = a[order]
    ranks = np.empty(n, dtype=float)
    i = 0
    while i < n:
        j = i
        while j + 1 < n and sa[j + 1] == sa[i]:
            j += 1
        ranks[order[i:j + 1]] = 0.5 * (i + j) + 1.0
        i = j + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> Optional[float]:
    """Spearman's rank correlation with ties (Pearson correlation of the average ranks).

    None when it is undefined: fewer than 2 pairs, a non-finite value, or all ranks of one side
    equal (zero variance)."""
    a, b = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"spearman: lengths differ ({a.size} vs {b.size})")
    if a.size < 2 or not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        return None
    ra, rb = rankdata(a), rankdata(b)
    ra -= ra.mean()
    rb -= rb.mean()
    den = math.sqrt(float(ra @ ra) * float(rb @ rb))
    if den == 0:
        return None
    return float(ra @ rb) / den


def log_errors(pred: Sequence[float], meas: Sequence[float]) -> dict:
    """Summary of ln(pred / meas): RMS, mean (bias), max |.| and the geometric-mean ratio."""
    p, m = np.asarray(pred, dtype=float), np.asarray(meas, dtype=float)
    ok = np.isfinite(p) & np.isfinite(m) & (p > 0) & (m > 0)
    if not ok.any():
        return {"n": 0, "rms_log": None, "mean_log": None, "max_abs_log": None, "geo_ratio": None}
    e = np.log(p[ok] / m[ok])
    return {"n": int(ok.sum()), "rms_log": float(np.sqrt(np.mean(e * e))), "mean_log": float(e.mean()),
            "max_abs_log": float(np.abs(e).max()), "geo_ratio": float(np.exp(e.mean()))}

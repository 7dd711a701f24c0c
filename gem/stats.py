"""Intervals and fits: the statistics that production reports (gem.distill.transfer) and the quality
study (gem.study) share.

- `mean_interval`: mean and 95% interval of the mean over seeds (Student t, n - 1 degrees of freedom).
- `fit_eta`: least squares NE = NE0 - eta * ln C over model sizes (C = forward FLOPs per example).
- `eta_interval`: eta fitted per seed (each seed's NE at every size), then `mean_interval` over seeds.
- `ratio_interval`: eta_a / eta_b with a percentile bootstrap interval: seeds resampled with
  replacement per architecture, points averaged per size, both fitted, the ratio taken.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import stats

CONFIDENCE = 0.95


def mean_interval(values: list[float]) -> tuple[float, float, float]:
    """(mean, low, high); with one value the interval is (nan, nan)."""
    x = np.asarray(values, dtype=np.float64)
    mean = float(x.mean())
    if len(x) < 2:
        return mean, math.nan, math.nan
    half = float(stats.t.ppf(0.5 + CONFIDENCE / 2, len(x) - 1) * x.std(ddof=1) / math.sqrt(len(x)))
    return mean, mean - half, mean + half


def fit_eta(flops: np.ndarray, ne: np.ndarray) -> tuple[float, float]:
    """(NE0, eta) of the least-squares line NE = NE0 - eta * ln(flops). flops (k,), ne (k,)."""
    slope, intercept = np.polyfit(np.log(np.asarray(flops, dtype=np.float64)), np.asarray(ne, dtype=np.float64), 1)
    return float(intercept), float(-slope)


def eta_interval(flops: np.ndarray, ne: np.ndarray) -> tuple[float, float, float]:
    """ne (seeds, k) at flops (k,) -> (mean eta, low, high) over the per-seed fits."""
    return mean_interval([fit_eta(flops, row)[1] for row in np.asarray(ne)])


def ratio_interval(flops_a: np.ndarray, ne_a: np.ndarray, flops_b: np.ndarray, ne_b: np.ndarray,
                   draws: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """eta_a / eta_b from the seed-mean points, and its bootstrap percentile interval.
    ne_a (seeds_a, k_a), ne_b (seeds_b, k_b)."""
    ne_a, ne_b = np.asarray(ne_a), np.asarray(ne_b)
    point = fit_eta(flops_a, ne_a.mean(0))[1] / fit_eta(flops_b, ne_b.mean(0))[1]
    rng = np.random.default_rng(seed)
    ratios = []
    for _ in range(draws):
        a = ne_a[rng.integers(0, len(ne_a), len(ne_a))].mean(0)
        b = ne_b[rng.integers(0, len(ne_b), len(ne_b))].mean(0)
        eta_b = fit_eta(flops_b, b)[1]
        if eta_b != 0:
            ratios.append(fit_eta(flops_a, a)[1] / eta_b)
    lo, hi = np.percentile(ratios, [50 * (1 - CONFIDENCE), 50 * (1 + CONFIDENCE)])
    return float(point), float(lo), float(hi)

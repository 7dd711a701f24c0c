"""The plot kinds reports share, drawn with matplotlib's object-oriented API.

Figures are built with `matplotlib.figure.Figure` directly, not pyplot: no global figure registry,
no display, and PNG output goes through the Agg renderer (matplotlib's recommended way to make
figures in a server or batch job). Pass the result to `Section.figure`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from matplotlib.figure import Figure


def interval_bars(
    intervals: Mapping[str, tuple[float, float, float]],
    ylabel: str = "",
    title: str = "",
    reference: float | None = None,
) -> Figure:
    """Bars of a mean per label with its interval (e.g. a 95% CI) as error bars.

    `intervals`: label -> (mean, lo, hi), with lo <= mean <= hi; bars in the mapping's order.
    `reference`: an optional horizontal line (a baseline's value, a Bayes floor).
    """
    labels = list(intervals)
    mean, lo, hi = (np.array([intervals[k][i] for k in labels], dtype=float) for i in range(3))
    if np.any(lo > mean) or np.any(hi < mean):
        bad = [k for k, (m, a, b) in intervals.items() if not a <= m <= b]
        raise ValueError(f"intervals must satisfy lo <= mean <= hi; not so for {bad}")
    fig = Figure(figsize=(max(4.0, 0.9 * len(labels) + 2.0), 3.6))
    ax = fig.add_subplot()
    x = np.arange(len(labels))
    # yerr is [below, above] the mean: an asymmetric interval draws as it is.
    ax.bar(x, mean, yerr=np.stack([mean - lo, hi - mean]), capsize=4, color="#4c72b0")
    if reference is not None:
        ax.axhline(reference, color="#c44e52", linestyle="--", linewidth=1)
    ax.set_xticks(x, labels, rotation=30 if len(labels) > 5 else 0, ha="right" if len(labels) > 5 else "center")
    # Bars of a metric like NE differ in the third decimal: zoom to the intervals, not to zero.
    span = float(hi.max() - lo.min()) or abs(float(hi.max())) or 1.0
    bottom = float(lo.min()) - 0.15 * span
    top = float(hi.max()) + 0.15 * span
    if reference is not None:
        bottom, top = min(bottom, reference - 0.05 * span), max(top, reference + 0.05 * span)
    ax.set_ylim(bottom, top)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return fig


def scatter_with_fit(
    x: Sequence[float],
    y: Sequence[float],
    xlabel: str = "",
    ylabel: str = "",
    title: str = "",
    logx: bool = False,
    connect: bool = False,
) -> tuple[Figure, tuple[float, float]]:
    """Points (x, y) with the least-squares line y = slope * t + intercept, t = x or log10(x).

    `logx` fits and draws against log10(x) (a scaling law over compute or data size); `connect`
    joins the points in x order (a curve over steps). Returns the figure and (slope, intercept)
    so the caller can quote the fit it plotted. Needs at least 2 distinct x.
    """
    xs = np.asarray(x, dtype=float)
    ys = np.asarray(y, dtype=float)
    if xs.shape != ys.shape or xs.ndim != 1:
        raise ValueError(f"x and y must be 1-d of one length, got {xs.shape} and {ys.shape}")
    if logx and np.any(xs <= 0):
        raise ValueError("logx needs every x > 0")
    t = np.log10(xs) if logx else xs
    if np.unique(t).size < 2:
        raise ValueError("a line needs at least 2 distinct x")
    slope, intercept = np.polyfit(t, ys, deg=1)
    fig = Figure(figsize=(5.0, 3.6))
    ax = fig.add_subplot()
    order = np.argsort(xs)
    ax.plot(xs[order], ys[order], "o-" if connect else "o", color="#4c72b0", label="measured")
    grid = np.linspace(t.min(), t.max(), 100)
    ax.plot(
        10**grid if logx else grid,
        slope * grid + intercept,
        "--",
        color="#c44e52",
        label=f"fit: {slope:.4g}·{'log10(x)' if logx else 'x'} + {intercept:.4g}",
    )
    if logx:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize="small")
    fig.tight_layout()
    return fig, (float(slope), float(intercept))

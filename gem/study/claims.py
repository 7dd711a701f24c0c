"""Each claim's verdict, from the recorded numbers only (results.json's), never written by hand.

An interval is the 95% interval of gem.stats. A difference d = a - b of NE (lower is better):
"reproduced" when its whole interval says a is better (high < 0), "not reproduced" when it says a is
worse (low > 0), "inconclusive" when it holds 0 (or could not be computed).
"""

from __future__ import annotations

import math
from typing import Any

CALIBRATION_GOAL = 0.05  # within 5% of 1


def _finite(*xs: float) -> bool:
    return all(x is not None and math.isfinite(x) for x in xs)


def _fmt(x: list[float | None] | None, spec: str = "+.4f") -> str:
    if x is None or not _finite(*x):
        return "n/a" if x is None or x[0] is None else format(x[0], spec)
    return f"{x[0]:{spec}} [{x[1]:{spec}}, {x[2]:{spec}}]"


def better(diff: list[float] | None) -> str:
    """Verdict on 'the first is better' from the (mean, low, high) of NE(first) - NE(second)."""
    if diff is None or not _finite(*diff):
        return "inconclusive"
    _, lo, hi = diff
    return "reproduced" if hi < 0 else "not reproduced" if lo > 0 else "inconclusive"


def matched_compute(r: dict[str, Any]) -> tuple[str, str]:
    diff = r["matched_diff"]["interformer"]
    k, i = r["matched"]["kunlun"]["ne"][0], r["matched"]["interformer"]["ne"][0]
    return better(diff), (
        f"held-out NE Kunlun {k:.4f} vs InterFormer {i:.4f} at {r['matched']['kunlun']['flops']:,} vs "
        f"{r['matched']['interformer']['flops']:,} FLOPs/example; difference {_fmt(diff)}")


def scaling(r: dict[str, Any]) -> tuple[str, str]:
    """eta(Kunlun) / eta(InterFormer) ~ 2: InterFormer must improve measurably with compute (its eta
    interval above 0) for the ratio to mean anything; then reproduced when the ratio's interval is
    above 1 and holds 2, not reproduced when it excludes 2, inconclusive otherwise."""
    point, lo, hi = r["scaling"]["ratio"]
    eta_i = r["scaling"]["interformer"]["eta_interval"]
    eta_k = r["scaling"]["kunlun"]["eta_interval"]
    detail = (f"eta Kunlun {_fmt(eta_k, '.4f')}, InterFormer {_fmt(eta_i, '.4f')}; "
              f"ratio {_fmt(r['scaling']['ratio'], '.2f')}")
    if not _finite(point, lo, hi, *eta_i) or eta_i[1] <= 0:
        return "inconclusive", detail + " (InterFormer's NE does not fall measurably with compute)"
    if lo <= 2 <= hi:
        return ("reproduced" if lo > 1 else "inconclusive"), detail
    return "not reproduced", detail


def transfer(r: dict[str, Any]) -> tuple[str, str]:
    """The joint model beats each conversion task trained alone: every difference's interval below 0."""
    verdicts = [better(t["diff"]) for t in r["transfer"]]
    parts = [f"{t['task']}: {_fmt(t['diff'])}" for t in r["transfer"]]
    if not verdicts:
        status = "inconclusive"
    elif all(v == "reproduced" for v in verdicts):
        status = "reproduced"
    elif any(v == "not reproduced" for v in verdicts):
        status = "not reproduced"
    else:
        status = "inconclusive"
    return status, "joint - alone NE per task: " + "; ".join(parts)


def calibration(r: dict[str, Any]) -> tuple[str, str]:
    """Every surface's weighted calibration within 5% of 1 (mean over seeds); not reproduced when
    some surface's interval lies wholly outside [0.95, 1.05]."""
    cal = r["calibration"]
    inside = [m is not None and abs(m - 1) <= CALIBRATION_GOAL for m, _, _ in cal.values()]
    outside = [_finite(lo, hi) and (lo > 1 + CALIBRATION_GOAL or hi < 1 - CALIBRATION_GOAL) for _, lo, hi in cal.values()]
    status = ("reproduced" if cal and all(inside) else "not reproduced" if any(outside) else "inconclusive")
    return status, "; ".join(f"{s} {_fmt(c, '.3f')}" for s, c in cal.items())


def all_claims(r: dict[str, Any]) -> list[dict[str, str]]:
    out = []
    for name, fn in (("Kunlun beats InterFormer at matched compute", matched_compute),
                     ("Kunlun's scaling efficiency is about 2x InterFormer's", scaling),
                     ("Click tasks help sparse conversion tasks (joint beats alone)", transfer),
                     ("Calibration per surface within 5% of 1 (importance-weighted)", calibration)):
        status, detail = fn(r)
        out.append({"name": name, "status": status, "detail": detail})
    return out

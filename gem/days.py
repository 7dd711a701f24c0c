"""Calendar days written YYYY-MM-DD: the one place day arithmetic lives.

Standard library only: the stage registry, which the DAG processor imports on every parse, uses it.
"""

from __future__ import annotations

import datetime as dt


def shift_day(ds: str, days: int) -> str:
    return (dt.date.fromisoformat(ds) + dt.timedelta(days=days)).isoformat()


def day_range(first: str, last: str) -> list[str]:
    """Every day from first to last inclusive: ("2026-01-29", "2026-01-31") -> 3 days; [] if last < first."""
    start, end = dt.date.fromisoformat(first), dt.date.fromisoformat(last)
    return [(start + dt.timedelta(days=i)).isoformat() for i in range((end - start).days + 1)]

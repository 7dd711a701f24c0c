"""Calendar days written YYYY-MM-DD: the one place day arithmetic lives.

Standard library only: the stage registry, which the DAG processor imports on every parse, uses it.
"""

from __future__ import annotations

import datetime as dt

# The pipeline's first day unless the config says otherwise (GemConfig.start_ds); the DAG file reads
# it at parse time without loading a config.
DEFAULT_START_DS = "2026-01-01"


def iso_day(text: str) -> str:
    """A calendar day written YYYY-MM-DD, returned normalised; ValueError otherwise (a command line's
    day option turns it into a usage error: gem.command_line.day_value)."""
    try:
        return dt.date.fromisoformat(text).isoformat()
    except ValueError:
        raise ValueError(f"must be a day written YYYY-MM-DD, got {text!r}") from None


def shift_day(ds: str, days: int) -> str:
    return (dt.date.fromisoformat(ds) + dt.timedelta(days=days)).isoformat()


def day_range(first: str, last: str) -> list[str]:
    """Every day from first to last inclusive: ("2026-01-29", "2026-01-31") -> 3 days; [] if last < first."""
    start, end = dt.date.fromisoformat(first), dt.date.fromisoformat(last)
    return [(start + dt.timedelta(days=i)).isoformat() for i in range((end - start).days + 1)]

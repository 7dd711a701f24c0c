"""Helpers the test modules share (instead of importing each other's)."""

from __future__ import annotations

import datetime as dt
from typing import Any

STAND_IN = "test stand-in: no stage ran"


def stand_in_records(stage: str, days: list[str], rows_written: dict[str, int] | None = None,
                     table_versions: dict[str, int] | None = None) -> list[dict[str, Any]]:
    """Completion records of `stage` for `days`, standing in for a stage a test does not run (e.g.
    the data-quality stages); rows for `_ops.completions` with every column of its schema."""
    now = dt.datetime(2026, 2, 1)
    return [{"stage": stage, "ds": dt.date.fromisoformat(d), "run_id": f"test:{d}", "rows_in": None,
             "rows_written": (rows_written or {}).get(d, 0), "rows_quarantined": 0, "quarantined_by_reason": {},
             "table_versions": dict(table_versions or {}), "input_versions": {}, "reconciliation": STAND_IN,
             "completed_at": now} for d in days]

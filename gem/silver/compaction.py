"""The compaction schedule of silver.user_sequences: which days get a snapshot of every user in
silver.user_sequences_compacted, and the last one before a day (where a history lookup starts).
Plain Python, no Spark: a caller without a session (the stage registry's unit tests) imports it cheaply.
"""

from __future__ import annotations

import datetime as dt

from gem.config import GemConfig
from gem.days import shift_day
from gem.lakehouse.stages import compaction_days


def _days_since_start(cfg: GemConfig, ds: str) -> int:
    return (dt.date.fromisoformat(ds) - dt.date.fromisoformat(cfg.start_ds)).days


def is_compaction_day(cfg: GemConfig, ds: str) -> bool:
    """Whether the registry's schedule (gem.lakehouse.stages.compaction_days) compacts on ds. Example: start
    2026-01-01, every 7 -> 2026-01-07, 2026-01-14, ..."""
    return bool(compaction_days(cfg, ds))


def last_compaction_before(cfg: GemConfig, ds: str) -> str | None:
    """The latest compaction day < ds, or None (none yet, or compaction off)."""
    k, days = cfg.sequence_compaction_days, _days_since_start(cfg, ds)
    if k <= 0 or days < k:
        return None
    # Compaction days are start + (j*k - 1); the greatest one strictly before ds.
    j = days // k
    return shift_day(cfg.start_ds, j * k - 1)

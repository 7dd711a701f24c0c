"""The bronze statistics suite: bounds from `cfg.quality` on a statistics frame with one row per day of
events (per-surface CTR, null rates, duplicate and quarantine rates from the ingest completion
record, reconciliation of bronze counts with that record).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd
from pyspark.sql import functions as F

from gem.config import GemConfig
from gem.quality.expectations import contract_setting, expect_between
from schemas.events import BRONZE_AD_EVENTS
from schemas.tasks import EVENT_TYPES

if TYPE_CHECKING:
    from great_expectations.expectations import Expectation
    from pyspark.sql import DataFrame

IMPRESSION, CLICK = "impression", "click"
if not {IMPRESSION, CLICK} <= set(EVENT_TYPES):
    raise ImportError(f"gem.quality.bronze counts {IMPRESSION!r}/{CLICK!r} events; schemas.tasks has {EVENT_TYPES}")


# --------------------------------------------------------------------------------------------------
# Statistics of one day of events, and their bounds.


def ctr_column(surface: str) -> str:
    return f"ctr__{surface}"


def null_rate_column(column: str) -> str:
    return f"null_rate__{column}"


ROWS_VALIDATED = "rows_validated"
DUPLICATE_RATE = "duplicate_rate"
QUARANTINE_RATE = "quarantine_rate"
BRONZE_ROWS_MINUS_RECORD = "bronze_rows_minus_record"
QUARANTINE_ROWS_MINUS_RECORD = "quarantine_rows_minus_record"
DUPLICATE_REASON = "duplicate_event_id"


def nullable_event_columns() -> list[str]:
    """Nullable columns of bronze.ad_events: the ones whose null rate is tracked."""
    return [c.name for c in BRONZE_AD_EVENTS.columns if c.nullable]


def event_statistics_expectations(cfg: GemConfig) -> list[Expectation]:
    """Bounds on the statistics frame: CTR per surface, rates from ingest (critical); null rates
    (warnings); bronze and quarantine counts equal the ingest record's (critical)."""
    q = cfg.quality
    contract = contract_setting(BRONZE_AD_EVENTS)
    out = [expect_between(ROWS_VALIDATED, 1, None, "bronze_partition_not_empty", True, contract)]
    out += [
        expect_between(ctr_column(s), q.min_surface_ctr, q.max_surface_ctr, f"surface_ctr:{s}", True,
                       "quality.min_surface_ctr / quality.max_surface_ctr")
        for s in cfg.surfaces
    ]
    out += [
        expect_between(null_rate_column(c), 0.0, q.max_null_rate, f"null_rate:{c}", False, "quality.max_null_rate")
        for c in nullable_event_columns()
    ]
    # The counts must equal the ingest record's: a mismatch is a broken commit, not a setting.
    reconciled = "the ingest record (a mismatch means bronze changed after ingest; not a setting)"
    out += [
        expect_between(DUPLICATE_RATE, 0.0, q.max_duplicate_rate, "duplicate_rate", True, "quality.max_duplicate_rate"),
        expect_between(QUARANTINE_RATE, 0.0, q.max_quarantine_rate, "quarantine_rate", True,
                       "quality.max_quarantine_rate"),
        expect_between(BRONZE_ROWS_MINUS_RECORD, 0, 0, "bronze_rows_match_ingest_record", True, reconciled),
        expect_between(QUARANTINE_ROWS_MINUS_RECORD, 0, 0, "quarantine_rows_match_ingest_record", True, reconciled),
    ]
    return out


def _event_aggregates(events: DataFrame, cfg: GemConfig, days: Sequence[str]) -> dict[str, dict[str, int]]:
    """One Spark pass over the days' events, grouped by ds: day -> row count, impressions and clicks
    per surface, scoped null counts (all 0 for a day without rows)."""
    def count_where(cond: Any) -> Any:
        return F.sum(F.when(cond, 1).otherwise(0))

    exprs = {"rows": F.count(F.lit(1))}
    for s in cfg.surfaces:
        on_surface = F.col("surface") == s
        exprs[f"impressions:{s}"] = count_where(on_surface & (F.col("event_type") == IMPRESSION))
        exprs[f"clicks:{s}"] = count_where(on_surface & (F.col("event_type") == CLICK))
    for c in nullable_event_columns():
        scope = F.expr(cfg.quality.null_rate_scopes.get(c, "true"))
        exprs[f"scoped:{c}"] = count_where(scope)
        exprs[f"nulls:{c}"] = count_where(scope & F.col(c).isNull())
    grouped = events.groupBy("ds").agg(*[e.alias(n) for n, e in exprs.items()])
    found = {str(r["ds"]): r.asDict() for r in grouped.collect()}
    return {day: {n: int(found.get(day, {}).get(n) or 0) for n in exprs} for day in days}


def _ratio(numerator: int, denominator: int) -> float | None:
    """None when there is nothing to divide by (GX then skips the value instead of passing 0)."""
    return numerator / denominator if denominator else None


def event_statistics(
    events: DataFrame,
    ingest_records: Mapping[str, Mapping[str, Any]],
    quarantine_rows: Mapping[str, int],
    cfg: GemConfig,
) -> dict[str, dict[str, int | float | None]]:
    """The statistics `event_statistics_expectations` bound, per day of bronze.ad_events, in one
    Spark pass over `events` (the rows of those days).

    `ingest_records`: day -> ingest_events' completion record of that day (the days validated);
    `quarantine_rows`: day -> its row count in bronze.quarantine. A rate with nothing to divide by
    (e.g. a surface without impressions) is None, which GX reports as missing rather than passing as 0.
    """
    aggregates = _event_aggregates(events, cfg, sorted(ingest_records))
    return {day: _day_statistics(aggregates[day], record, quarantine_rows.get(day, 0), cfg)
            for day, record in sorted(ingest_records.items())}


def _day_statistics(agg: Mapping[str, int], ingest_record: Mapping[str, Any], quarantine_rows: int,
                    cfg: GemConfig) -> dict[str, int | float | None]:
    rows_in = int(ingest_record["rows_in"])
    by_reason = ingest_record.get("quarantined_by_reason") or {}
    values: dict[str, int | float | None] = {ROWS_VALIDATED: agg["rows"]}
    for s in cfg.surfaces:
        values[ctr_column(s)] = _ratio(agg[f"clicks:{s}"], agg[f"impressions:{s}"])
    for c in nullable_event_columns():
        values[null_rate_column(c)] = _ratio(agg[f"nulls:{c}"], agg[f"scoped:{c}"])
    values[DUPLICATE_RATE] = _ratio(int(by_reason.get(DUPLICATE_REASON, 0)), rows_in)
    values[QUARANTINE_RATE] = _ratio(int(ingest_record["rows_quarantined"]), rows_in)
    values[BRONZE_ROWS_MINUS_RECORD] = agg["rows"] - int(ingest_record["rows_written"])
    values[QUARANTINE_ROWS_MINUS_RECORD] = quarantine_rows - int(ingest_record["rows_quarantined"])
    return values


def statistics_frame(statistics: Mapping[str, Mapping[str, int | float | None]]) -> pd.DataFrame:
    """day -> statistics as a pandas DataFrame with one row per day (oldest first): `ds`, then one
    column per statistic (integers as int64, the rest as float64 with None as NaN), so one suite run
    bounds every day of a range. Pandas, not Spark: GX validates it in a fraction of the time."""
    days = sorted(statistics)
    names = list(statistics[days[0]]) if days else []

    def column(name: str) -> pd.Series:
        values = [statistics[day][name] for day in days]
        return pd.Series(values, dtype="int64" if all(isinstance(v, int) for v in values) else "float64")

    return pd.DataFrame({"ds": pd.Series(days, dtype="string"), **{name: column(name) for name in names}})


def event_statistics_frame(
    events: DataFrame,
    ingest_records: Mapping[str, Mapping[str, Any]],
    quarantine_rows: Mapping[str, int],
    cfg: GemConfig,
) -> pd.DataFrame:
    """`event_statistics` as the frame the statistics suite validates, one row per day."""
    return statistics_frame(event_statistics(events, ingest_records, quarantine_rows, cfg))

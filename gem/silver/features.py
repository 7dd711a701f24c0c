"""silver.user_features and silver.ad_features rows of a day (or a range of days): the feature days,
the daily counts, the window counters and the feature rows (jobs/build_features.py reads and commits).

Semantics (schemas/features.py): partition ds=D counts impressions, clicks and conversions per
user and per ad over EVENT-TIME windows [D-w 00:00 UTC, D 00:00 UTC) for w in 1, 7, 28, overall
and per surface, plus CTR and CVR; ad rows also carry the ad's latest attributes.

Which bronze partitions count: arrival days ds in [max(D-28, start_ds), D-1]. This range is exact:
  * an event that arrived on D or later is not known at the end of D-1, so it must not count,
    even when its event_time is earlier (it is in bronze ds >= D, which is never read);
  * an event whose event_time is in the 28-day window cannot have arrived before D-28, because
    ingest quarantines events that happen after their arrival day (`event_after_arrival`); so
    late events inside the window are all read, whatever day up to D-1 they arrived on;
  * days before start_ds belong to no run of this pipeline (earlier experiments): not read.

State: silver.user_daily_counts and silver.ad_daily_counts. Partition A holds the events that
arrived on A, counted per entity and EVENT day (schemas/features.py). Every window is a sum of them.

Two ways to the same rows (tests/spark/test_build_features.py checks they agree where windows lose days):
  * incremental (advance_user_counters), the daily run: the daily counts of ONE bronze day, D-1, then
      users: counters(D) = counters(D-1) + the daily counts entering each window - those leaving it.
        Entering the w-day window: arrived on D-1 with event_day in [D-w, D-1]. Leaving it: event_day
        D-1-w, arrived by D-2 (exactly what counters(D-1) counted of that day). The 1-day window is
        replaced rather than updated: all of its events arrived on D-1. Users left with no event in
        28 days drop out. This rests on ingest's rule above: no event happens after its arrival day;
      ads: the sums of the window's daily counts (a few rows per ad and day: cheap).
  * full (window_counters): the daily counts of every arrival day in the window, summed. For a range
    of target days, each daily-count row (arrival A, event day E) counts for the target days
    [A+1, E+28]; the daily full build is the one-day range of the same code.
"""

from __future__ import annotations

from functools import reduce
from operator import add

from pyspark.sql import Column as SparkColumn
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from gem.config import GemConfig
from gem.days import day_range, shift_day
from gem.lakehouse.stages import feature_window_days
from schemas.features import (
    AD_METADATA_COLUMNS,
    COUNT_METRICS,
    RATE_METRICS,
    SCOPES,
    SILVER_AD_DAILY_COUNTS,
    SILVER_USER_DAILY_COUNTS,
    WINDOW_DAYS,
    counter_name,
    daily_count_name,
)
from schemas.table import TableSchema
from schemas.tasks import SURFACES

LONGEST_WINDOW_DAYS = max(WINDOW_DAYS)


# --------------------------------------------------------------------------------------------------
# Which bronze days a build reads.


def bronze_days(cfg: GemConfig, ds: str, through: str | None = None) -> list[str]:
    """Arrival days the build of `ds` (or of every day of ds..through) reads, oldest first:
    [max(ds-28, start_ds), through-1] (the union of the registry's day rule over the days, so the
    declared needs and writes are these days).

    Example: start_ds 2026-01-01, ds 2026-01-03 -> ["2026-01-01", "2026-01-02"]; ds = start_ds -> [];
    ds = start_ds, through 2026-01-03 -> ["2026-01-01", "2026-01-02"].
    """
    return sorted({a for day in day_range(ds, through or ds) for a in feature_window_days(cfg, day)})


# --------------------------------------------------------------------------------------------------
# Pure transforms.


def _day(ds: str, days_before: int = 0) -> SparkColumn:
    return F.lit(shift_day(ds, -days_before)).cast("date")


def _daily_names() -> list[str]:
    return [daily_count_name(m, s) for s in SURFACES for m in COUNT_METRICS.values()]


def _per_surface_names() -> list[str]:
    """The 54 per-surface window counters (window, surface, metric), the all-surfaces ones excluded."""
    return [counter_name(m, w, s) for w in WINDOW_DAYS for s in SURFACES for m in COUNT_METRICS.values()]


def daily_counts(bronze: DataFrame, key: str) -> DataFrame:
    """bronze.ad_events rows of some arrival days -> silver.user_daily_counts (key "user_id") or
    silver.ad_daily_counts (key "ad_id") rows: one per (ds, key, event_day).

    Example: u1's 3 reels impressions and 1 click on 2026-01-05, and a late click of 2026-01-04,
    all arrived on 2026-01-05 ->
        {"ds": 2026-01-05, "user_id": "u1", "event_day": 2026-01-05, "reels_impressions": 3, "reels_clicks": 1, ...0}
        {"ds": 2026-01-05, "user_id": "u1", "event_day": 2026-01-04, "reels_clicks": 1, ...0}
    Ad rows also carry the attributes of their latest event (max of a struct compares field by
    field, so (event_time, event_id) first makes it "latest").
    """
    schema = SILVER_AD_DAILY_COUNTS if key == "ad_id" else SILVER_USER_DAILY_COUNTS
    events = bronze.withColumn("event_day", F.to_date("event_time"))  # the session time zone is UTC (gem.lakehouse.spark)
    # Never true after ingest (event_after_arrival); dropped so that no window counts an event
    # before it arrived, whichever way the counters are computed.
    events = events.where(F.col("event_day") <= F.col("ds"))
    aggs = [
        F.sum(F.when((F.col("surface") == s) & (F.col("event_type") == t), 1).otherwise(0)).cast("long")
        .alias(daily_count_name(m, s))
        for s in SURFACES for t, m in COUNT_METRICS.items()
    ]
    if key == "ad_id":
        aggs.append(F.max(F.struct("event_time", "event_id", *AD_METADATA_COLUMNS)).alias("_latest"))
    rows = events.groupBy("ds", key, "event_day").agg(*aggs)
    if key == "ad_id":
        latest = [F.col("_latest.event_time").alias("latest_event_time"), F.col("_latest.event_id").alias("latest_event_id")]
        rows = rows.select("*", *latest, *[F.col(f"_latest.{c}").alias(c) for c in AD_METADATA_COLUMNS])
    return rows.select(*schema.column_names)


def _spread(daily: DataFrame, key: str, factors: dict[int, SparkColumn], extra: tuple[str, ...] = ()) -> DataFrame:
    """daily-count rows -> (key, 54 per-surface window counters, *extra): counter (m, w, s) is the
    row's count of (m, s) times factors[w] (1 in the window, -1 leaving it, 0 otherwise).

    Why the factors are columns of their own: inlined into 54 expressions, the window tests make
    Spark's generated code too large to compile, and the interpreted fallback is much slower.
    """
    flagged = daily.select(key, *_daily_names(), *extra, *[f.alias(f"_f{w}") for w, f in factors.items()])
    return flagged.select(
        key, *extra,
        *[(F.col(daily_count_name(m, s)) * F.col(f"_f{w}")).alias(counter_name(m, w, s))
          for w in WINDOW_DAYS for s in SURFACES for m in COUNT_METRICS.values()],
    )


def _summed(rows: DataFrame, keys: tuple[str, ...], extra_aggs: tuple[SparkColumn, ...] = ()) -> DataFrame:
    """Sum the per-surface counters per `keys` (the entity first), on rows the caller has already
    repartitioned by the entity.

    Why repartition by the entity first: the group-by then finds its input clustered and needs no
    shuffle of its own; for one day, it skips a partial aggregation that, with one or two rows per
    user, only copies the rows and costs time; for a range, the shuffle moves each daily-count row
    once, before it is spread over its target days."""
    sums = [F.sum(n).cast("long").alias(n) for n in _per_surface_names()]
    return rows.groupBy(*keys).agg(*sums, *extra_aggs)


def window_counters(daily: DataFrame, key: str, first: str, last: str | None = None) -> DataFrame:
    """daily counts of the arrival days in [max(first-28, start_ds), last-1] -> one row per target
    day D in [first, last] (last defaults to first) and entity with an event in D's 28-day window:
    ds=D, the 54 per-surface counters (and, for ads, `_latest`).

    A daily-count row (arrival A, event day E; A >= E, see daily_counts) counts for the days D with
    A <= D-1 (known by the end of D-1) and E >= D-28, i.e. D in [A+1, E+28], in the w-day window
    when E >= D-w. Example: a click of E=01-03 that arrived on A=01-05 counts for D=01-06 .. 01-31:
    in clicks_7d for D <= 01-10, in clicks_1d never (D-1 = E would need D=01-04 < A+1).
    """
    start = F.greatest(F.date_add("ds", 1), _day(first))
    stop = F.least(F.date_add("event_day", LONGEST_WINDOW_DAYS), _day(last or first))
    rows = daily.where(start <= stop)
    if key == "ad_id":
        latest = F.struct("latest_event_time", "latest_event_id", *AD_METADATA_COLUMNS).alias("_latest")
        rows = rows.select("*", latest)
    # Explode after the shuffle: each row travels once, and its target days stay in its partition.
    targets = rows.repartition(key).select("*", F.explode(F.sequence(start, stop)).alias("_target"))
    factors = {w: (F.col("event_day") >= F.date_sub("_target", w)).cast("long") for w in WINDOW_DAYS}
    if key == "ad_id":
        spread = _spread(targets, key, factors, extra=("_target", "_latest"))
        summed = _summed(spread, (key, "_target"), (F.max("_latest").alias("_latest"),))
    else:
        summed = _summed(_spread(targets, key, factors, extra=("_target",)), (key, "_target"))
    return summed.withColumnRenamed("_target", "ds")


def advance_user_counters(previous: DataFrame, daily: DataFrame, ds: str) -> DataFrame:
    """silver.user_features rows of ds-1 + user daily counts of the arrival days in
    [max(ds-29, start_ds), ds-1] -> ds and the 54 per-surface counters of ds, one row per user with
    an event in the 28-day window (the rule is in the module docstring).

    Example, 7-day window, ds=2026-01-10: u1 had reels_clicks_7d 3 on 2026-01-09; 1 click arrived on
    2026-01-09 (event_day 01-09: entering), and 2 of the 3 happened on 2026-01-02 (leaving) -> 3 + 1 - 2 = 2.
    """
    arrived_last = F.col("ds") == _day(ds, 1)
    counted_before = F.col("ds") <= _day(ds, 2)
    factors = {
        w: F.when(arrived_last & (F.col("event_day") >= _day(ds, w)) & (F.col("event_day") < _day(ds, 0)), 1)
        .when(counted_before & (F.col("event_day") == _day(ds, w + 1)) & F.lit(w > 1), -1)
        .otherwise(0)
        for w in WINDOW_DAYS
    }
    leaving_days = [_day(ds, w + 1) for w in WINDOW_DAYS if w > 1]
    changes = daily.where(arrived_last | F.col("event_day").isin(*leaving_days))
    replaced = {counter_name(m, 1, s) for s in SURFACES for m in COUNT_METRICS.values()}  # the 1-day window
    carried = previous.select(
        "user_id", *[F.lit(0).cast("long").alias(n) if n in replaced else F.col(n) for n in _per_surface_names()]
    )
    summed = _summed(carried.unionByName(_spread(changes, "user_id", factors)).repartition("user_id"), ("user_id",))
    in_28_days = [F.col(counter_name(m, LONGEST_WINDOW_DAYS, s)) for s in SURFACES for m in COUNT_METRICS.values()]
    return summed.where(reduce(add, in_28_days) > 0).withColumn("ds", _day(ds))


def _rate(rate: str, window_days: int, surface: str | None) -> SparkColumn:
    """numerator / denominator of already aggregated counters; null when the denominator is 0."""
    num, den = RATE_METRICS[rate]
    numerator = F.col(counter_name(num, window_days, surface))
    denominator = F.col(counter_name(den, window_days, surface))
    ratio = F.when(denominator > 0, numerator.cast("double") / denominator)
    return ratio.alias(counter_name(rate, window_days, surface))


def _all_surface_counts() -> list[SparkColumn]:
    """Counters of the all-surfaces scope: the sum of the per-surface counters."""
    return [
        reduce(add, [F.col(counter_name(metric, w, s)) for s in SURFACES]).alias(counter_name(metric, w))
        for w in WINDOW_DAYS for metric in COUNT_METRICS.values()
    ]


def _all_rates() -> list[SparkColumn]:
    return [_rate(r, w, s) for w in WINDOW_DAYS for s in SCOPES for r in RATE_METRICS]


def feature_rows(per_surface: DataFrame, schema: TableSchema) -> DataFrame:
    """Per-surface counters of some days (window_counters / advance_user_counters) -> rows of
    `schema`: the all-surfaces counters, the rates, and for ads the latest attributes.

    Example: u1 with 4 impressions and 1 click on reels on ds-1 ->
        {"ds": ds, "user_id": "u1", "impressions_1d": 4, "clicks_1d": 1, "ctr_1d": 0.25,
         "cvr_1d": 0.0, "reels_impressions_1d": 4, "fb_feed_impressions_1d": 0, "fb_feed_ctr_1d": None, ...}
    """
    counted = per_surface.select("*", *_all_surface_counts())
    metadata = [F.col(f"_latest.{c}").alias(c) for c in AD_METADATA_COLUMNS] if "_latest" in per_surface.columns else []
    rows = counted.select("*", *metadata, *_all_rates())
    return rows.select(*schema.column_names)

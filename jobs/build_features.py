"""Build one day of silver.user_features and silver.ad_features: counters as of the end of ds-1.

`python -m jobs.build_features --ds YYYY-MM-DD [--config FILE] [--full]`

Semantics (schemas/features.py): partition ds=D counts impressions, clicks and conversions per
user and per ad over EVENT-TIME windows [D-w 00:00 UTC, D 00:00 UTC) for w in 1, 7, 28, overall
and per surface, plus CTR and CVR; ad rows also carry the ad's latest attributes. An event counts
once it is KNOWN: it arrived (bronze ds) by D-1.

Incremental (every day after start_ds): the feature state of D-1 (silver.*_feature_state: per
entity, counts per event day of the events known by the end of D-2, for event days in [D-29, D-2])
plus the one bronze day D-1 gives the state of D: the day's arrivals add to their event days (a
late event to its own, earlier day), the day that left the 28-day window is dropped. The state is
updated where it is scanned (the day's arrivals are broadcast to it), never shuffled; the counters
are then sums over the state's days. Cost: one bronze day and one pass over the state, not 28 days.

--full (and start_ds): the state from arrival days [max(D-28, start_ds), D-1] of bronze. This
range is exact:
  * an event that arrived on D or later is not known at the end of D-1, so it must not count,
    even when its event_time is earlier (it is in bronze ds >= D, which is never read);
  * an event whose event_time is in the 28-day window cannot have arrived before D-28, because
    ingest quarantines events that happen after their arrival day (`event_after_arrival`); so
    late events inside the window are all read, whatever day up to D-1 they arrived on;
  * days before start_ds belong to no run of this pipeline (earlier experiments): not read.
Both paths give the same rows (tests/test_build_features.py builds 10 days both ways).

Flow (the transforms are pure; I/O is the thin shell around them):
  gate: validate_events records for the bronze days read; incremental: build_features of D-1;
  bronze --> window_events --> state_rows (counts per entity and event day)
         --> [incremental: advance_state(state of D-1, those rows)] --> state of D
         --> features_from_state (window sums, all-surface sums, rates);
  commit: withdraw the (build_features, D) record; replace the state and features partitions ds=D;
  publish the record LAST. A rerun reads only ds-1's state and bronze: identical contents.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gem.cli import job_parser, shift_day
from gem.config import GemConfig, load_config
from schemas.events import BRONZE_AD_EVENTS
from schemas.features import (
    AD_METADATA_COLUMNS,
    COUNT_METRICS,
    DAY_COUNTERS,
    RATE_METRICS,
    SCOPES,
    SILVER_AD_FEATURE_STATE,
    SILVER_AD_FEATURES,
    SILVER_USER_FEATURE_STATE,
    SILVER_USER_FEATURES,
    WINDOW_DAYS,
    counter_name,
    day_counter_name,
)
from schemas.tasks import SURFACES
from schemas.ops import COMPLETIONS

if TYPE_CHECKING:
    from pyspark.sql import Column as SparkColumn
    from pyspark.sql import DataFrame, SparkSession

STAGE = "build_features"
VALIDATE_STAGE = "validate_events"
LONGEST_WINDOW_DAYS = max(WINDOW_DAYS)


@dataclass(frozen=True)
class BuildResult:
    ds: str
    users: int  # rows written to silver.user_features ds
    ads: int  # rows written to silver.ad_features ds
    table_versions: dict[str, int]
    seconds: float
    incremental: bool = False  # updated from the previous day's state (else from the whole window)


# --------------------------------------------------------------------------------------------------
# Which bronze days a build reads.


def bronze_days(cfg: GemConfig, ds: str) -> list[str]:
    """Arrival days the build of `ds` reads, oldest first: [max(ds-28, start_ds), ds-1].

    Example: start_ds 2026-01-01, ds 2026-01-03 -> ["2026-01-01", "2026-01-02"]; ds = start_ds -> [].
    """
    first = max(shift_day(ds, -LONGEST_WINDOW_DAYS), cfg.start_ds)
    days = []
    day = first
    while day < ds:
        days.append(day)
        day = shift_day(day, 1)
    return days


# --------------------------------------------------------------------------------------------------
# Pure transforms.


def window_events(bronze: DataFrame, ds: str) -> DataFrame:
    """bronze.ad_events rows (already limited to the arrival days read) -> the events in the longest
    window of ds, narrowed to what the state needs.

    Example output row for ds=2026-01-08, an event at 2026-01-05 10:00:
        {"user_id": "u1", "ad_id": "a7", "surface": "reels", "event_type": "click",
         "event_time": 2026-01-05 10:00, "event_id": "e1", "advertiser_id": "adv3", ...}
    """
    from pyspark.sql import functions as F

    def day_start(days_before: int) -> SparkColumn:
        # The session time zone is UTC (gem.spark), so this is midnight UTC.
        return F.lit(f"{shift_day(ds, -days_before)} 00:00:00").cast("timestamp")

    # event_time < D holds already for events that arrived by D-1 (ingest rejects events after
    # their arrival day); kept so the point-in-time rule does not rest on another stage alone.
    in_window = (F.col("event_time") >= day_start(LONGEST_WINDOW_DAYS)) & (F.col("event_time") < day_start(0))
    return bronze.where(in_window).select(
        "user_id", "ad_id", "surface", "event_type", "event_time", "event_id", *AD_METADATA_COLUMNS)


def _rate(rate: str, window_days: int, surface: str | None) -> SparkColumn:
    """numerator / denominator of already aggregated counters; null when the denominator is 0."""
    from pyspark.sql import functions as F

    num, den = RATE_METRICS[rate]
    numerator = F.col(counter_name(num, window_days, surface))
    denominator = F.col(counter_name(den, window_days, surface))
    ratio = F.when(denominator > 0, numerator.cast("double") / denominator)
    return ratio.alias(counter_name(rate, window_days, surface))


def _with_ds(rows: DataFrame, ds: str) -> DataFrame:
    from pyspark.sql import functions as F

    return rows.withColumn("ds", F.lit(ds).cast("date"))


def _day_count(event_type: str, surface: str) -> SparkColumn:
    """Events of `event_type` on `surface` among a group's events (one event day of one entity)."""
    from pyspark.sql import functions as F

    hit = (F.col("event_type") == event_type) & (F.col("surface") == surface)
    return F.sum(hit.cast("long")).alias(day_counter_name(COUNT_METRICS[event_type], surface))


def _latest_ad_metadata() -> SparkColumn:
    """The ad's attributes on its latest event (ties on event_time broken by event_id): max() of a
    struct compares field by field, so (event_time, event_id) first makes it "latest"."""
    from pyspark.sql import functions as F

    return F.max(F.struct("event_time", "event_id", *AD_METADATA_COLUMNS)).alias("latest")


def state_rows(events: DataFrame, key: str) -> DataFrame:
    """window_events rows -> one state row per entity: (key, days[, latest]) as in
    silver.user_feature_state / silver.ad_feature_state (without ds).

    Users are hash-partitioned by user_id first, so both group-bys (per event day, then per user)
    find their input clustered and neither adds a shuffle; the ads are few, their partial
    aggregates small, so they are not.
    """
    from pyspark.sql import functions as F

    is_ad = key == "ad_id"
    if not is_ad:
        events = events.select(key, "surface", "event_type", "event_time").repartition(key)
    counts = [_day_count(t, s) for s in SURFACES for t in COUNT_METRICS]
    per_day = events.groupBy(key, F.to_date("event_time").alias("event_day")).agg(
        *counts, *([_latest_ad_metadata()] if is_ad else []))
    # array_sort orders the structs by their first field, event_day: oldest first.
    days = F.array_sort(F.collect_list(F.struct("event_day", *DAY_COUNTERS))).alias("days")
    return per_day.groupBy(key).agg(days, *([F.max("latest").alias("latest")] if is_ad else []))


def _merged_days(old: SparkColumn, new: SparkColumn, first_day: SparkColumn) -> SparkColumn:
    """Two `days` arrays (either may be null) -> one, counts of the same event day added, days before
    `first_day` dropped, oldest first."""
    from pyspark.sql import functions as F

    both = F.concat(F.coalesce(old, F.array()), F.coalesce(new, F.array()))
    event_days = F.array_distinct(F.transform(both, lambda x: x["event_day"]))

    def add(field: str) -> Any:  # Spark counts a lambda's parameters: bind `field` outside it
        return lambda acc, x: acc + x[field]

    def day_total(day: SparkColumn) -> SparkColumn:
        same = F.filter(both, lambda x: x["event_day"] == day)
        sums = [F.aggregate(same, F.lit(0).cast("long"), add(c)).alias(c) for c in DAY_COUNTERS]
        return F.struct(day.alias("event_day"), *sums)

    kept = F.filter(F.transform(event_days, day_total), lambda x: x["event_day"] >= first_day)
    return F.array_sort(kept)


def advance_state(previous: DataFrame, arrivals: DataFrame, key: str, ds: str) -> DataFrame:
    """The state of ds-1 (events known by the end of ds-2) + state_rows of the events that ARRIVED
    on ds-1 -> the state of ds (events known by the end of ds-1), without ds.

    Entities already in the state are updated where they are scanned: the day's arrivals are
    broadcast to them (a few MB per million users), so the state is never shuffled. Entities seen
    for the first time are the arrivals without a state row (an anti join on the narrow keys).
    A day leaves the state when it leaves the longest window; an entity with no day left leaves too.
    """
    from pyspark.sql import functions as F

    first_day = F.lit(shift_day(ds, -LONGEST_WINDOW_DAYS)).cast("date")
    is_ad = key == "ad_id"
    new = arrivals.select(key, F.col("days").alias("new_days"), *([F.col("latest").alias("new_latest")] if is_ad else []))
    known = previous.join(F.broadcast(new), key, "left")
    first_seen = new.join(previous.select(key), key, "left_anti")
    rows = known.unionByName(first_seen, allowMissingColumns=True)
    out = [F.col(key), _merged_days(F.col("days"), F.col("new_days"), first_day).alias("days")]
    if is_ad:  # greatest() skips nulls; the latest event leaves the window only with all the others
        out.append(F.greatest(F.col("latest"), F.col("new_latest")).alias("latest"))
    return rows.select(*out).where(F.size("days") > 0)


def _window_count(metric: str, window_days: int, surface: str, ds: str) -> SparkColumn:
    """One counter of ds from the state: the surface's `metric` summed over event days >= ds - w."""
    from pyspark.sql import functions as F

    since = F.lit(shift_day(ds, -window_days)).cast("date")
    in_window = F.filter("days", lambda x: x["event_day"] >= since)
    field = day_counter_name(metric, surface)
    return F.aggregate(in_window, F.lit(0).cast("long"), lambda acc, x: acc + x[field]).alias(
        counter_name(metric, window_days, surface))


def _all_surface_counts() -> list[SparkColumn]:
    """Counters of the all-surfaces scope: the sum of the per-surface counters."""
    from functools import reduce
    from operator import add

    from pyspark.sql import functions as F

    return [
        reduce(add, [F.col(counter_name(metric, w, s)) for s in SCOPES if s is not None]).alias(counter_name(metric, w))
        for w in WINDOW_DAYS for metric in COUNT_METRICS.values()
    ]


def _all_rates() -> list[SparkColumn]:
    return [_rate(r, w, s) for w in WINDOW_DAYS for s in SCOPES for r in RATE_METRICS]


def features_from_state(state: DataFrame, key: str, ds: str) -> DataFrame:
    """State rows of ds -> silver.user_features (key "user_id") or silver.ad_features ("ad_id") rows of ds.

    Example: u1 with 4 impressions and 1 click on reels on ds-1 ->
        {"ds": ds, "user_id": "u1", "impressions_1d": 4, "clicks_1d": 1, "ctr_1d": 0.25,
         "cvr_1d": 0.0, "reels_impressions_1d": 4, "fb_feed_impressions_1d": 0, "fb_feed_ctr_1d": None, ...}
    """
    from pyspark.sql import functions as F

    schema = SILVER_AD_FEATURES if key == "ad_id" else SILVER_USER_FEATURES
    counts = [_window_count(m, w, s, ds) for w in WINDOW_DAYS for s in SURFACES for m in COUNT_METRICS.values()]
    metadata = [F.col(f"latest.{c}").alias(c) for c in AD_METADATA_COLUMNS] if key == "ad_id" else []
    per_surface = state.select(key, *metadata, *counts)
    counted = per_surface.select("*", *_all_surface_counts())
    return _with_ds(counted.select("*", *_all_rates()), ds).select(*schema.column_names)


# --------------------------------------------------------------------------------------------------
# Thin I/O.


def require_inputs(spark: SparkSession, cfg: GemConfig, ds: str, days: list[str]) -> None:
    """Every bronze day the build reads passed data quality.

    One read of the completions table for the whole window rather than one per day.
    """
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    from gem import lakehouse

    if ds < cfg.start_ds:
        raise ValueError(f"{STAGE} ds={ds} is before the pipeline's start_ds={cfg.start_ds}")
    if not days:
        return
    completed: set[str] = set()
    path = lakehouse.table_path(cfg, COMPLETIONS)
    if DeltaTable.isDeltaTable(spark, path):
        rows = (
            spark.read.format("delta").load(path)
            .where(F.col("stage") == VALIDATE_STAGE)
            .where(F.col("ds").between(F.lit(days[0]).cast("date"), F.lit(days[-1]).cast("date")))
            .select("ds").collect()
        )
        completed = {r["ds"].isoformat() for r in rows}
    missing = [d for d in days if d not in completed]
    if missing:
        raise lakehouse.MissingInputError(
            f"{STAGE} ds={ds} reads bronze ds {days[0]}..{days[-1]}, which must have passed data quality: "
            f"input not ready: stage {VALIDATE_STAGE!r} has no completion record for ds={', '.join(missing)} "
            f"in {path}; run `python -m jobs.{VALIDATE_STAGE} --ds {missing[0]}` first"
        )


def require_previous_state(spark: SparkSession, cfg: GemConfig, ds: str) -> None:
    """The incremental update of ds needs the state of ds-1, published by build_features ds-1."""
    from gem import lakehouse

    prev = shift_day(ds, -1)
    hint = f"build ds={prev} first, or recompute ds={ds} from its whole window with --full"
    try:
        record = lakehouse.require_completed(spark, cfg, STAGE, prev)
    except lakehouse.MissingInputError as e:
        raise lakehouse.MissingInputError(f"{STAGE} ds={ds} updates the feature state of ds={prev}: {e}; {hint}") from e
    written = set(record["table_versions"] or {})
    lacking = sorted({SILVER_USER_FEATURE_STATE.name, SILVER_AD_FEATURE_STATE.name} - written)
    if lacking:
        raise lakehouse.MissingInputError(
            f"{STAGE} ds={ds} updates the feature state of ds={prev}, but that build wrote no {lacking}; {hint}")


def _bronze_days(spark: SparkSession, cfg: GemConfig, days: list[str]) -> DataFrame:
    """bronze.ad_events rows of the arrival days read (partition-pruned); none when there are none."""
    from pyspark.sql import functions as F

    from gem import lakehouse

    if not days:
        return spark.createDataFrame([], BRONZE_AD_EVENTS.spark_schema())
    bronze = lakehouse.read_table(spark, cfg, BRONZE_AD_EVENTS)
    return bronze.where(F.col("ds").between(F.lit(days[0]).cast("date"), F.lit(days[-1]).cast("date")))


ENTITIES = (  # (key, state table, features table)
    ("user_id", SILVER_USER_FEATURE_STATE, SILVER_USER_FEATURES),
    ("ad_id", SILVER_AD_FEATURE_STATE, SILVER_AD_FEATURES),
)


def run(cfg: GemConfig, ds: str, spark: SparkSession | None = None, full: bool = False) -> BuildResult:
    """Build ds. Incremental (the default after start_ds): the state of ds-1 + the bronze day ds-1.
    full=True: the state from every bronze day of the longest window (backfills, repairs; the same rows)."""
    from pyspark.sql import functions as F

    from gem import lakehouse
    from gem.spark import get_spark

    t0 = time.time()
    spark = spark or get_spark(cfg, app_name=f"{STAGE}:{ds}")
    incremental = not full and ds != cfg.start_ds
    days = [shift_day(ds, -1)] if incremental else bronze_days(cfg, ds)
    require_inputs(spark, cfg, ds, days)
    if incremental:
        require_previous_state(spark, cfg, ds)
    run_id = lakehouse.new_run_id(STAGE, ds)

    events = window_events(_bronze_days(spark, cfg, days), ds)
    lakehouse.clear_completion(spark, cfg, STAGE, ds)
    meta = json.dumps({"run_id": run_id, "stage": STAGE, "ds": ds})
    day = F.lit(ds).cast("date")
    versions, rows = {}, {}
    for key, state_schema, features_schema in ENTITIES:
        state = state_rows(events, key)
        if incremental:
            previous = lakehouse.read_table(spark, cfg, state_schema).where(F.col("ds") == F.lit(days[0]).cast("date"))
            state = advance_state(previous.drop("ds"), state, key, ds)
        # The state is computed once, by its write; the features are then read off the written state.
        versions[state_schema.name] = lakehouse.replace_partition(
            _with_ds(state, ds).select(*state_schema.column_names), cfg, state_schema, {"ds": ds}, meta)
        written = lakehouse.read_table(spark, cfg, state_schema, version=versions[state_schema.name])
        versions[features_schema.name] = lakehouse.replace_partition(
            features_from_state(written.where(F.col("ds") == day), key, ds), cfg, features_schema, {"ds": ds}, meta)
        rows[key] = lakehouse.rows_committed(spark, cfg, features_schema, versions[features_schema.name])
    n_users, n_ads = rows["user_id"], rows["ad_id"]
    # rows_in counts the entities (users + ads) in the state: each becomes exactly one row.
    lakehouse.publish_completion(spark, cfg, STAGE, ds, run_id, n_users + n_ads, n_users + n_ads, {}, versions)
    return BuildResult(ds, n_users, n_ads, versions, time.time() - t0, incremental)


def main(argv: list[str] | None = None) -> int:
    parser = job_parser(__doc__.splitlines()[0])
    parser.add_argument("--full", action="store_true",
                        help="recompute from every bronze day of the 28-day window, not from ds-1's state")
    args = parser.parse_args(argv)
    cfg = load_config(args.config)
    result = run(cfg, args.ds, full=args.full)
    how = "incremental" if result.incremental else "full window"
    print(
        f"{STAGE} ds={result.ds} ({how}): users={result.users} ads={result.ads} "
        f"versions={result.table_versions} in {result.seconds:.1f}s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

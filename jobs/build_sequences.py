"""Build one day of silver.user_sequences from bronze.ad_events: each active user's capped sequences.

`python -m jobs.build_sequences --ds YYYY-MM-DD [--config FILE]`

Layout (schemas/sequences.py): partition ds=D holds ONLY users with events in bronze ds=D, with
their full capped sequences as of the end of D. A user's snapshot for day D is their row with the
greatest ds <= D; users without events on D keep their earlier row and are not rewritten.

Flow (the transform is pure; I/O is the thin shell around it):
  gate: completion of validate_events for D, and of build_sequences for D-1 unless D == start_ds;
  bronze ds=D --> the users present on D --> each one's latest previous row (greatest ds < D),
  looked up in the last compaction C < D plus the daily partitions (C, D), not the whole history;
  merge_sequences(previous, day events, caps): per type, old sequence + new events (dedup on
  event_id), sorted by (event_time, event_id), last `cap` kept;
  commit (gem.lakehouse.commit.StageCommit): withdraw the (build_sequences, D) record; replace silver ds=D;
  on a compaction day (every `sequence_compaction_days` from start_ds) also write every user's
  snapshot as of D to silver.user_sequences_compacted ds=D; publish the record LAST, naming both
  versions (a reader uses a compaction only when the record of its day names it).

A rerun reads only rows with ds < D (and a compaction before D), so it rewrites ds=D, and the
compaction of D, with identical contents.
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

from gem.cli import job_parser, shift_day
from gem.config import GemConfig, SequenceCaps, load_config
from gem.lakehouse.commit import StageCommit, StageContext, StageResult
from schemas.events import BRONZE_AD_EVENTS
from schemas.sequences import (
    SEQUENCE_COLUMNS,
    SEQUENCE_FIELDS,
    SILVER_USER_SEQUENCES,
    SILVER_USER_SEQUENCES_COMPACTED,
)

if TYPE_CHECKING:
    from pyspark.sql import Column as SparkColumn
    from pyspark.sql import DataFrame, SparkSession

STAGE = "build_sequences"


# --------------------------------------------------------------------------------------------------
# The compaction schedule.


def _days_since_start(cfg: GemConfig, ds: str) -> int:
    import datetime as dt

    return (dt.date.fromisoformat(ds) - dt.date.fromisoformat(cfg.start_ds)).days


def is_compaction_day(cfg: GemConfig, ds: str) -> bool:
    """Whether the registry's schedule (gem.lakehouse.stages.compaction_days) compacts on ds. Example: start
    2026-01-01, every 7 -> 2026-01-07, 2026-01-14, ..."""
    from gem.lakehouse.stages import compaction_days

    return bool(compaction_days(cfg, ds))


def last_compaction_before(cfg: GemConfig, ds: str) -> str | None:
    """The latest compaction day < ds, or None (none yet, or compaction off)."""
    k, days = cfg.sequence_compaction_days, _days_since_start(cfg, ds)
    if k <= 0 or days < k:
        return None
    # Compaction days are start + (j*k - 1); the greatest one strictly before ds.
    j = days // k
    return shift_day(cfg.start_ds, j * k - 1)


# --------------------------------------------------------------------------------------------------
# Pure transforms.


def _cap(caps: SequenceCaps, event_type: str) -> int:
    return int(getattr(caps, event_type))


def day_sequences(day_events: "DataFrame") -> "DataFrame":
    """bronze rows of one ds -> one row per user: (user_id, ds, new_impressions, new_clicks,
    new_conversions, day_last_event_time), the new_* arrays unsorted structs shaped as in
    schemas/sequences.py. A repeated event_id within the day counts once."""
    from pyspark.sql import functions as F

    events = day_events.dropDuplicates(["event_id"])
    new_arrays = [
        # collect_list skips nulls, so each list holds only its own event type.
        F.collect_list(
            F.when(F.col("event_type") == event_type, F.struct(*[F.col(f) for f in fields]))
        ).alias(f"new_{SEQUENCE_COLUMNS[event_type][0]}")
        for event_type, fields in SEQUENCE_FIELDS.items()
    ]
    return events.groupBy("user_id", "ds").agg(*new_arrays, F.max("event_time").alias("day_last_event_time"))


def _merged_sequence(
    old: "SparkColumn", new: "SparkColumn", cap: int, empty_type: str
) -> tuple["SparkColumn", "SparkColumn"]:
    """(old capped sequence or null, today's events) -> (new capped sequence, number of events added).

    Today's events whose event_id already sits in the old sequence are dropped (a replay must not
    count twice). Sorting the union by (event_time, event_id) puts late events in place, and the
    last `cap` of that order equal the last `cap` of the user's whole history, because the old
    sequence already holds that history's last `cap`.
    """
    from pyspark.sql import functions as F

    old = F.coalesce(old, F.array().cast(empty_type))
    fresh = F.filter(new, lambda x: ~F.exists(old, lambda o: o["event_id"] == x["event_id"]))
    merged = F.sort_array(F.concat(old, fresh))
    start = F.greatest(F.size(merged) - F.lit(cap) + F.lit(1), F.lit(1))
    return F.slice(merged, start, F.lit(cap)), F.size(fresh)


def merge_sequences(previous: "DataFrame", day_events: "DataFrame", caps: SequenceCaps) -> "DataFrame":
    """Each user with events in `day_events` -> their silver.user_sequences row as of the end of its ds.

    previous: silver.user_sequences rows, at most one per user (their latest before ds); users not in
        day_events are ignored.
    day_events: bronze.ad_events rows of one ds.
    Returns rows with SILVER_USER_SEQUENCES columns, one per distinct user_id of day_events.
    """
    from pyspark.sql import functions as F

    today = day_sequences(day_events)
    prior = previous.select(
        "user_id",
        *[F.col(seq).alias(f"old_{seq}") for seq, _ in SEQUENCE_COLUMNS.values()],
        *[F.col(n).alias(f"old_{n}") for _, n in SEQUENCE_COLUMNS.values()],
        F.col("last_event_time").alias("old_last_event_time"),
    )
    joined = today.join(prior, "user_id", "left")

    out: list["SparkColumn"] = [F.col("ds"), F.col("user_id")]
    counts: list["SparkColumn"] = []
    for event_type, (seq, n) in SEQUENCE_COLUMNS.items():
        empty_type = SILVER_USER_SEQUENCES.column(seq).sql_type
        capped, added = _merged_sequence(F.col(f"old_{seq}"), F.col(f"new_{seq}"), _cap(caps, event_type), empty_type)
        out.append(capped.alias(seq))
        counts.append((F.coalesce(F.col(f"old_{n}"), F.lit(0)) + added).cast("long").alias(n))
    # greatest() skips nulls: a user seen for the first time has no old_last_event_time.
    last = F.greatest(F.col("old_last_event_time"), F.col("day_last_event_time")).alias("last_event_time")
    return joined.select(*out, *counts, last).select(*SILVER_USER_SEQUENCES.column_names)


def latest_rows(history: "DataFrame") -> "DataFrame":
    """silver rows (any days) -> each user's row with the greatest ds: the snapshots as of the last day.

    The max(ds) per user is found from the two narrow columns (user_id, ds); the wide rows are then
    kept by a broadcast join on those keys, filtered where they are scanned, never shuffled (a
    shuffle of every row's arrays costs more than the whole daily build).
    """
    from pyspark.sql import functions as F

    latest = history.select("user_id", "ds").groupBy("user_id").agg(F.max("ds").alias("ds"))
    return history.join(F.broadcast(latest), ["user_id", "ds"], "inner")


def latest_previous_rows(history: "DataFrame", users: "DataFrame", ds: str) -> "DataFrame":
    """silver rows, users (user_id) -> for each of those users, their row with the greatest ds < `ds`."""
    from pyspark.sql import functions as F

    before = history.where(F.col("ds") < F.lit(ds).cast("date"))
    return latest_rows(before.join(users, "user_id", "left_semi"))


# --------------------------------------------------------------------------------------------------
# Thin I/O.


def history_through(spark: "SparkSession", cfg: GemConfig, last_day: str, base_ds: str | None) -> "DataFrame":
    """Rows whose latest per user is each user's snapshot as of the end of `last_day`: the compaction
    of base_ds (a day <= last_day, used when its record exists) plus the daily partitions
    (base_ds, last_day]; without one, every daily partition <= last_day.

    With a compaction the scan is bounded by the users plus `sequence_compaction_days` days of
    active users, however long the history; without one it grows with every day built.
    """
    from pyspark.sql import functions as F

    from gem.lakehouse import tables

    daily = tables.read_table(spark, cfg, SILVER_USER_SEQUENCES).where(F.col("ds") <= F.lit(last_day).cast("date"))
    if base_ds is None or not has_compaction(cfg, base_ds):
        return daily
    base_day = F.lit(base_ds).cast("date")
    base = tables.read_table(spark, cfg, SILVER_USER_SEQUENCES_COMPACTED).where(F.col("ds") == base_day)
    return base.unionByName(daily.where(F.col("ds") > base_day))


def has_compaction(cfg: GemConfig, ds: str) -> bool:
    """Whether build_sequences' record of ds names a compaction it committed."""
    from gem.lakehouse import completions

    record = completions.completion(cfg, STAGE, ds)
    return record is not None and SILVER_USER_SEQUENCES_COMPACTED.name in record["table_versions"]


def _previous_rows(spark: "SparkSession", cfg: GemConfig, ds: str, users: "DataFrame") -> "DataFrame":
    from delta.tables import DeltaTable

    from gem.lakehouse import tables

    path = tables.table_path(cfg, SILVER_USER_SEQUENCES)
    # The first day starts fresh, whatever an earlier experiment left in the table.
    if ds == cfg.start_ds or not DeltaTable.isDeltaTable(spark, path):
        return spark.createDataFrame([], SILVER_USER_SEQUENCES.spark_schema())
    history = history_through(spark, cfg, shift_day(ds, -1), last_compaction_before(cfg, ds))
    return latest_previous_rows(history, users, ds)


def compact(spark: "SparkSession", commit: StageCommit) -> int:
    """Write every user's snapshot as of the end of ds to silver.user_sequences_compacted ds, in the
    day's commit; -> rows written (from the commit's metrics)."""
    from pyspark.sql import functions as F

    cfg, ds = commit.cfg, commit.ds
    # The previous compaction plus the days since: never this day's own compaction (being replaced).
    history = history_through(spark, cfg, ds, last_compaction_before(cfg, ds))
    snapshots = latest_rows(history).withColumn("ds", F.lit(ds).cast("date"))
    commit.replace(snapshots.select(*SILVER_USER_SEQUENCES_COMPACTED.column_names), SILVER_USER_SEQUENCES_COMPACTED)
    return commit.committed_rows[SILVER_USER_SEQUENCES_COMPACTED.name]


def run(ctx: StageContext, ds: str) -> StageResult:
    """Advance the sequences of ds's active users; details: users, compacted_users (None when ds is
    not a compaction day), compaction_seconds."""
    from pyspark.sql import functions as F

    from gem.lakehouse import tables

    t0, cfg = time.time(), ctx.cfg
    spark = ctx.spark_for(STAGE, ds)
    commit = StageCommit.begin(ctx, STAGE, ds)

    bronze_version = commit.validated_version(BRONZE_AD_EVENTS, "validate_events", [ds])  # as validated
    day_events = tables.read_table(spark, cfg, BRONZE_AD_EVENTS, version=bronze_version).where(
        F.col("ds") == F.lit(ds).cast("date"))
    users = day_events.select("user_id").distinct()
    previous = _previous_rows(spark, cfg, ds, users)
    # A local checkpoint, not persist(): the plan reads this very table (ds < D), and a cached plan
    # over it would be recomputed when our own commit below invalidates it.
    rows = merge_sequences(previous, day_events, cfg.sequence_caps).localCheckpoint(eager=True)
    rows_in = users.count()

    commit.replace(rows, SILVER_USER_SEQUENCES)
    compacted, t1 = None, time.time()
    if is_compaction_day(cfg, ds):
        compacted = compact(spark, commit)
    # One row per active user: rows in (users with events on ds) = rows written, checked against the commit.
    compaction_seconds = time.time() - t1
    record = commit.publish(rows_in, written_tables=(SILVER_USER_SEQUENCES,))
    return commit.result(t0, users=record["rows_written"], compacted_users=compacted,
                         compaction_seconds=compaction_seconds)


def main(argv: list[str] | None = None) -> int:
    args = job_parser(__doc__.splitlines()[0]).parse_args(argv)
    cfg = load_config(args.config)
    result = run(StageContext(cfg), args.ds)
    details = result.details
    compaction = (f"; compacted {details['compacted_users']} users in {details['compaction_seconds']:.1f}s"
                  if details["compacted_users"] is not None else "")
    print(f"{result.summary()}{compaction}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

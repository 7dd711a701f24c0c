"""Build silver.user_sequences from bronze.ad_events: each active user's capped sequences, for one
day or a range of days in one pass.

`python -m jobs.build_sequences --ds YYYY-MM-DD [--through YYYY-MM-DD] [--config FILE]`

The layout, the merge and the one way a range can differ from its daily runs are in
gem/silver/sequences.py, with the pure transforms (`advance_sequences`, `compaction_snapshots`);
this module is the thin I/O around them. Flow for the days F..L (one day: F = L):
  gate: completion of validate_events for every day, and of build_sequences for F-1 unless F == start_ds;
  bronze ds in F..L --> the users present --> each one's latest previous row (greatest ds < F),
  looked up in the last compaction C < F plus the daily partitions (C, F), not the whole history;
  advance_sequences(previous, events, caps): each (user, day with events) as of the end of that day;
  commit (gem.lakehouse.commit.StageCommit): withdraw the records of F..L; replace silver ds in F..L;
  for each compaction day inside F..L (every `sequence_compaction_days` from start_ds) write every
  user's snapshot as of that day to silver.user_sequences_compacted, computed from the new rows (read
  back at the version our commit wrote) and the history before F; publish one record per day LAST,
  naming both versions (a reader uses a compaction only when the record of its day names it).

A range's records carry the same counts as the daily runs of its days.

A rerun reads only rows with ds < F (and a compaction before F), so it rewrites ds in F..L, and
their compactions, with identical contents.
"""

from __future__ import annotations

import math
import sys
import time

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from gem.config import GemConfig
from gem.days import shift_day
from gem.lakehouse import completions, tables
from gem.lakehouse.commit import DayCounts, StageCommit, StageContext, StageResult
from gem.pipeline.cli import StageCall, run_command, stage_command
from gem.silver.compaction import is_compaction_day, last_compaction_before
from gem.silver.sequences import (
    advance_sequences,
    compaction_snapshots,
    latest_previous_rows,
    latest_rows,
    with_next_ds,
)
from schemas.events import BRONZE_AD_EVENTS
from schemas.sequences import SILVER_USER_SEQUENCES, SILVER_USER_SEQUENCES_COMPACTED

STAGE = "build_sequences"


# --------------------------------------------------------------------------------------------------
# Thin I/O.


def history_through(spark: SparkSession, cfg: GemConfig, last_day: str, base_ds: str | None) -> DataFrame:
    """Rows whose latest per user is each user's snapshot as of the end of `last_day`: the compaction
    of base_ds (a day <= last_day, used when its record exists) plus the daily partitions
    (base_ds, last_day]; without one, every daily partition <= last_day.

    With a compaction the scan is bounded by the users plus `sequence_compaction_days` days of
    active users, however long the history; without one it grows with every day built.
    """
    daily = tables.read_table(spark, cfg, SILVER_USER_SEQUENCES).where(F.col("ds") <= F.lit(last_day).cast("date"))
    if base_ds is None or not has_compaction(cfg, base_ds):
        return daily
    base_day = F.lit(base_ds).cast("date")
    base = tables.read_table(spark, cfg, SILVER_USER_SEQUENCES_COMPACTED).where(F.col("ds") == base_day)
    return base.unionByName(daily.where(F.col("ds") > base_day))


def has_compaction(cfg: GemConfig, ds: str) -> bool:
    """Whether build_sequences' record of ds names a compaction it committed."""
    record = completions.completion(cfg, STAGE, ds)
    return record is not None and SILVER_USER_SEQUENCES_COMPACTED.name in record["table_versions"]


def _no_rows(spark: SparkSession) -> DataFrame:
    return spark.createDataFrame([], SILVER_USER_SEQUENCES.spark_schema())


def _history_before(spark: SparkSession, cfg: GemConfig, first: str) -> DataFrame:
    """Rows whose latest per user is each user's snapshot as of the end of the day before `first`
    (empty while the table does not exist)."""
    if not tables.table_exists(tables.table_path(cfg, SILVER_USER_SEQUENCES)):
        return _no_rows(spark)
    return history_through(spark, cfg, shift_day(first, -1), last_compaction_before(cfg, first))


def compact(commit: StageCommit, rows: DataFrame, history: DataFrame) -> int | None:
    """Write every user's snapshot as of the end of each compaction day of the commit's days to
    silver.user_sequences_compacted, from this run's rows (`with_next_ds` of the partitions it
    wrote, at the version it wrote) and the history before its first day, in one commit; -> rows
    written (None: no compaction day in the range).
    """
    cfg = commit.cfg
    days = [d for d in commit.days if is_compaction_day(cfg, d)]
    if not days:
        return None
    first_active = rows.groupBy("user_id").agg(F.min("ds").alias("next_ds"))
    before = latest_rows(history).join(first_active, "user_id", "left")
    snapshots = compaction_snapshots(cfg, rows, before, days[0], days[-1])
    commit.replace(snapshots, SILVER_USER_SEQUENCES_COMPACTED, days=days)
    return commit.committed_rows[SILVER_USER_SEQUENCES_COMPACTED.name]


def run(ctx: StageContext, ds: str, through: str | None = None) -> StageResult:
    """Advance the sequences of the active users of ds (or of each day ds..through, in one pass and
    one commit per table, one record per day, as the daily runs would: gem/silver/sequences.py names
    the one exception, repeated event ids); details: users (rows written), compacted_users (None
    when no day is a compaction day), compaction_seconds."""
    t0, cfg = time.time(), ctx.cfg
    spark = ctx.spark_for(STAGE, ds)
    commit = StageCommit.begin(ctx, STAGE, ds, through)
    first, last = commit.days[0], commit.days[-1]

    bronze_version = commit.validated_version(BRONZE_AD_EVENTS, "validate_events", list(commit.days))  # as validated
    events = tables.read_table(spark, cfg, BRONZE_AD_EVENTS, version=bronze_version).where(
        F.col("ds").between(F.lit(first).cast("date"), F.lit(last).cast("date")))
    users = events.select("user_id").distinct()
    history = _history_before(spark, cfg, first)
    # The first day starts fresh, whatever an earlier experiment left in the table.
    previous = _no_rows(spark) if first == cfg.start_ds else latest_previous_rows(history, users, first)
    block_days = math.isqrt(len(commit.days) - 1) + 1  # ceil(sqrt(days)): about 2 sqrt(days) passes a user
    rows = advance_sequences(previous, events, cfg.sequence_caps, block_days)
    # Written straight from the plan, then read back at the version written for the counts and the
    # compaction: held in memory for reuse instead, a long range's rows (1,000 MovieLens days: GBs
    # of arrays) run a 4 GB driver out of heap in the write.
    version = commit.replace(rows.select(*SILVER_USER_SEQUENCES.column_names), SILVER_USER_SEQUENCES)
    written = tables.read_table(spark, cfg, SILVER_USER_SEQUENCES, version=version).where(
        F.col("ds").between(F.lit(first).cast("date"), F.lit(last).cast("date")))
    # One row per (active user, day): rows in (users with events in bronze that day) = rows written.
    users_in = {str(d): n for d, n in events.groupBy("ds").agg(F.countDistinct("user_id")).collect()}
    users_out = {str(d): n for d, n in written.groupBy("ds").count().collect()}
    per_day = {d: DayCounts(users_in.get(d, 0), users_out.get(d, 0)) for d in commit.days}
    t1 = time.time()
    compacted = compact(commit, with_next_ds(written), history)
    compaction_seconds = time.time() - t1
    # Reconciled per day, and in total against the commit's own count.
    commit.publish(per_day=per_day, written_tables=(SILVER_USER_SEQUENCES,))
    return commit.result(t0, users=sum(c.rows_written for c in per_day.values()), compacted_users=compacted,
                         compaction_seconds=compaction_seconds)


def command_line(call: StageCall) -> int:
    """Advance the sequences of the users active on --ds (or on each day --ds..--through); print
    the summary and the compaction's, if any."""
    result = run(StageContext(call.cfg), call.ds, call.through)
    details = result.details
    compaction = (f"; compacted {details['compacted_users']} users in {details['compaction_seconds']:.1f}s"
                  if details["compacted_users"] is not None else "")
    print(f"{result.summary()}{compaction}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_command(stage_command("build_sequences", command_line), argv)


if __name__ == "__main__":
    sys.exit(main())

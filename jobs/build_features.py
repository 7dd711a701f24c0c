"""Build silver.user_features and silver.ad_features of ds (or ds..through): counters as of the end of ds-1.

`python -m jobs.build_features --ds YYYY-MM-DD [--through YYYY-MM-DD] [--full] [--config FILE]`

The semantics, the bronze days each build reads and the transforms are in gem/silver/features.py.
Which way a run takes:
  * incremental, the daily run (build_features has completed D-1): reads ONE bronze day, D-1, into
    its daily counts, then advances the users' counters of D-1 (advance_user_counters) and sums the
    ads' window of daily counts;
  * full (`--full`, or no completion record for D-1: the first day, a lone backfill, a rebuild after
    bronze changed): rewrites the daily counts of every arrival day in the window from bronze, then
    sums them (window_counters);
  * a range (`--through`, always full): rewrites the daily counts of every arrival day any of its
    days reads, [max(ds-28, start_ds), through-1], then sums them for all its days at once.
    The daily full build is the one-day range of the same code.

Commit (gem.lakehouse.commit.StageCommit): the registry's needs (bronze of the window validated) checked;
withdraw the (build_features, D) record (every day's, for a range); write the daily counts; replace both
partitions ds=D (ds..through: one commit per table, each computed by its write); publish the record of
each day LAST, its rows counted from the commit's log. A rerun rewrites the same rows.
"""

from __future__ import annotations

import sys
import time
from typing import Annotated

import typer
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from gem.config import GemConfig
from gem.data.delta_log import logged_files
from gem.days import shift_day
from gem.lakehouse import completions, tables
from gem.lakehouse.commit import DayCounts, StageCommit, StageContext, StageResult
from gem.pipeline.cli import StageCall, run_command, stage_command
from gem.silver.features import (
    LONGEST_WINDOW_DAYS,
    advance_user_counters,
    bronze_days,
    daily_counts,
    feature_rows,
    window_counters,
)
from schemas.events import BRONZE_AD_EVENTS
from schemas.features import SILVER_AD_DAILY_COUNTS, SILVER_AD_FEATURES, SILVER_USER_DAILY_COUNTS, SILVER_USER_FEATURES
from schemas.table import TableSchema

STAGE = "build_features"
# Counting the window's distinct users and ads apart from the rows written would cost a second scan
# of the daily counts; the record says there is no separate input count rather than claim a check.
NO_INPUT_COUNT = "one row per user (ad) with an event in the window; no separate input count"


# --------------------------------------------------------------------------------------------------
# Thin I/O.


def _arrived(spark: SparkSession, cfg: GemConfig, schema: TableSchema, first: str, last: str,
             version: int | None = None) -> DataFrame:
    """Rows of `schema` (bronze or daily counts) with arrival day ds in [first, last], partition-pruned
    (at `version`, else the latest)."""
    rows = tables.read_table(spark, cfg, schema, version=version)
    return rows.where(F.col("ds").between(F.lit(first).cast("date"), F.lit(last).cast("date")))


def _write_daily_counts(spark: SparkSession, commit: StageCommit, days: list[str]) -> None:
    """Rewrite both daily-count tables for the arrival days `days` (consecutive) from bronze as
    validated, one commit per table; a day without events leaves its partition empty."""
    version = commit.validated_version(BRONZE_AD_EVENTS, "validate_events", days)
    bronze = _arrived(spark, commit.cfg, BRONZE_AD_EVENTS, days[0], days[-1], version)
    for schema, key in ((SILVER_USER_DAILY_COUNTS, "user_id"), (SILVER_AD_DAILY_COUNTS, "ad_id")):
        commit.replace(daily_counts(bronze, key), schema, days)


def _rows_per_day(commit: StageCommit, schemas: tuple[TableSchema, ...]) -> dict[str, int]:
    """day -> rows of `schemas` in its partition, as the commits of this run wrote them: the row
    counts of the log's add actions, so counting needs no second scan (the commit's metrics give
    only the total; publish checks the days' sum against it)."""
    per_day = dict.fromkeys(commit.days, 0)
    for schema in schemas:
        for f in logged_files(tables.table_path(commit.cfg, schema), commit.table_versions[schema.name]):
            if f.partition["ds"] in per_day:
                per_day[f.partition["ds"]] += f.rows
    return per_day


def run(ctx: StageContext, ds: str, through: str | None = None, *, full: bool = False) -> StageResult:
    """Build ds (or every day of ds..through, in one commit per table and one record per day, with
    the rows the days' own runs write); incremental when it builds one day, build_features has
    completed ds-1 and `full` is False. Details: users, ads (rows written, over all days),
    incremental, daily_count_days (the arrival days whose counts it wrote)."""
    t0, cfg = time.time(), ctx.cfg
    if ds < cfg.start_ds:
        raise ValueError(f"{STAGE} ds={ds} is before the pipeline's start_ds={cfg.start_ds}")
    last = through or ds
    spark = ctx.spark_for(STAGE, ds)
    last_day = shift_day(ds, -1)
    incremental = (not full and last == ds and ds > cfg.start_ds
                   and completions.completion(cfg, STAGE, last_day) is not None)
    window = bronze_days(cfg, ds, through)
    rewritten = [last_day] if incremental else window
    commit = StageCommit.begin(ctx, STAGE, ds, through)
    if incremental:  # it advances ds-1's counters: that record's versions are inputs too
        commit.also_needs(STAGE, last_day)
    if rewritten:
        _write_daily_counts(spark, commit, rewritten)
    written = (SILVER_USER_FEATURES, SILVER_AD_FEATURES)
    if window:
        # Incremental reads one more arrival day: the rows leaving the 28-day window arrived on ds-29 or later.
        first = max(shift_day(ds, -LONGEST_WINDOW_DAYS - 1), cfg.start_ds) if incremental else window[0]
        user_daily = _arrived(spark, cfg, SILVER_USER_DAILY_COUNTS, first, window[-1])
        ad_daily = _arrived(spark, cfg, SILVER_AD_DAILY_COUNTS, window[0], window[-1])
        if incremental:
            previous = tables.read_table(spark, cfg, SILVER_USER_FEATURES).where(F.col("ds") == F.lit(last_day).cast("date"))
            users = advance_user_counters(previous, user_daily, ds)
        else:
            users = window_counters(user_daily, "user_id", ds, last)
        ads = window_counters(ad_daily, "ad_id", ds, last)
        outputs = [feature_rows(users, SILVER_USER_FEATURES), feature_rows(ads, SILVER_AD_FEATURES)]
    else:  # only ds = through = start_ds: nothing known yet, empty partitions
        outputs = [spark.createDataFrame([], schema.spark_schema()) for schema in written]
    for schema, rows in zip(written, outputs, strict=True):
        # Each table is computed once, by its Delta write; row counts from the commit's metrics and log.
        commit.replace(rows, schema)
    per_day = {day: DayCounts(None, n) for day, n in _rows_per_day(commit, written).items()}
    commit.publish(per_day=per_day, written_tables=written, no_input_count=NO_INPUT_COUNT)
    n_users, n_ads = (commit.committed_rows[s.name] for s in written)
    return commit.result(t0, users=n_users, ads=n_ads, incremental=incremental, daily_count_days=rewritten)


def command_line(
    call: StageCall,
    full: Annotated[bool, typer.Option(
        "--full", help="rebuild the daily counts of the whole window from bronze and sum them (default: advance "
                       "from ds-1; a range is always built in full)")] = False,
) -> int:
    """Build the counters of --ds (or of each day --ds..--through); print the summary, incremental or full."""
    result = run(StageContext(call.cfg), call.ds, call.through, full=full)
    details = result.details
    mode = "incremental" if details["incremental"] else "full"
    print(f"{result.summary()} ({mode}: users={details['users']} ads={details['ads']})")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_command(stage_command("build_features", command_line), argv)


if __name__ == "__main__":
    sys.exit(main())

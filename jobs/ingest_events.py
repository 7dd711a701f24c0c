"""Ingest arrival days of landing events into bronze.ad_events and bronze.quarantine.

`python -m jobs.ingest_events --ds YYYY-MM-DD [--through YYYY-MM-DD] [--config FILE]`

Flow (the transforms are pure, in gem/bronze/; this module is the thin I/O around them), for the
days ds..through (one day without --through) in ONE pass, a constant number of Spark jobs however
many days:
  landing/ds=D/* for every day --read_days--> (value, source_file, ds, file_reason, file_detail):
      every file's lines, each with its arrival day (gem/bronze/landing_lines.py)
      --classify--> every line with its typed fields and the first rule it breaks (or none)
      --mark_duplicates--> repeated event ids (within a day, across the days, against bronze;
      gem/bronze/duplicates.py)
      --check_drift (per day)--> fail the job if a column's type or the key set changed for many rows
      --validate (Great Expectations, before any commit)-->
  commit (gem.lakehouse.commit.StageCommit): withdraw the (ingest_events, D) completion records;
  replace bronze's partitions of the days in one commit; the quarantine's in one commit; publish
  one record per day, reconciled with the commits' row counts, LAST.

A crash between commits leaves no completion record, so no downstream stage reads the days; a
rerun rewrites the partitions with identical contents and converges. A range has the same contents
and per-day records as ingesting its days one by one, in order (tests/spark/test_ingest_events.py).
Counts reconcile per file too: the result's details["files"][ds][file] = {in, written, quarantined}.
"""

from __future__ import annotations

import sys
import time
from dataclasses import replace

from pyspark import StorageLevel

from gem.bronze.census import LineCensus, take_census
from gem.bronze.classify import classify
from gem.bronze.drift import check_drift
from gem.bronze.duplicates import mark_duplicates, outside_event_ids
from gem.bronze.landing_lines import read_days
from gem.bronze.rows import good_rows, quarantined_rows
from gem.faults import crash_point
from gem.lakehouse.commit import DayCounts, StageCommit, StageContext, StageResult
from gem.pipeline.cli import StageCall, run_command, stage_command
from gem.quality import expectations, runner
from schemas.events import BRONZE_AD_EVENTS, BRONZE_QUARANTINE

STAGE = "ingest_events"


def run(ctx: StageContext, ds: str, through: str | None = None) -> StageResult:
    """Ingest landing day ds (or the days ds..through, in one commit per table with one record per
    day, exactly as if ingested one by one) in one pass: a constant number of Spark jobs."""
    t0, cfg = time.time(), ctx.cfg
    # The registry's landing need (each day's _SUCCESS marker) is checked, and the old records
    # withdrawn, before anything is read: a failing rerun leaves no record claiming a day.
    commit = StageCommit.begin(ctx, STAGE, ds, through)
    crash_point(f"{STAGE}:after_withdraw")
    spark = ctx.spark_for(STAGE, ds)
    classified = good = None
    try:
        lines = read_days(spark, cfg.landing_root, commit.days)
        # gzip is not splittable: spread the lines over the cores before the per-line parsing.
        lines = lines.repartition(max(spark.sparkContext.defaultParallelism, 2))
        outside = outside_event_ids(spark, cfg, commit.days)
        # A local checkpoint, not persist(): the plan reads bronze (the neighbouring days' ids), and a
        # cached plan over bronze would be recomputed in full when this job's own bronze commit
        # invalidates it.
        classified = mark_duplicates(classify(lines, cfg), cfg.ingest.dedup_lookback_days, outside) \
            .localCheckpoint(eager=True)
        census = take_census(classified)
        empty = LineCensus({}, {}, {}, {})  # a day whose files hold no line
        per_day: dict[str, DayCounts] = {}
        for day in commit.days:
            check_drift(census.get(day, empty), cfg, where=f"landing ds={day}")
            by_reason = dict(census.get(day, empty).by_reason)
            rows_written = by_reason.pop("", 0)
            per_day[day] = DayCounts(rows_written + sum(by_reason.values()), rows_written, dict(sorted(by_reason.items())))
        # The typed rows GX scans ~50 times and the bronze write reads: cache them compactly.
        good = good_rows(classified).persist(StorageLevel.MEMORY_AND_DISK)
        label = commit.label
        # The key is checked per arrival day, as a daily run's batch checks it: an id repeated
        # further apart than the dedup lookback is kept on both days, by choice (gem/bronze/duplicates.py).
        per_day_key = replace(BRONZE_AD_EVENTS, key=("ds", *BRONZE_AD_EVENTS.key))
        runner.validate(
            cfg,
            good,
            suite_name=f"{BRONZE_AD_EVENTS.name}.schema",
            expectations=expectations.schema_expectations(per_day_key),
            batch_label=f"{STAGE}:{label}",
        )
        commit.replace(good, BRONZE_AD_EVENTS)
        crash_point(f"{STAGE}:after_bronze")
        commit.replace(quarantined_rows(classified), BRONZE_QUARANTINE)
        crash_point(f"{STAGE}:after_quarantine")
        # Reconciled against what the commits say they wrote, not only what we counted.
        commit.publish(per_day=per_day, written_tables=(BRONZE_AD_EVENTS,), quarantine_table=BRONZE_QUARANTINE)
    finally:
        for cached in (good, classified):
            if cached is not None:
                cached.unpersist()
    per_file = {day: census.get(day, empty).file_counts() for day in commit.days}
    return commit.result(t0, files=per_file)


def command_line(call: StageCall) -> int:
    """Ingest landing day --ds (or the days --ds..--through) into bronze; print the summary and
    each file's counts."""
    result = run(StageContext(call.cfg), call.ds, call.through)
    print(f"{result.summary()} ({result.rows_in / max(result.seconds, 1e-9):,.0f} events/s)")
    for day, files in result.details["files"].items():
        for name, counts in files.items():
            print(f"  ds={day} {name}: in={counts['in']} written={counts['written']} quarantined={counts['quarantined']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_command(stage_command("ingest_events", command_line), argv)


if __name__ == "__main__":
    sys.exit(main())

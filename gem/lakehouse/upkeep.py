"""Lakehouse upkeep: quarantine retention, small-file compaction and VACUUM (the gem_upkeep DAG's task).

`upkeep(cfg, ds)` for the upkeep run of day ds, each table through its writer engine
(TableSchema.writer: Spark for the Spark stages' tables, `deltalake` for the others; the Spark
session is opened only when a Spark-written table exists):
  1. quarantine retention: bronze.quarantine's partitions (verbatim landing lines) older than
     ds - ingest.quarantine_retention_days are deleted (a DELETE on the partition column);
  2. OPTIMIZE: every table's small files compacted, partition by partition (dataChange=false: the
     same rows; readers and completion records pinned to older versions still read those). Every
     write adds files (a day's ingest, a rerun), so a partition's files multiply without it;
  3. VACUUM: every table's files retired more than `retention_days` ago deleted (the tables'
     delta.deletedFileRetentionDuration; both engines enforce it). That is what makes a deletion
     final: rows removed by step 1, by `gem delete-user` or by a partition rewrite leave the disk
     retention_days after they left the table. Versions older than the retention then stop being
     readable, as the tables' properties say.
A commit that races a stage's commit of the same table fails and the task retries (Delta's
optimistic concurrency); the DAG runs weekly, at a time of day after the daily run's. While a
backfill holds its range (gem.lakehouse.backfill_hold) upkeep does not start: a backfill rewrites
many days' partitions for hours, and each OPTIMIZE commit racing one of those writes would fail a
stage of the backfill or the upkeep. It raises BackfillInProgressError before touching a table, and
its DAG task waits (rescheduled) until the backfill has finished.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from croniter import croniter

from gem.config import GemConfig, load_config
from gem.days import shift_day
from gem.lakehouse.backfill_hold import BackfillInProgressError, live_holds
from gem.lakehouse.spark import session_on_demand
from gem.lakehouse.tables import delete_rows, delta_table, single_driver, spark_location, table_exists, table_path
from schemas import TABLES
from schemas.events import BRONZE_QUARANTINE
from schemas.table import TableSchema

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# When the gem_upkeep DAG runs (gem/pipeline/airflow/upkeep_dag.py): Sundays 06:00 UTC, hours after the daily run
# of the day before has normally finished.
UPKEEP_CRON = "0 6 * * 0"


def next_upkeep_run(at_or_after: dt.datetime) -> dt.datetime:
    """The first scheduled upkeep run (UPKEEP_CRON, UTC) at or after `at_or_after` (aware)."""
    # croniter steps strictly after its start: start one second before so an exact hit counts.
    return croniter(UPKEEP_CRON, at_or_after.astimezone(dt.UTC) - dt.timedelta(seconds=1)).get_next(dt.datetime)


@dataclass
class UpkeepReport:
    ds: str
    quarantine_before: str
    quarantine_rows_expired: int = 0
    files_compacted: dict[str, tuple[int, int]] = field(default_factory=dict)  # table -> (removed, added)
    files_vacuumed: dict[str, int] = field(default_factory=dict)  # table -> files deleted from disk

    def lines(self) -> list[str]:
        expired = f"{self.quarantine_rows_expired:,} quarantined lines from before {self.quarantine_before} expired"
        out = [f"upkeep ds={self.ds}: {expired}"]
        out += [f"  OPTIMIZE {t:<34} {r:>5} files -> {a}" for t, (r, a) in sorted(self.files_compacted.items())]
        out += [f"  VACUUM   {t:<34} {n:>5} files deleted" for t, n in sorted(self.files_vacuumed.items())]
        return out


Session = Callable[[], "SparkSession"]


def expire_quarantine(cfg: GemConfig, before: str, session: Session | None = None) -> int:
    """Delete bronze.quarantine's partitions older than `before`; -> rows deleted."""
    path = table_path(cfg, BRONZE_QUARANTINE)
    if not table_exists(path):
        return 0
    return delete_rows(session or session_on_demand(cfg, app_name="gem-upkeep"), BRONZE_QUARANTINE, path,
                       f"ds < '{dt.date.fromisoformat(before).isoformat()}'")


def compact(cfg: GemConfig, schema: TableSchema, session: Session | None = None) -> tuple[int, int]:
    """OPTIMIZE (bin-packing compaction) of one table through its writer engine; -> (files removed,
    files added)."""
    path = table_path(cfg, schema)
    if schema.writer == "spark":
        from delta.tables import DeltaTable

        spark = (session or session_on_demand(cfg, app_name="gem-upkeep"))()
        with single_driver(path, "upkeep-optimize"):
            rows = DeltaTable.forPath(spark, spark_location(spark, path)).optimize().executeCompaction().collect()
        metrics = rows[0]["metrics"].asDict() if rows else {}
    else:
        metrics = delta_table(path).optimize.compact()
    return int(metrics.get("numFilesRemoved", 0)), int(metrics.get("numFilesAdded", 0))


def vacuum(cfg: GemConfig, schema: TableSchema, session: Session | None = None) -> int:
    """VACUUM of one table through its writer engine at the retention (cfg.retention_days, the
    tables' delta.deletedFileRetentionDuration); -> files deleted. Spark's VACUUM deletes a retired
    file once it was retired, and last written, longer ago than the retention; it is counted by a
    dry run just before (Spark's VACUUM returns no list)."""
    path, hours = table_path(cfg, schema), 24 * cfg.retention_days
    if schema.writer == "spark":
        spark = (session or session_on_demand(cfg, app_name="gem-upkeep"))()
        target = f"delta.`{spark_location(spark, path)}` RETAIN {hours} HOURS"
        with single_driver(path, "upkeep-vacuum"):  # Delta logs a VACUUM as commits
            doomed = spark.sql(f"VACUUM {target} DRY RUN").count()
            if doomed:
                spark.sql(f"VACUUM {target}").collect()
        return doomed
    return len(delta_table(path).vacuum(retention_hours=hours, dry_run=False, enforce_retention_duration=True))


def upkeep(cfg: GemConfig, ds: str, spark: SparkSession | None = None) -> UpkeepReport:
    """Quarantine retention, then OPTIMIZE and VACUUM of every table (the module docstring);
    BackfillInProgressError, with nothing touched, while a backfill holds a range. `spark`: the
    session for the Spark-written tables (default: one from get_spark, opened when first needed)."""
    if holds := live_holds(cfg):
        start, end, holder = holds[0]
        raise BackfillInProgressError(
            f"upkeep ds={ds} waits: backfill {start}..{end} is rewriting the lakehouse ({holder['run_id']}, "
            f"pid {holder['pid']} on {holder['host']}, since {holder['started_at']})")
    session = session_on_demand(cfg, spark, app_name="gem-upkeep")
    report = UpkeepReport(ds, shift_day(ds, -cfg.ingest.quarantine_retention_days))
    report.quarantine_rows_expired = expire_quarantine(cfg, report.quarantine_before, session)
    for schema in TABLES.values():
        if not table_exists(table_path(cfg, schema)):
            continue
        removed, added = compact(cfg, schema, session)
        if removed:
            report.files_compacted[schema.name] = (removed, added)
        if deleted := vacuum(cfg, schema, session):
            report.files_vacuumed[schema.name] = deleted
    return report


def run_task(ds: str) -> str:
    """The gem_upkeep DAG's task: upkeep of ds under the worker's config ($GEM_CONFIG); -> its summary."""
    lines = upkeep(load_config(), ds).lines()
    print("\n".join(lines), flush=True)
    return lines[0]

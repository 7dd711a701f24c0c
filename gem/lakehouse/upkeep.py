"""Lakehouse upkeep: quarantine retention, small-file compaction and VACUUM (the gem_upkeep DAG's task).

`upkeep(cfg, ds)` for the upkeep run of day ds, through `deltalake` (no Spark):
  1. quarantine retention: bronze.quarantine's partitions (verbatim landing lines) older than
     ds - ingest.quarantine_retention_days are deleted (a DELETE on the partition column);
  2. OPTIMIZE: every table's small files compacted, partition by partition (dataChange=false: the
     same rows; readers and completion records pinned to older versions still read those). Every
     write adds files (a day's ingest, a rerun), so a partition's files multiply without it;
  3. VACUUM: every table's files retired more than `retention_days` ago deleted (the tables'
     delta.deletedFileRetentionDuration; deltalake enforces it). That is what makes a deletion
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
from dataclasses import dataclass, field
from pathlib import Path

from croniter import croniter

from gem.config import GemConfig, load_config
from gem.days import shift_day
from gem.lakehouse.backfill_hold import BackfillInProgressError, live_holds
from gem.lakehouse.tables import table_path
from schemas import TABLES
from schemas.events import BRONZE_QUARANTINE

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


def expire_quarantine(cfg: GemConfig, before: str) -> int:
    """Delete bronze.quarantine's partitions older than `before`; -> rows deleted."""
    from deltalake import DeltaTable

    path = table_path(cfg, BRONZE_QUARANTINE)
    if not Path(path, "_delta_log").is_dir():
        return 0
    metrics = DeltaTable(path).delete(f"ds < '{dt.date.fromisoformat(before).isoformat()}'")
    return int(metrics.get("num_deleted_rows", 0))


def compact(path: str) -> tuple[int, int]:
    """OPTIMIZE (bin-packing compaction) of one table; -> (files removed, files added)."""
    from deltalake import DeltaTable

    metrics = DeltaTable(path).optimize.compact()
    return int(metrics.get("numFilesRemoved", 0)), int(metrics.get("numFilesAdded", 0))


def vacuum(path: str, retention_days: int) -> int:
    """VACUUM of one table at the retention; -> files deleted."""
    from deltalake import DeltaTable

    return len(DeltaTable(path).vacuum(retention_hours=24 * retention_days, dry_run=False,
                                       enforce_retention_duration=True))


def upkeep(cfg: GemConfig, ds: str) -> UpkeepReport:
    """Quarantine retention, then OPTIMIZE and VACUUM of every table (the module docstring);
    BackfillInProgressError, with nothing touched, while a backfill holds a range."""
    if holds := live_holds(cfg):
        start, end, holder = holds[0]
        raise BackfillInProgressError(
            f"upkeep ds={ds} waits: backfill {start}..{end} is rewriting the lakehouse ({holder['run_id']}, "
            f"pid {holder['pid']} on {holder['host']}, since {holder['started_at']})")
    report = UpkeepReport(ds, shift_day(ds, -cfg.ingest.quarantine_retention_days))
    report.quarantine_rows_expired = expire_quarantine(cfg, report.quarantine_before)
    for schema in TABLES.values():
        path = table_path(cfg, schema)
        if not Path(path, "_delta_log").is_dir():
            continue
        removed, added = compact(path)
        if removed:
            report.files_compacted[schema.name] = (removed, added)
        if deleted := vacuum(path, cfg.retention_days):
            report.files_vacuumed[schema.name] = deleted
    return report


def run_task(ds: str) -> str:
    """The gem_upkeep DAG's task: upkeep of ds under the worker's config ($GEM_CONFIG); -> its summary."""
    lines = upkeep(load_config(), ds).lines()
    print("\n".join(lines), flush=True)
    return lines[0]

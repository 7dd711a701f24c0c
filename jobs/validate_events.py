"""Validate one day of bronze.ad_events with Great Expectations; gate downstream stages on it.

    python -m jobs.validate_events --ds 2026-01-01 [--through YYYY-MM-DD] [--config FILE]

Needs ingest_events' completion record for the ds. Reads the ds partition of bronze.ad_events (and
the ds's bronze.quarantine row count) at the Delta versions ingest recorded, and runs the
`bronze.ad_events.statistics` suite (gem.quality.bronze): per-surface CTR, null rates, duplicate and
quarantine rates from the ingest record, and bronze/quarantine counts reconciled with that record.
The schema suite (`bronze.ad_events.schema`: every rule of the table's schema) already ran in
ingest_events on the same rows before they were committed, and Delta's NOT NULL and CHECK
constraints held at commit, so it is not run twice; its results are in the same Data Docs.

then refreshes the (offline) Data Docs and prints the index.html path with a summary. A failed
critical expectation exits non-zero with the failures listed; otherwise the stage publishes its
completion record last (gem.lakehouse.commit): the versions it validated, rows_written = rows validated,
rows_in null (a validation has no input count of its own to reconcile).
"""

from __future__ import annotations

import datetime as dt
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from gem.config import GemConfig
from gem.lakehouse import tables
from gem.lakehouse.commit import DayCounts, StageCommit, StageContext, StageResult
from gem.lakehouse.completions import MissingInputError
from gem.lakehouse.tables import read_table, table_path
from gem.pipeline.cli import StageCall, run_command, stage_command
from gem.quality.bronze import ROWS_VALIDATED, event_statistics, event_statistics_expectations, statistics_frame
from gem.quality.docs_assets import MissingDocsAssetsError
from gem.quality.runner import (
    ValidationReport,
    build_data_docs,
    raise_for_critical,
    validate,
)
from schemas.events import BRONZE_AD_EVENTS, BRONZE_QUARANTINE

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

STAGE = "validate_events"
INGEST_STAGE = "ingest_events"
STATISTICS_SUITE = f"{BRONZE_AD_EVENTS.name}.statistics"
# A validation writes no rows: its record's rows_written counts the rows validated.
VALIDATION_WRITES_NOTHING = "validation: writes no rows; rows_written counts the rows validated"


def _recorded_version(ingest_record: dict[str, Any], table: str) -> int | None:
    """The Delta version of `table` ingest committed for the ds, if it recorded one."""
    version = (ingest_record.get("table_versions") or {}).get(table)
    return None if version is None else int(version)


def _days(df: DataFrame, days: Sequence[str]) -> DataFrame:
    return df.where(f"ds BETWEEN DATE'{days[0]}' AND DATE'{days[-1]}'")


def _quarantine_rows(spark: SparkSession, cfg: GemConfig, commit: StageCommit,
                     ingest_records: dict[str, dict[str, Any]]) -> tuple[dict[str, int], int | None]:
    """(day -> rows of bronze.quarantine, the version read): the one version `validated_version`
    pins for all the days when every ingest record names one (else the latest, and None); no rows
    while the table does not exist."""

    days = sorted(ingest_records)
    if not tables.table_exists(table_path(cfg, BRONZE_QUARANTINE)):
        return {}, None
    recorded = all(_recorded_version(r, BRONZE_QUARANTINE.name) is not None for r in ingest_records.values())
    version = commit.validated_version(BRONZE_QUARANTINE, INGEST_STAGE, days) if recorded else None
    counts = _days(read_table(spark, cfg, BRONZE_QUARANTINE, version=version), days).groupBy("ds").count().collect()
    return {str(r["ds"]): int(r["count"]) for r in counts}, version


def _summary(
    label: str, run_id: str, rows: int, version: int, reports: Sequence[ValidationReport], index: str
) -> dict[str, Any]:
    return {
        "stage": STAGE,
        "ds": label,
        "run_id": run_id,
        "rows_validated": rows,
        "events_version": version,
        "success": all(r.success for r in reports),
        "failed_critical": [o.describe() for r in reports for o in r.failed_critical],
        "warnings": [o.describe() for r in reports for o in r.failed_warnings],
        "suites": {r.suite_name: r.summary() for r in reports},
        "results": {r.suite_name: str(r.result_path) for r in reports},
        "data_docs_index": index,
    }


def run(ctx: StageContext, ds: str, through: str | None = None) -> StageResult:
    """Validate bronze.ad_events for `ds` (or the days ds..through: one Spark pass and one suite
    run over a statistics frame with a row per day, one record per day); details: the summary
    (suites, warnings, Data Docs index). Raises MissingInputError without ingest's record,
    DataQualityError (after Data Docs are built) on a failed critical expectation, naming the
    values that failed (no day of the range is then published)."""
    dt.date.fromisoformat(ds)
    t0, cfg = time.time(), ctx.cfg
    spark = ctx.spark_for(STAGE, ds)
    # Withdrawn first: a rerun that fails must not leave an earlier "validated" record standing.
    commit = StageCommit.begin(ctx, STAGE, ds, through)
    days = list(commit.days)
    ingest_records = {day: commit.record(INGEST_STAGE, day) for day in days}
    # One version for every day: each day's files there are the ones its ingest committed (else
    # StaleInputError names the ingest to rerun).
    version = commit.validated_version(BRONZE_AD_EVENTS, INGEST_STAGE, days)
    events = _days(read_table(spark, cfg, BRONZE_AD_EVENTS, version=version), days)
    quarantine_rows, quarantine_version = _quarantine_rows(spark, cfg, commit, ingest_records)
    statistics = event_statistics(events, ingest_records, quarantine_rows, cfg)
    label = commit.label
    reports = [
        validate(
            cfg,
            statistics_frame(statistics),
            STATISTICS_SUITE,
            event_statistics_expectations(cfg),
            f"{STAGE}:{label}",
            raise_on_critical=False,
        ),
    ]
    # Each validation's checkpoint already rendered its pages and the index: no full rebuild.
    index = build_data_docs(cfg, rebuild=False)
    rows = {day: int(statistics[day][ROWS_VALIDATED] or 0) for day in days}
    summary = _summary(label, commit.run_id, sum(rows.values()), version, reports, str(index))
    raise_for_critical(reports)
    validated = {BRONZE_AD_EVENTS.name: version}
    if quarantine_version is not None:
        validated[BRONZE_QUARANTINE.name] = quarantine_version
    commit.publish(no_input_count=VALIDATION_WRITES_NOTHING, validated=validated,
                   per_day={day: DayCounts(None, n) for day, n in rows.items()})
    return commit.result(t0, **summary)


def _print_summary(summary: dict[str, Any]) -> None:
    print(f"Data Docs: {summary['data_docs_index']}")
    for line in summary["suites"].values():
        print(f"  {line}")
    for warning in summary["warnings"]:
        print(f"  {warning}")
    print(f"{STAGE} ds={summary['ds']}: {summary['rows_validated']} rows validated, completion published")


def command_line(call: StageCall) -> int:
    """Validate bronze.ad_events of --ds (or of the days --ds..--through); print the suites' summary,
    or exit 1 naming the failed expectations or the missing input."""
    try:  # a failed critical expectation: gem.pipeline.cli prints its lines and the command to rerun
        summary = run(StageContext(call.cfg), call.ds, call.through).details
    except (MissingInputError, MissingDocsAssetsError) as e:
        print(f"{STAGE} ds={call.ds} cannot run: {e}", file=sys.stderr)
        return 1
    _print_summary(summary)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(stage_command("validate_events", command_line), argv)


if __name__ == "__main__":
    sys.exit(main())

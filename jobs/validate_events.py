"""Validate one day of bronze.ad_events with Great Expectations; gate downstream stages on it.

    python -m jobs.validate_events --ds 2026-01-01 [--config FILE]

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

from gem.cli import job_parser
from gem.config import GemConfig, load_config
from gem.lakehouse.commit import StageCommit, StageContext, StageResult
from gem.lakehouse.completions import MissingInputError
from gem.lakehouse.tables import latest_version, read_table, table_path
from gem.quality.bronze import ROWS_VALIDATED, event_statistics, event_statistics_expectations, statistics_frame
from gem.quality.docs_assets import MissingDocsAssetsError
from gem.quality.runner import (
    DataQualityError,
    ValidationReport,
    build_data_docs,
    docs_site_dir,
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


def _events_version(spark: SparkSession, cfg: GemConfig, ingest_record: dict[str, Any]) -> int:
    """The bronze.ad_events version ingest committed for the ds (latest if it recorded none)."""
    recorded = _recorded_version(ingest_record, BRONZE_AD_EVENTS.name)
    return recorded if recorded is not None else latest_version(table_path(cfg, BRONZE_AD_EVENTS))


def _day(df: DataFrame, ds: str) -> DataFrame:
    return df.where(f"ds = DATE'{ds}'")


def _quarantine_rows(spark: SparkSession, cfg: GemConfig, ds: str, ingest_record: dict[str, Any]) -> int:
    """Rows of bronze.quarantine for the ds, at the version ingest recorded; 0 while the table
    does not exist yet."""
    from delta.tables import DeltaTable

    if not DeltaTable.isDeltaTable(spark, table_path(cfg, BRONZE_QUARANTINE)):
        return 0
    version = _recorded_version(ingest_record, BRONZE_QUARANTINE.name)
    return _day(read_table(spark, cfg, BRONZE_QUARANTINE, version=version), ds).count()


def _summary(
    ds: str, run_id: str, rows: int, version: int, reports: Sequence[ValidationReport], index: str
) -> dict[str, Any]:
    return {
        "stage": STAGE,
        "ds": ds,
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


def run(ctx: StageContext, ds: str) -> StageResult:
    """Validate bronze.ad_events for `ds`; details: the summary (suites, warnings, Data Docs index). Raises MissingInputError without
    ingest's record, DataQualityError (after Data Docs are built) on a failed critical expectation."""
    dt.date.fromisoformat(ds)
    t0, cfg = time.time(), ctx.cfg
    spark = ctx.spark_for(STAGE, ds)
    # Withdrawn first: a rerun that fails must not leave an earlier "validated" record standing.
    commit = StageCommit.begin(ctx, STAGE, ds)
    ingest_record = commit.record(INGEST_STAGE, ds)
    version = _events_version(spark, cfg, ingest_record)
    events = _day(read_table(spark, cfg, BRONZE_AD_EVENTS, version=version), ds)
    statistics = event_statistics(events, ingest_record, _quarantine_rows(spark, cfg, ds, ingest_record), cfg)
    reports = [
        validate(
            cfg,
            statistics_frame(statistics),
            STATISTICS_SUITE,
            event_statistics_expectations(cfg),
            ds,
            raise_on_critical=False,
        ),
    ]
    # Each validation's checkpoint already rendered its pages and the index: no full rebuild.
    index = build_data_docs(cfg, rebuild=False)
    rows = int(statistics[ROWS_VALIDATED] or 0)
    summary = _summary(ds, commit.run_id, rows, version, reports, str(index))
    raise_for_critical(reports)
    validated = {BRONZE_AD_EVENTS.name: version}
    if (quarantine_version := _recorded_version(ingest_record, BRONZE_QUARANTINE.name)) is not None:
        validated[BRONZE_QUARANTINE.name] = quarantine_version
    commit.publish(None, rows, no_input_count=VALIDATION_WRITES_NOTHING, validated=validated)
    return commit.result(t0, **summary)


def _print_summary(summary: dict[str, Any]) -> None:
    print(f"Data Docs: {summary['data_docs_index']}")
    for line in summary["suites"].values():
        print(f"  {line}")
    for warning in summary["warnings"]:
        print(f"  {warning}")
    print(f"{STAGE} ds={summary['ds']}: {summary['rows_validated']} rows validated, completion published")


def main(argv: Sequence[str] | None = None) -> int:
    args = job_parser("Validate one day of bronze.ad_events (Great Expectations).").parse_args(argv)
    cfg = load_config(args.config)
    try:
        summary = run(StageContext(cfg), args.ds).details
    except DataQualityError as e:
        print(f"{STAGE} ds={args.ds} FAILED: {e}", file=sys.stderr)
        print(f"Data Docs: {docs_site_dir(cfg) / 'index.html'}", file=sys.stderr)
        return 1
    except (MissingInputError, MissingDocsAssetsError) as e:
        print(f"{STAGE} ds={args.ds} cannot run: {e}", file=sys.stderr)
        return 1
    _print_summary(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())

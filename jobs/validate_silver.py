"""Validate one day of the silver tables with Great Expectations; gate downstream stages on it.

    python -m jobs.validate_silver --ds D                 # user_sequences, user_features, ad_features of D
    python -m jobs.validate_silver --examples --ds D      # training_examples of D
    python -m jobs.validate_silver --examples --ready-on R  # ... of D = R - attribution_window_days
    python -m jobs.validate_silver [--examples] --ds A --through B  # the days A..B, each suite run once

Suites: gem/quality/silver.py. Each batch is the run's ds partitions at one Delta version where every
day holds the files its build recorded, and each day's record names that version (readers read it). All suites of a run are validated and the Data Docs refreshed before a failed critical
expectation fails the job; otherwise the stage's completion record is published last:
`validate_silver` (sequences and features of D) or `validate_examples` (examples of D).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gem import storage
from gem.lakehouse import tables
from gem.lakehouse.commit import DayCounts, StageCommit, StageContext, StageResult
from gem.lakehouse.completions import MissingInputError
from gem.pipeline.cli import StageCall, run_command, stage_command
from gem.quality import silver as qs
from gem.quality.bronze import statistics_frame
from gem.quality.docs_assets import MissingDocsAssetsError
from gem.quality.runner import build_data_docs, docs_site_uri, raise_for_critical, validate
from jobs.validate_events import VALIDATION_WRITES_NOTHING
from schemas.examples import SILVER_TRAINING_EXAMPLES
from schemas.features import SILVER_AD_FEATURES, SILVER_USER_FEATURES
from schemas.sequences import SILVER_USER_SEQUENCES

if TYPE_CHECKING:
    from great_expectations.expectations import Expectation
    from pyspark.sql import DataFrame, SparkSession

    from schemas.table import TableSchema

SILVER_STAGE = "validate_silver"
EXAMPLES_STAGE = "validate_examples"


@dataclass
class Batch:
    suite_name: str
    df: Any  # a Spark DataFrame, or a pandas statistics frame (a row per day)
    expectations: list[Expectation]


def _validated_days(spark: SparkSession, commit: StageCommit, schema: TableSchema, producer: str) -> tuple[DataFrame, int]:
    """The commit's days of `schema`, read at the one version where each day holds the files its
    producing stage recorded (StaleInputError, naming the rerun, when a day changed since); -> (rows, version)."""

    days = list(commit.days)
    version = commit.validated_version(schema, producer, days)
    rows = tables.read_table(spark, commit.cfg, schema, version=version)
    return rows.where(f"ds BETWEEN DATE'{days[0]}' AND DATE'{days[-1]}'"), version


def _validate_and_publish(commit: StageCommit, batches: list[Batch], validated: dict[str, int],
                          rows: dict[str, int], started: float) -> StageResult:
    """One run of each suite over the batch of every day; a failed critical rule fails the run (no day
    is published), else one record per day with that day's rows validated."""

    cfg = commit.cfg
    # Cached: each of a suite's query expectations runs a count and a collect over the batch, so
    # uncached every rule re-reads the partition, which is slower.
    label = f"{commit.stage.name}:{commit.label}"
    reports = [validate(cfg, b.df, b.suite_name, b.expectations, label, raise_on_critical=False, cache=True)
               for b in batches]
    build_data_docs(cfg, rebuild=False)
    raise_for_critical(reports)
    commit.publish(no_input_count=VALIDATION_WRITES_NOTHING, validated=validated,
                   per_day={day: DayCounts(None, rows.get(day, 0)) for day in commit.days})
    return commit.result(started, reports=reports)


def run_tables(ctx: StageContext, ds: str, through: str | None = None) -> StageResult:
    """Sequences and features of ds (or of the days ds..through, each suite run once over them);
    needs build_sequences' and build_features' records. Details: the validation reports."""

    t0, cfg, spark = time.time(), ctx.cfg, ctx.spark_for(SILVER_STAGE, ds)
    # Withdrawn first: a failing rerun must not leave an old "validated" record standing.
    commit = StageCommit.begin(ctx, SILVER_STAGE, ds, through)
    days = list(commit.days)
    sequences, sequences_version = _validated_days(spark, commit, SILVER_USER_SEQUENCES, "build_sequences")
    user_features, user_version = _validated_days(spark, commit, SILVER_USER_FEATURES, "build_features")
    ad_features, ad_version = _validated_days(spark, commit, SILVER_AD_FEATURES, "build_features")
    validated = {SILVER_USER_SEQUENCES.name: sequences_version, SILVER_USER_FEATURES.name: user_version,
                 SILVER_AD_FEATURES.name: ad_version}
    rows = {day: int(commit.record("build_sequences", day)["rows_written"])
            + int(commit.record("build_features", day)["rows_written"]) for day in days}
    # Persisted here, not by validate(): the margin statistics read it too (one pass over the arrays).
    sequence_checks = qs.sequence_checks(sequences, cfg).persist()
    try:
        batches = [
            Batch(f"{SILVER_USER_SEQUENCES.name}.rules", sequence_checks, qs.sequence_expectations(cfg)),
            Batch(f"{SILVER_USER_SEQUENCES.name}.cap_margin",
                  statistics_frame(qs.sequence_margin_statistics(sequence_checks, days)), qs.sequence_margin_expectations(cfg)),
            Batch(f"{SILVER_USER_FEATURES.name}.rules", qs.feature_checks(user_features, "user_id"),
                  qs.feature_expectations(cfg, "user_id")),
            Batch(f"{SILVER_AD_FEATURES.name}.rules", qs.feature_checks(ad_features, "ad_id"),
                  qs.feature_expectations(cfg, "ad_id")),
        ]
        return _validate_and_publish(commit, batches, validated, rows, t0)
    finally:
        sequence_checks.unpersist()


def run_examples(ctx: StageContext, ds: str, through: str | None = None) -> StageResult:
    """Training examples of ds (or of the days ds..through, one suite run over them); needs
    assemble_examples' record. Details: the validation reports."""

    t0, cfg, spark = time.time(), ctx.cfg, ctx.spark_for(EXAMPLES_STAGE, ds)
    commit = StageCommit.begin(ctx, EXAMPLES_STAGE, ds, through)
    examples, version = _validated_days(spark, commit, SILVER_TRAINING_EXAMPLES, "assemble_examples")
    batch = qs.with_snapshot_checks(examples, tables.read_table(spark, cfg, SILVER_USER_SEQUENCES), cfg)
    batches = [Batch(f"{SILVER_TRAINING_EXAMPLES.name}.rules", batch, qs.example_expectations(cfg))]
    rows = {str(r["ds"]): int(r["count"])
            for r in examples.groupBy("ds").count().collect()}
    return _validate_and_publish(commit, batches, {SILVER_TRAINING_EXAMPLES.name: version}, rows, t0)


def command_line(call: StageCall) -> int:
    """Validate the sequences and features of --ds, or with --examples its training examples (of
    the days --ds..--through, or of the day whose window closes on --ready-on); print each suite's
    summary, or exit 1 naming the failed expectations or the missing input."""
    stage, ds, cfg = call.stage.name, call.ds, call.cfg
    runner = run_examples if stage == EXAMPLES_STAGE else run_tables
    try:  # a failed critical expectation: gem.pipeline.cli prints its lines and the command to rerun
        reports = runner(StageContext(cfg), ds, call.through).details["reports"]
    except (MissingInputError, MissingDocsAssetsError) as e:
        print(f"{stage} ds={ds} cannot run: {e}", file=sys.stderr)
        return 1
    print(f"Data Docs: {storage.join(docs_site_uri(cfg), 'index.html')}")
    for r in reports:
        print(f"  {r.summary()}")
        for o in r.failed_warnings:
            print(f"    warning: {o.describe()}")
    print(f"{stage} ds={ds}: validated, completion published")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(stage_command("validate_silver", command_line), argv)


if __name__ == "__main__":
    sys.exit(main())

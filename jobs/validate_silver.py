"""Validate one day of the silver tables with Great Expectations; gate downstream stages on it.

    python -m jobs.validate_silver --ds D                 # user_sequences, user_features, ad_features of D
    python -m jobs.validate_silver --examples --ds D      # training_examples of D
    python -m jobs.validate_silver --examples --ready-on R  # ... of D = R - attribution_window_days

Suites: gem/quality/silver.py. Each batch is the ds partition at the Delta version its build
recorded, and the record names those versions (readers read them). All suites of a run are validated and the Data Docs refreshed before a failed critical
expectation fails the job; otherwise the stage's completion record is published last:
`validate_silver` (sequences and features of D) or `validate_examples` (examples of D).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gem.cli import examples_parser, iso_day, resolve_examples_day
from gem.config import GemConfig, load_config
from gem.lakehouse.commit import StageCommit, StageContext, StageResult
from gem.orchestration import NOTHING_READY_EXIT  # exit code: nothing ready yet, the task is skipped

if TYPE_CHECKING:
    from great_expectations.expectations import Expectation
    from pyspark.sql import DataFrame, SparkSession

    from schemas.table import TableSchema

SILVER_STAGE = "validate_silver"
EXAMPLES_STAGE = "validate_examples"


@dataclass
class Batch:
    suite_name: str
    df: Any  # a Spark DataFrame, or a one-row pandas statistics frame
    expectations: list[Expectation]


def _partition(spark: SparkSession, cfg: GemConfig, schema: TableSchema, ds: str, record: dict[str, Any]) -> DataFrame:
    """The ds partition of `schema` at the version the producing stage recorded."""
    from gem.lakehouse import tables

    version = (record.get("table_versions") or {}).get(schema.name)
    return tables.read_table(spark, cfg, schema, version=version).where(f"ds = DATE'{ds}'")


def _validate_and_publish(commit: StageCommit, spark: SparkSession, batches: list[Batch],
                          validated: dict[str, int], rows: int, started: float) -> StageResult:
    from gem.quality.runner import build_data_docs, raise_for_critical, validate
    from jobs.validate_events import VALIDATION_WRITES_NOTHING

    cfg = commit.cfg
    # Cached: each of a suite's query expectations runs a count and a collect over the batch, so
    # uncached every rule re-reads the partition (the demo's 60k examples: 40 s uncached, 26 s cached).
    reports = [validate(cfg, b.df, b.suite_name, b.expectations, commit.ds, raise_on_critical=False, cache=True)
               for b in batches]
    build_data_docs(cfg, rebuild=False)
    raise_for_critical(reports)
    commit.publish(None, rows, no_input_count=VALIDATION_WRITES_NOTHING, validated=validated)
    return commit.result(started, reports=reports)


def run_tables(ctx: StageContext, ds: str) -> StageResult:
    """Sequences and features of ds; needs build_sequences' and build_features' records. Details:
    the validation reports."""
    from gem.quality import silver as qs
    from gem.quality.bronze import statistics_frame
    from schemas.features import SILVER_AD_FEATURES, SILVER_USER_FEATURES
    from schemas.sequences import SILVER_USER_SEQUENCES

    t0, cfg, spark = time.time(), ctx.cfg, ctx.spark_for(SILVER_STAGE, ds)
    # Withdrawn first: a failing rerun must not leave an old "validated" record standing.
    commit = StageCommit.begin(ctx, SILVER_STAGE, ds)
    sequences_record, features_record = commit.record("build_sequences", ds), commit.record("build_features", ds)
    sequences = _partition(spark, cfg, SILVER_USER_SEQUENCES, ds, sequences_record)
    batches = [
        Batch(f"{SILVER_USER_SEQUENCES.name}.rules", sequences, qs.sequence_expectations(cfg)),
        Batch(f"{SILVER_USER_SEQUENCES.name}.cap_margin",
              statistics_frame(qs.sequence_margin_statistics(sequences, ds)), qs.sequence_margin_expectations(cfg)),
        Batch(f"{SILVER_USER_FEATURES.name}.rules", _partition(spark, cfg, SILVER_USER_FEATURES, ds, features_record),
              qs.feature_expectations(cfg, "user_id")),
        Batch(f"{SILVER_AD_FEATURES.name}.rules", _partition(spark, cfg, SILVER_AD_FEATURES, ds, features_record),
              qs.feature_expectations(cfg, "ad_id")),
    ]
    validated = {t: int(sequences_record["table_versions"][t]) for t in (SILVER_USER_SEQUENCES.name,)}
    validated |= {t: int(features_record["table_versions"][t]) for t in (SILVER_USER_FEATURES.name, SILVER_AD_FEATURES.name)}
    rows = int(sequences_record["rows_written"]) + int(features_record["rows_written"])
    return _validate_and_publish(commit, spark, batches, validated, rows, t0)


def run_examples(ctx: StageContext, ds: str) -> StageResult:
    """Training examples of ds; needs assemble_examples' record. Details: the validation reports."""
    from gem.lakehouse import tables
    from gem.quality import silver as qs
    from schemas.examples import SILVER_TRAINING_EXAMPLES
    from schemas.sequences import SILVER_USER_SEQUENCES

    t0, cfg, spark = time.time(), ctx.cfg, ctx.spark_for(EXAMPLES_STAGE, ds)
    commit = StageCommit.begin(ctx, EXAMPLES_STAGE, ds)
    record = commit.record("assemble_examples", ds)
    examples = _partition(spark, cfg, SILVER_TRAINING_EXAMPLES, ds, record)
    batch = qs.with_snapshot_checks(examples, tables.read_table(spark, cfg, SILVER_USER_SEQUENCES), cfg)
    batches = [Batch(f"{SILVER_TRAINING_EXAMPLES.name}.rules", batch, qs.example_expectations(cfg))]
    validated = {SILVER_TRAINING_EXAMPLES.name: int(record["table_versions"][SILVER_TRAINING_EXAMPLES.name])}
    return _validate_and_publish(commit, spark, batches, validated, examples.count(), t0)


def main(argv: Sequence[str] | None = None) -> int:
    from gem.lakehouse.completions import MissingInputError
    from gem.quality.docs_assets import MissingDocsAssetsError
    from gem.quality.runner import DataQualityError, docs_site_dir

    parser = examples_parser(__doc__.splitlines()[0])
    parser.add_argument("--examples", action="store_true", help="validate silver.training_examples")
    args = parser.parse_args(argv)
    cfg = load_config(args.config)
    if args.examples:
        stage, ds, runner = EXAMPLES_STAGE, resolve_examples_day(cfg, args), run_examples
        if ds is None:
            print(f"{stage}: no examples day's window closes on {args.ready_on}; nothing to do")
            return NOTHING_READY_EXIT
    else:
        if args.ds is None:
            parser.error("--ready-on goes with --examples; sequences and features take --ds")
        stage, ds, runner = SILVER_STAGE, iso_day(args.ds), run_tables
    try:
        reports = runner(StageContext(cfg), ds).details["reports"]
    except DataQualityError as e:
        print(f"{stage} ds={ds} FAILED: {e}\nData Docs: {docs_site_dir(cfg) / 'index.html'}", file=sys.stderr)
        return 1
    except (MissingInputError, MissingDocsAssetsError) as e:
        print(f"{stage} ds={ds} cannot run: {e}", file=sys.stderr)
        return 1
    print(f"Data Docs: {docs_site_dir(cfg) / 'index.html'}")
    for r in reports:
        print(f"  {r.summary()}")
        for o in r.failed_warnings:
            print(f"    warning: {o.describe()}")
    print(f"{stage} ds={ds}: validated, completion published")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Validate one day of the silver tables with Great Expectations; gate downstream stages on it.

    python -m jobs.validate_silver --ds D                 # user_sequences, user_features, ad_features of D
    python -m jobs.validate_silver --examples --ds D      # training_examples of D
    python -m jobs.validate_silver --examples --ready-on R  # ... of D = R - attribution_window_days

Suites: gem/quality_silver.py. Each batch is the ds partition at the Delta version its build
recorded. All suites of a run are validated and the Data Docs refreshed before a failed critical
expectation fails the job; otherwise the stage's completion record is published last:
`validate_silver` (sequences and features of D) or `validate_examples` (examples of D).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gem.cli import examples_parser, iso_day, resolve_examples_day
from gem.config import GemConfig, load_config
from gem.orchestration import NOTHING_READY_EXIT  # exit code: nothing ready yet, the task is skipped

if TYPE_CHECKING:
    from great_expectations.expectations import Expectation
    from pyspark.sql import DataFrame, SparkSession

    from gem.quality import ValidationReport
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
    from gem import lakehouse

    version = (record.get("table_versions") or {}).get(schema.name)
    return lakehouse.read_table(spark, cfg, schema, version=version).where(f"ds = DATE'{ds}'")


def _validate_and_publish(
    spark: SparkSession, cfg: GemConfig, stage: str, ds: str, batches: list[Batch], record: dict[str, Any]
) -> list[ValidationReport]:
    from gem import lakehouse
    from gem.quality import build_data_docs, raise_for_critical, validate

    lakehouse.clear_completion(cfg, stage, ds)  # a failing rerun must not leave an old "validated"
    run_id = lakehouse.new_run_id(stage, ds)
    reports = [validate(cfg, b.df, b.suite_name, b.expectations, ds, raise_on_critical=False) for b in batches]
    build_data_docs(cfg, rebuild=False)
    raise_for_critical(reports)
    rows = int(record["rows_written"])
    lakehouse.publish_completion(cfg, stage, ds, run_id, rows, rows, {}, record.get("table_versions") or {})
    return reports


def run_tables(cfg: GemConfig, ds: str, spark: SparkSession | None = None) -> list[ValidationReport]:
    """Sequences and features of ds; needs build_sequences' and build_features' records."""
    from gem import lakehouse
    from gem import quality_silver as qs
    from gem.quality import statistics_frame
    from gem.spark import get_spark
    from schemas.features import SILVER_AD_FEATURES, SILVER_USER_FEATURES
    from schemas.sequences import SILVER_USER_SEQUENCES

    spark = spark or get_spark(cfg, app_name=f"{SILVER_STAGE}:{ds}")
    records = lakehouse.require_stage_inputs(cfg, SILVER_STAGE, ds)
    sequences_record, features_record = records[("build_sequences", ds)], records[("build_features", ds)]
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
    record = {
        "rows_written": int(sequences_record["rows_written"]) + int(features_record["rows_written"]),
        "table_versions": {**sequences_record["table_versions"], **features_record["table_versions"]},
    }
    return _validate_and_publish(spark, cfg, SILVER_STAGE, ds, batches, record)


def run_examples(cfg: GemConfig, ds: str, spark: SparkSession | None = None) -> list[ValidationReport]:
    """Training examples of ds; needs assemble_examples' record."""
    from gem import lakehouse
    from gem import quality_silver as qs
    from gem.spark import get_spark
    from schemas.examples import SILVER_TRAINING_EXAMPLES
    from schemas.sequences import SILVER_USER_SEQUENCES

    spark = spark or get_spark(cfg, app_name=f"{EXAMPLES_STAGE}:{ds}")
    record = lakehouse.require_stage_inputs(cfg, EXAMPLES_STAGE, ds)[("assemble_examples", ds)]
    examples = _partition(spark, cfg, SILVER_TRAINING_EXAMPLES, ds, record)
    sequences_path = lakehouse.table_path(cfg, SILVER_USER_SEQUENCES)
    batches = [Batch(f"{SILVER_TRAINING_EXAMPLES.name}.rules", examples, qs.example_expectations(cfg, sequences_path))]
    examples_record = {
        "rows_written": examples.count(),
        "table_versions": {SILVER_TRAINING_EXAMPLES.name: record["table_versions"][SILVER_TRAINING_EXAMPLES.name]},
    }
    return _validate_and_publish(spark, cfg, EXAMPLES_STAGE, ds, batches, examples_record)


def main(argv: Sequence[str] | None = None) -> int:
    from gem.docs_assets import MissingDocsAssetsError
    from gem.lakehouse import MissingInputError
    from gem.quality import DataQualityError, docs_site_dir

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
        reports = runner(cfg, ds)
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

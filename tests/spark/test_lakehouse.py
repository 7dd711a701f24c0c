"""Tables derived from schemas/: Delta properties, constraints, non-Spark readability, completions."""

from __future__ import annotations

import datetime as dt

import pytest

from gem import lakehouse
from schemas import TABLES
from schemas.events import BRONZE_AD_EVENTS, BRONZE_QUARANTINE
from schemas.ops import COMPLETIONS
from tests.landing_lines import bronze_event
from tests.support import make_config

DAY = "2026-01-01"


def _event(**fields):
    arrived = fields.pop("ds", dt.date(2026, 1, 1)).isoformat()
    return bronze_event(fields.pop("event_id", "e1"), arrived, **fields)


def test_tables_are_created_from_their_schema_with_properties_and_constraints(spark, cfg):
    for schema in TABLES.values():
        path = lakehouse.ensure_table(spark, cfg, schema)
        detail = spark.sql(f"DESCRIBE DETAIL delta.`{path}`").collect()[0]
        assert list(detail["partitionColumns"]) == list(schema.partition_by)
        props = dict(detail["properties"])
        assert props["delta.enableDeletionVectors"] == "false"
        assert props["delta.columnMapping.mode"] == "none"
        retention = f"interval {cfg.retention_days} days"
        assert props["delta.logRetentionDuration"] == retention
        assert props["delta.deletedFileRetentionDuration"] == retention
        assert cfg.retention_days > cfg.attribution_window_days + cfg.training_horizon_days
        constraints = {k.split(".", 2)[2] for k in props if k.startswith("delta.constraints.")}
        assert constraints == {name.lower() for name, _ in schema.check_constraints()}
        nullable = {f.name: f.nullable for f in spark.read.format("delta").load(path).schema.fields}
        assert nullable == {c.name: c.nullable for c in schema.columns}
        lakehouse.ensure_table(spark, cfg, schema)  # idempotent


def test_a_constraint_violation_fails_the_whole_commit(spark, cfg):
    good = spark.createDataFrame([_event()], BRONZE_AD_EVENTS.spark_schema())
    v = lakehouse.replace_partition(good, cfg, BRONZE_AD_EVENTS, {"ds": DAY})
    bad = spark.createDataFrame([_event(event_id="e2"), _event(event_id="e3", surface="tiktok")], BRONZE_AD_EVENTS.spark_schema())
    with pytest.raises(Exception, match="surface_domain"):
        lakehouse.replace_partition(bad, cfg, BRONZE_AD_EVENTS, {"ds": DAY})
    assert lakehouse.latest_version(lakehouse.table_path(cfg, BRONZE_AD_EVENTS)) == v
    assert [r.event_id for r in lakehouse.read_table(spark, cfg, BRONZE_AD_EVENTS).collect()] == ["e1"]


def test_replace_partition_touches_only_its_partition_and_deltalake_reads_it(spark, cfg):

    rows = [_event(event_id=f"e{i}", ds=dt.date(2026, 1, 1 + i % 2)) for i in range(4)]
    df = spark.createDataFrame(rows, BRONZE_AD_EVENTS.spark_schema())
    lakehouse.replace_partition(df.where("ds = DATE'2026-01-01'"), cfg, BRONZE_AD_EVENTS, {"ds": "2026-01-01"})
    lakehouse.replace_partition(df.where("ds = DATE'2026-01-02'"), cfg, BRONZE_AD_EVENTS, {"ds": "2026-01-02"})
    replacement = spark.createDataFrame([_event(event_id="r1")], BRONZE_AD_EVENTS.spark_schema())
    lakehouse.replace_partition(replacement, cfg, BRONZE_AD_EVENTS, {"ds": "2026-01-01"})

    # Read through the Delta log without Spark, as the training loader does: the log lists the live
    # files and their partition values, which the reader restores beside the files' columns.
    from gem.data.delta_log import read_table

    table = read_table(lakehouse.table_path(cfg, BRONZE_AD_EVENTS), columns=["ds", "event_id"])
    got = sorted((r["ds"], r["event_id"]) for r in table.to_pylist())
    assert got == [(dt.date(2026, 1, 1), "r1"), (dt.date(2026, 1, 2), "e1"), (dt.date(2026, 1, 2), "e3")]

    # A row outside the predicate is refused instead of spilling into a neighbouring day.
    with pytest.raises(Exception, match="(?i)replaceWhere|does not conform|violat"):
        lakehouse.replace_partition(replacement, cfg, BRONZE_AD_EVENTS, {"ds": "2026-01-02"})


def test_existing_table_with_another_schema_is_refused(spark, cfg):
    path = lakehouse.table_path(cfg, BRONZE_QUARANTINE)
    spark.createDataFrame([("x",)], "raw_line string").write.format("delta").save(path)
    with pytest.raises(lakehouse.TableSchemaMismatch, match="bronze.quarantine"):
        lakehouse.ensure_table(spark, cfg, BRONZE_QUARANTINE)


def test_completion_records_gate_readers_and_reconcile(spark, tmp_path):
    cfg = make_config(tmp_path)
    with pytest.raises(lakehouse.MissingInputError, match="ingest_events.*ds=2026-01-01"):
        lakehouse.require_completed(cfg, "ingest_events", DAY)
    with pytest.raises(RuntimeError, match="do not reconcile"):
        lakehouse.publish_completion(cfg, "ingest_events", DAY, "r0", 10, 7, {"wrong_type": 2}, {})
    assert lakehouse.completion(cfg, "ingest_events", DAY) is None

    lakehouse.publish_completion(cfg, "ingest_events", DAY, "r1", 10, 7, {"wrong_type": 3}, {"t": 4})
    lakehouse.publish_completion(cfg, "ingest_events", DAY, "r2", 10, 7, {"wrong_type": 3}, {"t": 5})
    record = lakehouse.require_completed(cfg, "ingest_events", DAY)
    assert (record["run_id"], record["table_versions"]) == ("r2", {"t": 5})  # replaced, not appended
    assert lakehouse.read_table(spark, cfg, COMPLETIONS).count() == 1
    lakehouse.clear_completion(cfg, "ingest_events", DAY)
    assert lakehouse.completion(cfg, "ingest_events", DAY) is None

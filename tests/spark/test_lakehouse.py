"""Tables derived from schemas/: Delta properties, constraints, non-Spark readability, completions."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from gem.lakehouse import completions, tables
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
        path = tables.ensure_table(spark, cfg, schema)
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
        tables.ensure_table(spark, cfg, schema)  # idempotent


def test_a_constraint_violation_fails_the_whole_commit(spark, cfg):
    good = spark.createDataFrame([_event()], BRONZE_AD_EVENTS.spark_schema())
    v = tables.replace_partition(good, cfg, BRONZE_AD_EVENTS, {"ds": DAY}).version
    bad = spark.createDataFrame([_event(event_id="e2"), _event(event_id="e3", surface="tiktok")], BRONZE_AD_EVENTS.spark_schema())
    with pytest.raises(Exception, match="surface_domain"):
        tables.replace_partition(bad, cfg, BRONZE_AD_EVENTS, {"ds": DAY})
    assert tables.latest_version(tables.table_path(cfg, BRONZE_AD_EVENTS)) == v
    assert [r.event_id for r in tables.read_table(spark, cfg, BRONZE_AD_EVENTS).collect()] == ["e1"]


def test_replace_partition_touches_only_its_partition_and_deltalake_reads_it(spark, cfg):

    rows = [_event(event_id=f"e{i}", ds=dt.date(2026, 1, 1 + i % 2)) for i in range(4)]
    df = spark.createDataFrame(rows, BRONZE_AD_EVENTS.spark_schema())
    tables.replace_partition(df.where("ds = DATE'2026-01-01'"), cfg, BRONZE_AD_EVENTS, {"ds": "2026-01-01"})
    tables.replace_partition(df.where("ds = DATE'2026-01-02'"), cfg, BRONZE_AD_EVENTS, {"ds": "2026-01-02"})
    replacement = spark.createDataFrame([_event(event_id="r1")], BRONZE_AD_EVENTS.spark_schema())
    tables.replace_partition(replacement, cfg, BRONZE_AD_EVENTS, {"ds": "2026-01-01"})

    # Read through the Delta log without Spark, as the training loader does: the log lists the live
    # files and their partition values, which the reader restores beside the files' columns.
    from gem.data.delta_log import read_table

    table = read_table(tables.table_path(cfg, BRONZE_AD_EVENTS), columns=["ds", "event_id"])
    got = sorted((r["ds"], r["event_id"]) for r in table.to_pylist())
    assert got == [(dt.date(2026, 1, 1), "r1"), (dt.date(2026, 1, 2), "e1"), (dt.date(2026, 1, 2), "e3")]

    # A row outside the predicate is refused instead of spilling into a neighbouring day.
    with pytest.raises(Exception, match="(?i)replaceWhere|does not conform|violat"):
        tables.replace_partition(replacement, cfg, BRONZE_AD_EVENTS, {"ds": "2026-01-02"})


def test_existing_table_with_another_schema_is_refused(spark, cfg):
    path = tables.table_path(cfg, BRONZE_QUARANTINE)
    spark.createDataFrame([("x",)], "raw_line string").write.format("delta").save(path)
    with pytest.raises(tables.TableSchemaMismatch, match="bronze.quarantine"):
        tables.ensure_table(spark, cfg, BRONZE_QUARANTINE)


def test_completion_records_gate_readers_and_reconcile(spark, tmp_path):
    cfg = make_config(tmp_path)
    with pytest.raises(completions.MissingInputError, match="ingest_events.*ds=2026-01-01"):
        completions.require_completed(cfg, "ingest_events", DAY)
    with pytest.raises(RuntimeError, match="do not reconcile"):
        completions.publish_completion(cfg, "ingest_events", DAY, "r0", 10, 7, {"wrong_type": 2}, {})
    assert completions.completion(cfg, "ingest_events", DAY) is None

    completions.publish_completion(cfg, "ingest_events", DAY, "r1", 10, 7, {"wrong_type": 3}, {"t": 4})
    completions.publish_completion(cfg, "ingest_events", DAY, "r2", 10, 7, {"wrong_type": 3}, {"t": 5})
    record = completions.require_completed(cfg, "ingest_events", DAY)
    assert (record["run_id"], record["table_versions"]) == ("r2", {"t": 5})  # replaced, not appended
    assert tables.read_table(spark, cfg, COMPLETIONS).count() == 1
    completions.clear_completion(cfg, "ingest_events", DAY)
    assert completions.completion(cfg, "ingest_events", DAY) is None


def _ingest_commit(lake: str, ds: str, n_rows: int, barrier) -> None:
    """One process, one day: a real Spark session commits `n_rows` bronze rows for ds through the
    stage contract, at the same moment as the other process."""
    from gem.config import load_config
    from gem.lakehouse.commit import StageCommit, StageContext
    from gem.lakehouse.spark import get_spark

    cfg = load_config(overrides={"lakehouse_uri": lake, "spark": {"master": "local[1]", "shuffle_partitions": 1,
                                                                  "driver_memory": "1g"}}, environ={})
    spark = get_spark(cfg, app_name=f"concurrent:{ds}")
    rows = [_event(event_id=f"{ds}-{i}", ds=dt.date.fromisoformat(ds)) for i in range(n_rows)]
    df = spark.createDataFrame(rows, BRONZE_AD_EVENTS.spark_schema()).localCheckpoint(eager=True)
    commit = StageCommit.begin(StageContext(cfg, spark), "ingest_events", ds)
    barrier.wait(timeout=300)  # both days commit at the same moment
    commit.replace(df, BRONZE_AD_EVENTS)
    commit.publish(n_rows, n_rows, {}, written_tables=(BRONZE_AD_EVENTS,))
    spark.stop()


@pytest.mark.slow
def test_two_spark_days_committing_at_once_record_their_own_versions(tmp_path):
    """Real processes, each with its own Spark session: each day's record names the version its own
    commit created and the rows it wrote, never the other day's."""
    import multiprocessing

    from deltalake import DeltaTable

    from gem.lakehouse.landing import mark_partition_complete

    cfg = make_config(tmp_path)
    days = {"2026-01-01": 3, "2026-01-02": 5}
    for d in days:
        mark_partition_complete(cfg.landing_root, d, {"producer": "test"})
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(len(days))
    procs = [ctx.Process(target=_ingest_commit, args=(cfg.lakehouse_uri, d, n, barrier)) for d, n in days.items()]
    for p in procs:
        p.start()
    for p in procs:
        p.join(600)
        assert p.exitcode == 0
    history = DeltaTable(tables.table_path(cfg, BRONZE_AD_EVENTS)).history()
    by_version = {int(c["version"]): c.get("userMetadata") or "" for c in history}
    versions = set()
    for d, n in days.items():
        record = completions.completion(cfg, "ingest_events", d)
        version = record["table_versions"][BRONZE_AD_EVENTS.name]
        assert record["run_id"] in by_version[version] and f'"ds": "{d}"' in by_version[version]
        assert record["rows_written"] == n  # from its own commit's metrics
        versions.add(version)
    assert len(versions) == 2


def test_local_sessions_start_from_the_class_archive_made_at_set_up(spark):
    """`make setup` writes the JVM class archive (gem.lakehouse.spark.archive_classes); the driver JVM
    of a local session is started with it (a JVM that cannot map it starts without it)."""
    from gem.config import load_config

    archive = load_config(environ={}).spark.class_archive
    assert Path(archive).is_file(), f"no class archive at {archive}: `make setup` writes it"
    jvm = spark.sparkContext._jvm
    args = list(jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments())
    assert f"-XX:SharedArchiveFile={archive}" in args
    assert "sharing" in jvm.java.lang.System.getProperty("java.vm.info")


def test_local_sessions_set_file_modes_without_a_chmod_process(spark, tmp_path):
    """`make setup` builds infra/spark/localfs; local sessions use it for file:// paths, and its
    setPermission (java.nio, not a forked chmod) sets the modes Hadoop asks for."""
    import os
    import stat

    from gem.config import load_config
    from gem.lakehouse.spark import NIO_LOCAL_FS

    jar = load_config(environ={}).spark.local_fs_jar
    assert Path(jar).is_file(), f"no local file system jar at {jar}: `make setup` builds it"
    jvm = spark.sparkContext._jvm
    fs = jvm.org.apache.hadoop.fs.FileSystem.get(jvm.java.net.URI("file:///"), spark.sparkContext._jsc.hadoopConfiguration())
    assert fs.getClass().getName() == NIO_LOCAL_FS
    target = tmp_path / "f"
    target.write_text("x")
    for mode in (0o600, 0o754):
        fs.setPermission(jvm.org.apache.hadoop.fs.Path(str(target)), jvm.org.apache.hadoop.fs.permission.FsPermission(mode))
        assert stat.S_IMODE(os.stat(target).st_mode) == mode
    # A Delta write through it: data files with Hadoop's default mode (0666 less its umask 022).
    path = str(tmp_path / "t")
    spark.range(3).selectExpr("id", "id % 2 AS p").write.format("delta").partitionBy("p").save(path)
    files = [f for f in (tmp_path / "t" / "p=0").iterdir() if f.suffix == ".parquet"]
    assert files and all(stat.S_IMODE(os.stat(f).st_mode) == 0o644 for f in files)
    assert spark.read.format("delta").load(path).count() == 3

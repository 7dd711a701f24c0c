"""The Delta side on an object store: a lakehouse at s3://bucket/prefix on the local S3 API server.

Spark writes its tables through S3A (s3a://), deltalake writes and reads its own and reads Spark's
through the log (s3://), each table through its one writer engine; several deltalake writers commit
to one table on S3 without losing a commit (S3's conditional put)."""

from __future__ import annotations

import datetime as dt
import multiprocessing
import subprocess
import time

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from gem import storage
from gem.data import delta_log
from gem.lakehouse import completions, tables
from gem.lakehouse.commit import StageCommit, StageContext
from schemas.events import BRONZE_AD_EVENTS
from schemas.ops import COMPLETIONS
from tests.landing_lines import bronze_event
from tests.support import PYTHON, make_config, subprocess_env

DAYS = ("2026-01-01", "2026-01-02")
WRITERS = 2
APPENDS = 10


@pytest.fixture
def s3_cfg(tmp_path, s3_bucket):
    return make_config(tmp_path, lakehouse_uri=s3_bucket + "/lake")


def _events(spark, ids: list[str], day: str):
    rows = [bronze_event(event_id, day) for event_id in ids]
    return spark.createDataFrame(rows, BRONZE_AD_EVENTS.spark_schema())


def test_spark_tables_on_s3_are_created_replaced_and_read_by_both_engines(spark, s3_cfg, s3_bucket) -> None:
    path = tables.ensure_table(spark, s3_cfg, BRONZE_AD_EVENTS)
    assert path == f"{s3_bucket}/lake/bronze/ad_events"  # stored and compared in storage's spelling
    assert tables.table_exists(path) and storage.exists(storage.join(path, "_delta_log", f"{0:020d}.json"))

    for day in DAYS:
        tables.replace_partition(_events(spark, [f"{day}-a", f"{day}-b"], day), s3_cfg, BRONZE_AD_EVENTS,
                                 {"ds": day}, "run-1")
    replaced = tables.replace_partition(_events(spark, ["r1"], DAYS[0]), s3_cfg, BRONZE_AD_EVENTS,
                                        {"ds": DAYS[0]}, "run-2")
    assert replaced.rows == 1 and replaced.version == tables.latest_version(path)

    expected = ["2026-01-02-a", "2026-01-02-b", "r1"]
    assert sorted(r.event_id for r in tables.read_table(spark, s3_cfg, BRONZE_AD_EVENTS).collect()) == expected

    # deltalake reads the Spark-written table through its log; its data files through gem.storage.
    assert sorted(delta_log.read_table(path, columns=["event_id"])["event_id"].to_pylist()) == expected
    files = delta_log.logged_files(path, replaced.version)
    assert {f.partition["ds"] for f in files} == set(DAYS)
    assert all(f.path.startswith(path + "/ds=") and storage.exists(f.path) for f in files)
    day_one = delta_log.read_table(path, where={"ds": DAYS[0]})
    assert day_one["event_id"].to_pylist() == ["r1"] and day_one["ds"].to_pylist() == [dt.date(2026, 1, 1)]
    # The older version still reads; the last commit changed day one only.
    assert len(delta_log.read_table(path, replaced.version - 1)) == 4
    assert delta_log.data_changes_by_version(path, replaced.version - 1, replaced.version) == {
        replaced.version: {DAYS[0]}}

    # A file the log lists but the store lost (as after a VACUUM) is named, not a bare S3 error.
    gone = next(f for f in files if f.partition["ds"] == DAYS[1])
    assert storage.delete(gone.path)
    with pytest.raises(delta_log.MissingDataFileError, match="does not exist"):
        delta_log.read_table(path, where={"ds": DAYS[1]})
    with pytest.raises(delta_log.MissingDataFileError, match="does not exist"):
        delta_log.require_file(gone.path, "test")


def test_a_deltalake_table_on_s3_is_written_and_read_and_table_exists_answers(s3_cfg, s3_bucket) -> None:
    path = tables.table_path(s3_cfg, COMPLETIONS)
    assert not tables.table_exists(path)
    assert completions.completion(s3_cfg, "ingest_events", DAYS[0]) is None

    completions.publish_completion(s3_cfg, "ingest_events", DAYS[0], "run-1", 10, 9, {"malformed_json": 1}, {})
    completions.publish_completion(s3_cfg, "ingest_events", DAYS[0], "run-2", 12, 12, {}, {})

    assert tables.table_exists(path)
    assert not tables.table_exists(storage.join(s3_bucket, "lake", "_ops", "nothing"))
    assert not tables.table_exists(storage.join(s3_bucket, "lake"))  # a prefix holding tables is none itself
    record = completions.completion(s3_cfg, "ingest_events", DAYS[0])
    assert record is not None and record["run_id"] == "run-2" and record["rows_written"] == 12
    assert tables.table_exists(storage.spark_uri(path))  # Spark's spelling names the same table


def _append(args: tuple[str, int]) -> None:
    """One writer process: APPENDS single-row commits to the table at `uri`."""
    uri, writer = args
    for i in range(APPENDS):
        write_deltalake(uri, pa.table({"writer": [writer], "i": [i]}), mode="append",
                        storage_options=storage.delta_storage_options(uri))


def test_concurrent_deltalake_writers_on_s3_lose_no_commit(s3_bucket) -> None:
    uri = storage.join(s3_bucket, "lake", "gold", "appends")
    write_deltalake(uri, pa.table({"writer": pa.array([], pa.int64()), "i": pa.array([], pa.int64())}),
                    storage_options=storage.delta_storage_options(uri))
    # Spawned, not forked: this process runs deltalake's threads and a JVM.
    with multiprocessing.get_context("spawn").Pool(WRITERS) as pool:
        pool.map(_append, [(uri, w) for w in range(WRITERS)])

    assert delta_log.table_version(uri) == WRITERS * APPENDS  # version 0 created the table
    rows = delta_log.read_table(uri).to_pylist()
    assert sorted((r["writer"], r["i"]) for r in rows) == [(w, i) for w in range(WRITERS) for i in range(APPENDS)]


def test_a_write_through_the_other_engine_is_refused(spark, s3_cfg, tmp_path) -> None:
    """Spark may not write a deltalake table, nor a stage's deltalake commit a Spark table; both are
    refused before anything is written."""
    frame = spark.createDataFrame([], COMPLETIONS.spark_schema())
    with pytest.raises(tables.WrongWriterError, match=r"_ops.completions: refused a write through spark.*"
                                                      r"writer='deltalake'"):
        tables.replace_partition(frame, s3_cfg, COMPLETIONS, {"ds": DAYS[0]})
    assert not tables.table_exists(tables.table_path(s3_cfg, COMPLETIONS))

    # The stage commit path (its leases and records on a local lakehouse: the check is the same).
    cfg = make_config(tmp_path)
    completions.publish_completion(cfg, "mix", DAYS[0], "test:mix", None, 0, {}, {}, reconciliation="stand-in")
    commit = StageCommit.begin(StageContext(cfg), "pretrain", DAYS[0])
    rows = pa.Table.from_pylist([bronze_event("e1", DAYS[0])], schema=BRONZE_AD_EVENTS.arrow_schema())
    with pytest.raises(tables.WrongWriterError, match=r"bronze.ad_events: refused a write through deltalake.*"
                                                      r"writer='spark'"):
        commit.replace_arrow(rows, BRONZE_AD_EVENTS)
    assert not tables.table_exists(tables.table_path(cfg, BRONZE_AD_EVENTS))


HOLD_S = 20.0  # longer than a small write takes, so a write that did not wait commits before the release
# A second driver holding the table's writer lease: another process (a lease held by this very
# process would count as left over from an earlier try and be taken over).
_HOLDER = """
import sys, time
from gem.lakehouse import lease, tables
with lease.held(tables.driver_lease_path(sys.argv[1]), "other-driver", "test", 60, 5):
    print("held", flush=True)
    time.sleep(float(sys.argv[2]))
print(time.time(), flush=True)
"""


def test_a_spark_write_on_s3_waits_for_the_driver_writing_the_table(spark, s3_cfg) -> None:
    """Delta's S3 log store is safe for one driver at a time: a Spark write holds the table's writer
    lease, so a second driver's write waits until the first has committed, and no commit is lost."""
    path = tables.ensure_table(spark, s3_cfg, BRONZE_AD_EVENTS)
    holder = subprocess.Popen([PYTHON, "-c", _HOLDER, path, str(HOLD_S)], stdout=subprocess.PIPE, text=True,
                              env=subprocess_env())
    assert holder.stdout.readline().strip() == "held"
    started = time.time()
    committed = tables.replace_partition(_events(spark, ["w1"], DAYS[0]), s3_cfg, BRONZE_AD_EVENTS,
                                         {"ds": DAYS[0]}, "waiting-writer")
    finished = time.time()
    released_at = float(holder.stdout.readline())
    assert holder.wait(timeout=60) == 0
    assert finished >= released_at >= started + HOLD_S, (started, released_at, finished)
    assert committed.rows == 1 and committed.version == tables.latest_version(path)
    assert not storage.exists(tables.driver_lease_path(path))  # released after the commit

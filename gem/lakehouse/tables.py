"""Thin Delta I/O every stage shares: table creation from schemas/, partition replaces, commit metrics.

Rules (README, "Rules every stage follows"): writes replace exactly the declared partitions
atomically (`replaceWhere`), through gem.lakehouse.commit.StageCommit, which also publishes the
completion record (gem.lakehouse.completions) last.

Tables are path-based (`{lakehouse}/{layer}/{table}`, a local folder or an object store URI in
gem.storage's one spelling), created with deletion vectors and column mapping off (so the
`deltalake` package reads them through the log) and with log and removed-file retention longer than
the attribution window plus the training horizon. Spark is given the path as Spark names it
(`spark_location`: s3a://), deltalake as gem.storage names it (s3://) with gem.storage's options.

Each table has one writer engine (TableSchema.writer): its data writes, compactions and deletes
all go through that engine, and a write through the other is refused (`require_writer`).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gem import storage
from gem.config import GemConfig
from gem.days import day_range
from gem.lakehouse import lease
from gem.lakehouse.spark import configure_object_store
from schemas.table import TableSchema

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

# The session conf Delta takes a commit's userMetadata from, for SQL commands (DELETE, OPTIMIZE).
USER_METADATA_CONF = "spark.databricks.delta.commitInfo.userMetadata"


class TableSchemaMismatch(RuntimeError):
    """An existing Delta table does not match its definition in schemas/."""


class WrongWriterError(RuntimeError):
    """A write to a table through an engine other than the one its schema declares (TableSchema.writer)."""


def table_path(cfg: GemConfig, schema: TableSchema) -> str:
    return schema.path(cfg.lakehouse_uri)


def require_writer(schema: TableSchema, engine: str) -> None:
    """Refuse a write to `schema`'s table through `engine` ("spark" or "deltalake") unless it is the
    table's declared writer: the two engines' commits, compactions and vacuums never mix on a table."""
    if schema.writer != engine:
        declared = f"declares writer={schema.writer!r}" if schema.writer else "is not a Delta table (writer=None)"
        raise WrongWriterError(
            f"{schema.name}: refused a write through {engine}; its schema in schemas/ {declared}, and a "
            f"table is written by one engine only (change TableSchema.writer to move it to another)")


def table_exists(uri: str) -> bool:
    """Whether a Delta table is at `uri` (a local folder or an object store URI): its log is there."""
    from deltalake import DeltaTable

    location = storage.normalized(uri)
    return bool(DeltaTable.is_deltatable(location, storage_options=storage.delta_storage_options(location)))


def spark_location(spark: SparkSession, uri: str) -> str:
    """`uri` as Spark is given it (storage.spark_uri: s3a:// for S3), the session set up for the
    object store first (gem.lakehouse.spark.configure_object_store)."""
    if not storage.is_local(uri):
        configure_object_store(spark)
    return storage.spark_uri(uri)


def delta_table(uri: str, version: int | None = None) -> Any:
    """deltalake's table object at `uri` (gem.data.delta_log.delta_table: the storage options)."""
    from gem.data.delta_log import delta_table as open_table

    return open_table(uri, version)


def table_properties(cfg: GemConfig) -> dict[str, str]:
    days = cfg.retention_days
    return {
        "delta.enableDeletionVectors": "false",
        "delta.columnMapping.mode": "none",
        "delta.logRetentionDuration": f"interval {days} days",
        "delta.deletedFileRetentionDuration": f"interval {days} days",
    }


# What a CREATE TABLE IF NOT EXISTS raises when another process creates the same table at the same
# moment: it committed first (protocol or metadata changed), or it had begun writing the table's
# folder when this one looked (non-empty location).
_CONCURRENT_CREATE_ERRORS = ("DELTA_PROTOCOL_CHANGED", "DELTA_METADATA_CHANGED",
                             "DELTA_CREATE_TABLE_WITH_NON_EMPTY_LOCATION")


def _appears_as_delta_table(path: str, timeout_s: float = 60.0) -> bool:
    """Whether `path` is (or within timeout_s becomes) a Delta table: the other creator's first
    commit may still be on its way."""
    deadline = time.monotonic() + timeout_s
    while not table_exists(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def _q(path: str) -> str:
    return f"delta.`{path}`"


def ensure_table(spark: SparkSession | None, cfg: GemConfig, schema: TableSchema) -> str:
    """Create the table from its schema if absent (with constraints); verify it if present.

    Creation goes through Spark SQL when a session is given, else through `deltalake` (stages that
    start no JVM). The checks read the Delta log with `deltalake`, so a table that exists costs no
    Spark job.
    """
    path = table_path(cfg, schema)
    if not table_exists(path):
        if spark is not None:
            cols = ", ".join(
                f"`{c.name}` {c.sql_type}{'' if c.nullable else ' NOT NULL'}" for c in schema.columns
            )
            parts = f"PARTITIONED BY ({', '.join(schema.partition_by)})" if schema.partition_by else ""
            # The CHECK constraints go in with the table (Delta keeps them as `delta.constraints.<name>`
            # properties): one commit, where an ALTER TABLE ADD CONSTRAINT each costs a Spark job and
            # a commit apiece, much slower for a table with many constraints.
            props = {**table_properties(cfg), **{f"delta.constraints.{n.lower()}": e for n, e in schema.check_constraints()}}
            listed = ", ".join(f"'{k}' = {_sql_string(v)}" for k, v in props.items())
            try:
                spark.sql(f"CREATE TABLE IF NOT EXISTS {_q(spark_location(spark, path))} ({cols}) USING DELTA {parts} "
                          f"TBLPROPERTIES ({listed})")
            except Exception as e:  # another process creating it at the same moment is fine (verified below)
                if not any(code in str(e) for code in _CONCURRENT_CREATE_ERRORS):
                    raise
                if not _appears_as_delta_table(path):
                    raise
        else:
            _create_without_spark(cfg, schema, path)
    table = delta_table(path)
    _verify_schema(table, path, schema)
    existing = _constraints(table)
    missing = {name: expr for name, expr in schema.check_constraints() if name.lower() not in existing}
    if missing and spark is not None:
        for name, expr in missing.items():
            spark.sql(f"ALTER TABLE {_q(spark_location(spark, path))} ADD CONSTRAINT {name} CHECK ({expr})")
    elif missing:
        table.alter.add_constraint(missing)
    return path


def _sql_string(value: str) -> str:
    """A Spark SQL string literal: constraint expressions carry quotes of their own."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _create_without_spark(cfg: GemConfig, schema: TableSchema, path: str) -> None:
    from deltalake import DeltaTable
    from deltalake.exceptions import DeltaError

    try:
        DeltaTable.create(path, schema.arrow_schema(), mode="ignore", partition_by=list(schema.partition_by) or None,
                          configuration=table_properties(cfg), storage_options=storage.delta_storage_options(path))
    except DeltaError:
        if not table_exists(path):  # another writer creating it at the same time is fine
            raise


def _constraints(table: Any) -> set[str]:
    prefix = "delta.constraints."
    return {k[len(prefix) :].lower() for k in table.metadata().configuration if k.startswith(prefix)}


def _logged_columns(table: Any) -> list[tuple[str, str]]:
    """The log's columns as (name, Spark type), parsed from its schema (Spark's JSON format) without a JVM."""
    from pyspark.sql import types as T

    actual = T.StructType.fromJson(json.loads(table.schema().to_json()))
    return [(f.name, f.dataType.simpleString()) for f in actual.fields]


def _verify_schema(table: Any, path: str, schema: TableSchema) -> None:
    """Compare the log's schema with schemas/. A table made before schemas/ added nullable columns
    at its end gets them (one commit; its older rows read them as null), as ALTER TABLE ADD COLUMNS
    would; any other difference raises."""
    import pyarrow as pa
    from deltalake import Schema

    got = _logged_columns(table)
    exp = [(f.name, f.dataType.simpleString()) for f in schema.spark_schema().fields]
    added = list(schema.columns[len(got):]) if exp[: len(got)] == got else []
    if got != exp and added and all(c.nullable for c in added):
        fields = Schema.from_arrow(pa.schema([schema.arrow_schema().field(c.name) for c in added])).fields
        try:
            table.alter.add_columns(fields)
        except Exception as e:  # another process adding them at the same moment is fine
            table.update_incremental()
            if _logged_columns(table) != exp:
                raise TableSchemaMismatch(f"{schema.name} at {path}: could not add the columns "
                                          f"{[c.name for c in added]} schemas/ defines: {e}") from e
        got = _logged_columns(table)
    if got != exp:
        raise TableSchemaMismatch(f"{schema.name} at {path} has columns {got}, schemas/ defines {exp}: the table "
                                  "was written by another version of schemas/; rebuild it from its sources (a new "
                                  "lakehouse_uri, or `make clean-data` for the demo's) or migrate it")


def predicate(where: Mapping[str, Any]) -> str:
    """{"ds": "2026-01-02"} -> "ds = '2026-01-02'"; a (first, last) pair is a closed range:
    {"ds": ("2026-01-01", "2026-01-28")} -> "ds >= '2026-01-01' AND ds <= '2026-01-28'" (Delta's
    replaceWhere check fails to analyze BETWEEN); a list is a set of values:
    {"ds": ["2026-01-07", "2026-01-14"]} -> "ds IN ('2026-01-07', '2026-01-14')"."""
    terms = []
    for col, val in where.items():
        if isinstance(val, list):
            terms.append(f"{col} IN ({', '.join(repr(str(v)) for v in val)})")
        elif isinstance(val, tuple):
            first, last = val
            terms.append(f"{col} >= '{first}' AND {col} <= '{last}'")
        elif isinstance(val, (dt.date, str)):
            terms.append(f"{col} = '{val}'")
        else:
            terms.append(f"{col} = {val!r}")
    return " AND ".join(terms)


def days_value(days: Sequence[str]) -> str | tuple[str, str] | list[str]:
    """How `predicate` matches the days (sorted): one day, a closed range of consecutive days, or a set."""
    if len(days) == 1:
        return days[0]
    return (days[0], days[-1]) if list(days) == day_range(days[0], days[-1]) else list(days)


@dataclass(frozen=True)
class Committed:
    """One Delta commit of a write: the version it created and the rows it wrote (from the
    commit's own metrics, not a reread of the data)."""

    version: int
    rows: int


def replace_partition(
    df: DataFrame,
    cfg: GemConfig,
    schema: TableSchema,
    where: Mapping[str, Any],
    user_metadata: str = "",
) -> Committed:
    """Atomically replace the rows matching `where` with `df`; -> the commit it made.

    Delta fails the commit if a row of `df` falls outside `where`, so a bug cannot spill into a
    neighbouring partition. A rerun with the same input yields the same table contents. The commit
    is the one carrying `user_metadata` (a run id), so another writer committing right after cannot
    be mistaken for this one.
    """
    require_writer(schema, "spark")
    spark = df.sparkSession
    path = ensure_table(spark, cfg, schema)
    location = spark_location(spark, path)
    writer = (
        df.select(*schema.column_names)
        .write.format("delta")
        .mode("overwrite")
        .option("replaceWhere", predicate(where))
    )
    if user_metadata:
        writer = writer.option("userMetadata", user_metadata)
    with single_driver(path, user_metadata or "spark-write"):
        writer.save(location)
        return own_commit(spark, path, user_metadata)


# Delta's log store for S3 (S3SingleDriverLogStore) makes commits safe between the threads of one
# driver only: two drivers committing one version at once both succeed and one commit is lost. On an
# object store each Spark write of a table therefore holds that table's writer lease (one driver at a
# time, other drivers wait); a local file system's log store commits by an atomic rename and needs none.
DRIVER_LEASE_EXPIRY_S = 600.0
DRIVER_LEASE_RENEW_S = 30.0
DRIVER_LEASE_WAIT_S = 3600.0


def driver_lease_path(path: str) -> str:
    """The writer lease of the table at `path`: a file in its folder that Delta ignores (its name
    starts with an underscore, as _delta_log's does, so neither the log nor VACUUM looks at it)."""
    return storage.join(path, "_gem_writer.json")


@contextmanager
def single_driver(path: str, run_id: str, wait_s: float = DRIVER_LEASE_WAIT_S) -> Iterator[None]:
    """Hold the writer lease of the Spark table at `path` for the block when it is on an object
    store (waiting up to wait_s for another driver's write to finish); on a local disk, nothing to hold."""
    if storage.is_local(path):
        yield
        return
    with lease.held(driver_lease_path(path), f"{run_id}:{os.getpid()}", f"a Spark write of {storage.name(path)}",
                    DRIVER_LEASE_EXPIRY_S, DRIVER_LEASE_RENEW_S, wait_s=wait_s):
        yield


def own_commit(spark: SparkSession, path: str, user_metadata: str) -> Committed:
    """The newest commit of `path` carrying `user_metadata`, read through the session's own view of
    the log, which the write has just advanced to at least that commit (a fresh listing of the
    folder by another reader, while another process commits, can miss commits). Without
    such a commit (no `user_metadata`, or Delta skipped the commit of an empty replace of an empty
    partition): the latest version, and 0 rows for a skipped commit."""
    from delta.tables import DeltaTable

    # One read of the recent history (newest first), picked from in Python.
    history = DeltaTable.forPath(spark, spark_location(spark, path)).history(50)
    commits = history.select("version", "userMetadata", "operationMetrics").collect()
    mine = [c for c in commits if not user_metadata or c["userMetadata"] == user_metadata]
    if not mine:
        return Committed(max(int(c["version"]) for c in commits), 0)
    newest = max(mine, key=lambda c: int(c["version"]))
    return Committed(int(newest["version"]), int((newest["operationMetrics"] or {}).get("numOutputRows", 0)))


def latest_version(path: str) -> int:
    return int(delta_table(path).version())


def read_table(spark: SparkSession, cfg: GemConfig, schema: TableSchema, version: int | None = None) -> DataFrame:
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return reader.load(spark_location(spark, table_path(cfg, schema)))


def string_literal(value: str, schema: TableSchema) -> str:
    """A SQL string literal in the dialect of the table's writer: Spark SQL escapes with a backslash
    (there two quoted strings side by side are one string), deltalake's DataFusion doubles the quote."""
    return _sql_string(value) if schema.writer == "spark" else "'" + value.replace("'", "''") + "'"


@contextmanager
def spark_commit_metadata(spark: SparkSession, user_metadata: str | None) -> Iterator[None]:
    """The userMetadata of the session's Delta commits inside the block (SQL commands take no option
    for it); the session's earlier setting is put back after."""
    if user_metadata is None:
        yield
        return
    before = spark.conf.get(USER_METADATA_CONF, None)
    spark.conf.set(USER_METADATA_CONF, user_metadata)
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(USER_METADATA_CONF)
        else:
            spark.conf.set(USER_METADATA_CONF, before)


def delete_rows(session: Callable[[], SparkSession], schema: TableSchema, path: str, where: str,
                user_metadata: str | None = None) -> int:
    """A Delta DELETE of the rows matching the SQL condition `where` (its literals from
    `string_literal`) through the table's writer engine (`session` gives the Spark session, opened
    only for a Spark-written table); -> rows deleted. A DELETE that matches nothing commits nothing."""
    if schema.writer == "spark":
        spark = session()
        with single_driver(path, user_metadata or "spark-delete"), spark_commit_metadata(spark, user_metadata):
            result = spark.sql(f"DELETE FROM {_q(spark_location(spark, path))} WHERE {where}").first()
        return int(result["num_affected_rows"]) if result is not None else 0
    require_writer(schema, "deltalake")
    properties = commit_properties(user_metadata) if user_metadata is not None else None
    metrics = delta_table(path).delete(where, commit_properties=properties)
    return int(metrics.get("num_deleted_rows", 0))


def commit_properties(user_metadata: str) -> Any:
    from deltalake import CommitProperties

    return CommitProperties(custom_metadata={"userMetadata": user_metadata})

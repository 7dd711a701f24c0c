"""Thin Delta I/O every stage shares: table creation from schemas/, partition replaces, completions.

Rules (DESIGN.md): writes replace exactly one partition atomically (`replaceWhere`), a stage
publishes its completion record last, and readers read a ds only once that record exists.

Tables are path-based (`{lakehouse}/{layer}/{table}`), created with deletion vectors and column
mapping off (so the `deltalake` package reads them through the log) and with log and removed-file
retention longer than the attribution window plus the training horizon.
"""

from __future__ import annotations

import datetime as dt
import uuid
from typing import TYPE_CHECKING, Any, Mapping

from gem.config import GemConfig
from schemas.ops import COMPLETIONS
from schemas.table import TableSchema

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


class MissingInputError(RuntimeError):
    """An input partition a stage needs has not been completed by its producer."""


class TableSchemaMismatch(RuntimeError):
    """An existing Delta table does not match its definition in schemas/."""


def table_path(cfg: GemConfig, schema: TableSchema) -> str:
    return schema.path(cfg.lakehouse_uri)


def table_properties(cfg: GemConfig) -> dict[str, str]:
    days = cfg.retention_days
    return {
        "delta.enableDeletionVectors": "false",
        "delta.columnMapping.mode": "none",
        "delta.logRetentionDuration": f"interval {days} days",
        "delta.deletedFileRetentionDuration": f"interval {days} days",
    }


def _q(path: str) -> str:
    return f"delta.`{path}`"


def ensure_table(spark: "SparkSession", cfg: GemConfig, schema: TableSchema) -> str:
    """Create the table from its schema if absent (with constraints); verify it if present."""
    from delta.tables import DeltaTable

    path = table_path(cfg, schema)
    if not DeltaTable.isDeltaTable(spark, path):
        cols = ", ".join(
            f"`{c.name}` {c.sql_type}{'' if c.nullable else ' NOT NULL'}" for c in schema.columns
        )
        parts = f"PARTITIONED BY ({', '.join(schema.partition_by)})" if schema.partition_by else ""
        props = ", ".join(f"'{k}' = '{v}'" for k, v in table_properties(cfg).items())
        spark.sql(f"CREATE TABLE IF NOT EXISTS {_q(path)} ({cols}) USING DELTA {parts} TBLPROPERTIES ({props})")
    _verify_schema(spark, path, schema)
    existing = _constraints(spark, path)
    for name, expr in schema.check_constraints():
        if name.lower() not in existing:
            spark.sql(f"ALTER TABLE {_q(path)} ADD CONSTRAINT {name} CHECK ({expr})")
    return path


def _constraints(spark: "SparkSession", path: str) -> set[str]:
    props = spark.sql(f"SHOW TBLPROPERTIES {_q(path)}").collect()
    prefix = "delta.constraints."
    return {r.key[len(prefix) :].lower() for r in props if r.key.startswith(prefix)}


def _verify_schema(spark: "SparkSession", path: str, schema: TableSchema) -> None:
    actual = spark.read.format("delta").load(path).schema
    want = schema.spark_schema()
    got = [(f.name, f.dataType.simpleString()) for f in actual.fields]
    exp = [(f.name, f.dataType.simpleString()) for f in want.fields]
    if got != exp:
        raise TableSchemaMismatch(f"{schema.name} at {path} has columns {got}, schemas/ defines {exp}")


def _predicate(where: Mapping[str, Any]) -> str:
    """{"ds": "2026-01-02"} -> "ds = '2026-01-02'"; a (first, last) pair is a closed range:
    {"ds": ("2026-01-01", "2026-01-28")} -> "ds >= '2026-01-01' AND ds <= '2026-01-28'" (Delta's
    replaceWhere check fails to analyze BETWEEN)."""
    terms = []
    for col, val in where.items():
        if isinstance(val, tuple):
            first, last = val
            terms.append(f"{col} >= '{first}' AND {col} <= '{last}'")
        elif isinstance(val, (dt.date, str)):
            terms.append(f"{col} = '{val}'")
        else:
            terms.append(f"{col} = {val!r}")
    return " AND ".join(terms)


def replace_partition(
    df: "DataFrame",
    cfg: GemConfig,
    schema: TableSchema,
    where: Mapping[str, Any],
    user_metadata: str = "",
) -> int:
    """Atomically replace the rows matching `where` with `df`; returns the committed Delta version.

    Delta fails the commit if a row of `df` falls outside `where`, so a bug cannot spill into a
    neighbouring partition. A rerun with the same input yields the same table contents.
    """
    spark = df.sparkSession
    path = ensure_table(spark, cfg, schema)
    writer = (
        df.select(*schema.column_names)
        .write.format("delta")
        .mode("overwrite")
        .option("replaceWhere", _predicate(where))
    )
    if user_metadata:
        writer = writer.option("userMetadata", user_metadata)
    writer.save(path)
    return latest_version(spark, path)


def latest_version(spark: "SparkSession", path: str) -> int:
    from delta.tables import DeltaTable

    return int(DeltaTable.forPath(spark, path).history(1).collect()[0]["version"])


def rows_committed(spark: "SparkSession", cfg: GemConfig, schema: TableSchema, version: int) -> int:
    """Rows the commit `version` of the table wrote (Delta's numOutputRows), without rereading them."""
    from delta.tables import DeltaTable

    history = DeltaTable.forPath(spark, table_path(cfg, schema)).history()
    row = history.where(f"version = {int(version)}").collect()[0]
    return int((row["operationMetrics"] or {}).get("numOutputRows", 0))


def read_table(spark: "SparkSession", cfg: GemConfig, schema: TableSchema, version: int | None = None) -> "DataFrame":
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return reader.load(table_path(cfg, schema))


# --------------------------------------------------------------------------------------------------
# Completion records: written last by a stage; the only signal downstream readers trust.


def new_run_id(stage: str, ds: str) -> str:
    return f"{stage}:{ds}:{uuid.uuid4().hex[:12]}"


def clear_completion(spark: "SparkSession", cfg: GemConfig, stage: str, ds: str) -> None:
    """Withdraw a (stage, ds) record before rewriting its outputs, so a crash mid-rerun leaves none."""
    from delta.tables import DeltaTable

    if completion(spark, cfg, stage, ds) is None:  # a read is far cheaper than a no-op DELETE commit
        return
    path = table_path(cfg, COMPLETIONS)
    DeltaTable.forPath(spark, path).delete(f"stage = '{stage}' AND ds = DATE'{ds}'")


def publish_completion(
    spark: "SparkSession",
    cfg: GemConfig,
    stage: str,
    ds: str,
    run_id: str,
    rows_in: int,
    rows_written: int,
    quarantined_by_reason: Mapping[str, int],
    table_versions: Mapping[str, int],
) -> None:
    rows_quarantined = int(sum(quarantined_by_reason.values()))
    if rows_in != rows_written + rows_quarantined:
        raise RuntimeError(
            f"{stage} ds={ds}: counts do not reconcile: in={rows_in} != written={rows_written} "
            f"+ quarantined={rows_quarantined} ({dict(quarantined_by_reason)})"
        )
    row = {
        "stage": stage,
        "ds": dt.date.fromisoformat(ds),
        "run_id": run_id,
        "rows_in": int(rows_in),
        "rows_written": int(rows_written),
        "rows_quarantined": rows_quarantined,
        "quarantined_by_reason": {k: int(v) for k, v in sorted(quarantined_by_reason.items())},
        "table_versions": {k: int(v) for k, v in sorted(table_versions.items())},
        "completed_at": dt.datetime.now(dt.timezone.utc).replace(tzinfo=None),
    }
    df = spark.createDataFrame([row], schema=COMPLETIONS.spark_schema())
    replace_partition(df, cfg, COMPLETIONS, {"stage": stage, "ds": ds}, user_metadata=run_id)


def completion(spark: "SparkSession", cfg: GemConfig, stage: str, ds: str) -> dict[str, Any] | None:
    from delta.tables import DeltaTable

    path = table_path(cfg, COMPLETIONS)
    if not DeltaTable.isDeltaTable(spark, path):
        return None
    rows = (
        spark.read.format("delta").load(path).where(f"stage = '{stage}' AND ds = DATE'{ds}'").collect()
    )
    return rows[0].asDict(recursive=True) if rows else None


def require_completed(spark: "SparkSession", cfg: GemConfig, stage: str, ds: str) -> dict[str, Any]:
    record = completion(spark, cfg, stage, ds)
    if record is None:
        raise MissingInputError(
            f"input not ready: stage {stage!r} has no completion record for ds={ds} in "
            f"{table_path(cfg, COMPLETIONS)}; run `python -m jobs.{stage} --ds {ds}` first"
        )
    return record

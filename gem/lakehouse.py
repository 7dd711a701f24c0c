"""Thin Delta I/O every stage shares: table creation from schemas/, partition replaces, completions.

Rules (README, "Rules every stage follows"): writes replace exactly one partition atomically (`replaceWhere`), a stage
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


class StaleInputError(MissingInputError):
    """An input partition changed after the record a reader relies on (e.g. rewritten after its
    validation); the message names the stage to rerun."""


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


def ensure_table(spark: "SparkSession | None", cfg: GemConfig, schema: TableSchema) -> str:
    """Create the table from its schema if absent (with constraints); verify it if present.

    Creation goes through Spark SQL when a session is given, else through `deltalake` (stages that
    start no JVM). The checks read the Delta log with `deltalake`, so a table that exists costs no
    Spark job.
    """
    from deltalake import DeltaTable

    path = table_path(cfg, schema)
    if not DeltaTable.is_deltatable(path):
        if spark is not None:
            cols = ", ".join(
                f"`{c.name}` {c.sql_type}{'' if c.nullable else ' NOT NULL'}" for c in schema.columns
            )
            parts = f"PARTITIONED BY ({', '.join(schema.partition_by)})" if schema.partition_by else ""
            # The CHECK constraints go in with the table (Delta keeps them as `delta.constraints.<name>`
            # properties): one commit, where an ALTER TABLE ADD CONSTRAINT each costs a Spark job and
            # a commit apiece (silver.training_examples: 6.0 s -> 0.8 s on 2 cores).
            props = {**table_properties(cfg), **{f"delta.constraints.{n.lower()}": e for n, e in schema.check_constraints()}}
            listed = ", ".join(f"'{k}' = {_sql_string(v)}" for k, v in props.items())
            spark.sql(f"CREATE TABLE IF NOT EXISTS {_q(path)} ({cols}) USING DELTA {parts} TBLPROPERTIES ({listed})")
        else:
            _create_without_spark(cfg, schema, path)
    table = DeltaTable(path)
    _verify_schema(table, path, schema)
    existing = _constraints(table)
    missing = {name: expr for name, expr in schema.check_constraints() if name.lower() not in existing}
    if missing and spark is not None:
        for name, expr in missing.items():
            spark.sql(f"ALTER TABLE {_q(path)} ADD CONSTRAINT {name} CHECK ({expr})")
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
                          configuration=table_properties(cfg))
    except DeltaError:
        if not DeltaTable.is_deltatable(path):  # another writer creating it at the same time is fine
            raise


def _constraints(table: Any) -> set[str]:
    prefix = "delta.constraints."
    return {k[len(prefix) :].lower() for k in table.metadata().configuration if k.startswith(prefix)}


def _verify_schema(table: Any, path: str, schema: TableSchema) -> None:
    """Compare the log's schema (Spark's JSON format, parsed without a JVM) with schemas/."""
    import json

    from pyspark.sql import types as T

    actual = T.StructType.fromJson(json.loads(table.schema().to_json()))
    got = [(f.name, f.dataType.simpleString()) for f in actual.fields]
    exp = [(f.name, f.dataType.simpleString()) for f in schema.spark_schema().fields]
    if got != exp:
        raise TableSchemaMismatch(f"{schema.name} at {path} has columns {got}, schemas/ defines {exp}")


def predicate(where: Mapping[str, Any]) -> str:
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
    neighbouring partition. A rerun with the same input yields the same table contents. The version
    is that of the commit carrying `user_metadata` (a run id), so another writer committing right
    after cannot be mistaken for this one.
    """
    spark = df.sparkSession
    path = ensure_table(spark, cfg, schema)
    writer = (
        df.select(*schema.column_names)
        .write.format("delta")
        .mode("overwrite")
        .option("replaceWhere", predicate(where))
    )
    if user_metadata:
        writer = writer.option("userMetadata", user_metadata)
    writer.save(path)
    return committed_version(path, user_metadata)


def _history(path: str, limit: int | None = None) -> list[dict[str, Any]]:
    from deltalake import DeltaTable

    return DeltaTable(path).history(limit)


def committed_version(path: str, user_metadata: str = "") -> int:
    """The version of the newest commit of `path` whose userMetadata is `user_metadata`, read from
    the log without Spark. The latest version when `user_metadata` is empty, or when the write
    committed nothing (Delta skips the commit of an empty replace of an empty partition)."""
    from deltalake import DeltaTable

    if user_metadata:
        for commit in _history(path, 50):
            if commit.get("userMetadata") == user_metadata:
                return int(commit["version"])
    return int(DeltaTable(path).version())


def latest_version(path: str) -> int:
    from deltalake import DeltaTable

    return int(DeltaTable(path).version())


def rows_committed(cfg: GemConfig, schema: TableSchema, version: int, user_metadata: str = "") -> int:
    """Rows the commit `version` of the table wrote, from the commit's own metrics without rereading
    them (Spark's numOutputRows, delta-rs' num_added_rows). With `user_metadata`, the commit must
    carry it; a version without it is a replace that committed nothing (an empty replace of an empty
    partition), which wrote 0 rows."""
    for commit in _history(table_path(cfg, schema)):
        if int(commit["version"]) == int(version):
            if user_metadata and commit.get("userMetadata") != user_metadata:
                return 0
            metrics = commit.get("operationMetrics") or {}
            return int(metrics.get("numOutputRows", metrics.get("num_added_rows", 0)))
    raise RuntimeError(f"{schema.name}: no commit {version} in the log of {table_path(cfg, schema)}")


def read_table(spark: "SparkSession", cfg: GemConfig, schema: TableSchema, version: int | None = None) -> "DataFrame":
    reader = spark.read.format("delta")
    if version is not None:
        reader = reader.option("versionAsOf", version)
    return reader.load(table_path(cfg, schema))


# --------------------------------------------------------------------------------------------------
# Completion records: written last by a stage; the only signal downstream readers trust.


def new_run_id(stage: str, ds: str) -> str:
    return f"{stage}:{ds}:{uuid.uuid4().hex[:12]}"


# The records live in a small Delta table read and written with `deltalake`: a check or a publish
# costs milliseconds and no Spark job, and stages without a JVM (training) publish the same way.


def _completion_where(stage: str, ds: str) -> str:
    return f"stage = '{stage}' AND ds = '{ds}'"


def clear_completion(cfg: GemConfig, stage: str, ds: str) -> None:
    """Withdraw a (stage, ds) record before rewriting its outputs, so a crash mid-rerun leaves none."""
    from deltalake import DeltaTable

    if completion(cfg, stage, ds) is None:  # a read is far cheaper than a no-op DELETE commit
        return
    DeltaTable(table_path(cfg, COMPLETIONS)).delete(_completion_where(stage, ds))


def publish_completion(
    cfg: GemConfig,
    stage: str,
    ds: str,
    run_id: str,
    rows_in: int | None,
    rows_written: int,
    quarantined_by_reason: Mapping[str, int],
    table_versions: Mapping[str, int],
    input_versions: Mapping[str, int] | None = None,
    reconciliation: str = "checked",
) -> dict[str, Any]:
    """Write the (stage, ds) record in one commit (replacing any earlier one); -> the record.
    Stages publish through gem.commit.StageCommit, which fills in the versions and the
    reconciliation; rows_in None means the stage has no separate input count (`reconciliation` says why)."""
    import pyarrow as pa
    from deltalake import write_deltalake

    rows_quarantined = int(sum(quarantined_by_reason.values()))
    if rows_in is not None and rows_in != rows_written + rows_quarantined:
        raise RuntimeError(
            f"{stage} ds={ds}: counts do not reconcile: in={rows_in} != written={rows_written} "
            f"+ quarantined={rows_quarantined} ({dict(quarantined_by_reason)})"
        )
    row = {
        "stage": stage,
        "ds": dt.date.fromisoformat(ds),
        "run_id": run_id,
        "rows_in": None if rows_in is None else int(rows_in),
        "rows_written": int(rows_written),
        "rows_quarantined": rows_quarantined,
        "quarantined_by_reason": sorted((k, int(v)) for k, v in quarantined_by_reason.items()),
        "table_versions": sorted((k, int(v)) for k, v in table_versions.items()),
        "input_versions": sorted((k, int(v)) for k, v in (input_versions or {}).items()),
        "reconciliation": reconciliation,
        "completed_at": dt.datetime.now(dt.timezone.utc),
    }
    path = ensure_table(None, cfg, COMPLETIONS)
    table = pa.Table.from_pylist([row], schema=COMPLETIONS.arrow_schema())
    write_deltalake(path, table, mode="overwrite", predicate=_completion_where(stage, ds),
                    partition_by=list(COMPLETIONS.partition_by), commit_properties=commit_properties(run_id))
    return row | {"ds": ds, "quarantined_by_reason": dict(row["quarantined_by_reason"]),
                  "table_versions": dict(row["table_versions"]), "input_versions": dict(row["input_versions"])}


def commit_properties(user_metadata: str) -> Any:
    from deltalake import CommitProperties

    return CommitProperties(custom_metadata={"userMetadata": user_metadata})


def completion(cfg: GemConfig, stage: str, ds: str) -> dict[str, Any] | None:
    from deltalake import DeltaTable

    from gem.data.delta_log import read_table as read_logged_table

    path = table_path(cfg, COMPLETIONS)
    if not DeltaTable.is_deltatable(path):
        return None
    rows = read_logged_table(path, where={"stage": stage, "ds": ds}).to_pylist()
    if not rows:
        return None
    record = rows[-1]
    for key in ("quarantined_by_reason", "table_versions", "input_versions"):  # Arrow maps come back as (key, value) pairs
        record[key] = dict(record[key] or [])
    return record


def require_stage_inputs(cfg: GemConfig, stage: str, ds: str) -> dict[tuple[str, str], dict[str, Any]]:
    """The completion records the registry says `stage` needs for ds, by (stage, day); raises
    MissingInputError naming every missing one and the command to run first."""
    from gem import stages

    found: dict[tuple[str, str], Any] = {}

    def completed(needed_stage: str, day: str) -> dict[str, Any] | None:
        found[(needed_stage, day)] = completion(cfg, needed_stage, day)
        return found[(needed_stage, day)]

    missing = stages.missing_inputs(stage, cfg, ds, completed)
    if missing:
        raise MissingInputError(stages.describe_missing(stage, ds, missing))
    return found


def require_completed(cfg: GemConfig, stage: str, ds: str) -> dict[str, Any]:
    record = completion(cfg, stage, ds)
    if record is None:
        raise MissingInputError(
            f"input not ready: stage {stage!r} has no completion record for ds={ds} in "
            f"{table_path(cfg, COMPLETIONS)}; run `python -m jobs.{stage} --ds {ds}` first"
        )
    return record

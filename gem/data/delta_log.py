"""Delta tables read through their log with the `deltalake` package: no Spark, no folder listing.

Files come from the log's add actions at an explicit version, so a reader sees exactly the rows
of that version even after later commits. Every reader outside Spark goes through `read_table` /
`read_logged`, which put back the partition columns (`ds`, `surface`) that Delta keeps in the log
rather than in the data files. (Materialising a table with deltalake's
`to_pyarrow_table` made the interpreter abort at exit about half the time; listing the log and
reading the files with pyarrow.parquet does not.)
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.parquet as pq
from pyarrow import fs as pafs


class UnavailableVersionError(RuntimeError):
    """A pinned table version whose log entries are gone (cleaned up or vacuumed) or a table that is not there."""


class MissingDataFileError(FileNotFoundError):
    """A file the log (or a manifest) lists is not in storage (e.g. removed by VACUUM)."""


@dataclass(frozen=True)
class LoggedFile:
    """One data file of a Delta table at some version."""

    path: str  # absolute
    partition: dict[str, str]  # partition column -> value as text ("2026-01-03", "reels")
    rows: int  # num_records from the log's statistics
    bytes: int


def _delta_table(table_path: str, version: int | None = None) -> Any:
    """deltalake's DeltaTable at `version` (the latest when None), imported on use: the GPU device
    image has no deltalake, and the loader the GPU benches import reads through this module."""
    from deltalake import DeltaTable  # noqa: PLC0415 - see the docstring

    return DeltaTable(table_path) if version is None else DeltaTable(table_path, version=version)


def _text(value: object) -> str:
    return value.isoformat() if isinstance(value, dt.date) else str(value)


def table_version(table_path: str) -> int:
    """The table's latest version."""
    try:
        return int(_delta_table(table_path).version())
    except Exception as e:  # deltalake raises TableNotFoundError and friends
        raise UnavailableVersionError(f"no Delta table at {table_path}: {e}") from e


def logged_files(table_path: str, version: int) -> list[LoggedFile]:
    """Every data file of the table at `version`, with its partition values and row count."""
    try:
        table = _delta_table(table_path, version)
    except Exception as e:
        raise UnavailableVersionError(
            f"version {version} of the Delta table {table_path} cannot be loaded ({e}); its log entries may have "
            "been removed by log retention or VACUUM. Re-create the manifest (python -m jobs.mix) at a live version."
        ) from e
    actions = pa.table(table.get_add_actions(flatten=True))
    part_cols = [c for c in actions.column_names if c.startswith("partition.")]
    parts = {c[len("partition."):]: [_text(v) for v in actions[c].to_pylist()] for c in part_cols}
    out = []
    for i, (p, n, b) in enumerate(zip(actions["path"].to_pylist(), actions["num_records"].to_pylist(),
                                      actions["size_bytes"].to_pylist(), strict=True)):
        out.append(LoggedFile(f"{table_path.rstrip('/')}/{p}", {k: v[i] for k, v in parts.items()}, int(n or 0), int(b)))
    return out


def require_file(path: str, context: str) -> None:
    """Fail with a clear message if a local data file is gone (remote URIs are checked on read)."""
    parts = urlsplit(path)
    if parts.scheme in ("", "file") and not os.path.exists(parts.path if parts.scheme else path):
        raise MissingDataFileError(
            f"{context}: data file {path} does not exist (vacuumed, or the table was rewritten); "
            "re-create the manifest (python -m jobs.mix) so it lists live files"
        )


def partition_types(table_path: str, version: int | None = None) -> dict[str, Any]:
    """Partition column -> its Arrow type, from the table's own schema in the log (ds: date32)."""
    table = _delta_table(table_path, version)
    schema = pa.schema(table.schema().to_arrow())
    return {name: schema.field(name).type for name in table.metadata().partition_columns}


def read_logged(files: Sequence[LoggedFile], types: dict[str, Any], columns: Sequence[str] | None = None,
                schema: Any = None) -> Any:
    """The rows of `files` as one Arrow table, partition columns restored from the log's values.

    Delta data files do not store partition columns (they live in the log's add actions), so
    pyarrow alone would drop `ds`, `surface`, ...; this appends each as a constant column of the
    file, cast to its type in `types` (see `partition_types`). `columns` picks and orders the
    output (data and partition columns alike); None keeps every column, partitions last.
    `schema` (the table's Arrow schema from the log) casts every file to one set of types: files
    of one table written by different engines differ (Spark: INT96 nanoseconds, nullable;
    delta-rs: microseconds UTC, not null), and Arrow concatenates only equal schemas.
    """
    wanted = list(columns) if columns is not None else None
    data_columns = [c for c in wanted if c not in types] if wanted is not None else None
    tables = []
    for f in files:
        require_file(f.path, "read_logged")
        table = pq.read_table(f.path, columns=data_columns)
        for name, arrow_type in types.items():
            if wanted is None or name in wanted:
                value = pa.scalar(f.partition.get(name), pa.string()).cast(arrow_type)
                table = table.append_column(name, pa.repeat(value, table.num_rows))
        table = table.select(wanted) if wanted is not None else table
        if schema is not None:
            table = table.cast(pa.schema([schema.field(n).with_nullable(True) for n in table.column_names]))
        tables.append(table)
    if not tables:
        raise ValueError("read_logged needs at least one file (an empty selection has no schema to return)")
    return pa.concat_tables(tables)


def read_table(table_path: str, version: int | None = None, columns: Sequence[str] | None = None,
               where: Mapping[str, str | Collection[str]] | None = None) -> Any:
    """A Delta table (at `version`, default the latest) as an Arrow table with its partition columns.

    `where` keeps the files whose partition values match ({"ds": "2026-01-02"} or
    {"surface": {"ig_feed", "reels"}}), so unmatched files are never opened. Returns an empty table
    with the right columns when nothing matches.
    """
    version = table_version(table_path) if version is None else version
    types = partition_types(table_path, version)

    files = [f for f in logged_files(table_path, version) if _matches(f, where or {})]
    schema = pa.schema(_delta_table(table_path, version).schema().to_arrow())
    if files:
        return read_logged(files, types, columns, schema)
    data_fields = [schema.field(n) for n in schema.names if n not in types]
    full = pa.schema(data_fields + [schema.field(n) for n in types])
    names = list(columns) if columns is not None else full.names
    return pa.schema([full.field(n) for n in names]).empty_table()


def _matches(f: LoggedFile, where: Mapping[str, str | Collection[str]]) -> bool:
    for name, wanted in where.items():
        value = f.partition.get(name)
        if (value != wanted) if isinstance(wanted, str) else (value not in wanted):
            return False
    return True


def data_changes_by_version(table_path: str, after: int, through: int, column: str = "ds",
                            exempt: Collection[str] = ()) -> dict[int, set[str]] | None:
    """For each version in (after, through], the values of the partition `column` whose rows that
    commit changed: a file added or removed with `dataChange` true. A compaction (OPTIMIZE) rewrites
    files with dataChange false (the same rows), so the days it compacted are not in its set; a
    commit whose `userMetadata` is in `exempt` (e.g. an erasure's) has an empty set. None when a
    commit's log entry is gone (log retention) or names no partition: then nothing can be ruled out.

    Read from the commits' JSON entries (the protocol's add / remove actions), through pyarrow's
    filesystem for the table's URI, since deltalake exposes a version's files, not a commit's actions.
    """
    filesystem, base = pafs.FileSystem.from_uri(table_path if "://" in table_path else os.path.abspath(table_path))
    changes: dict[int, set[str]] = {}
    for version in range(after + 1, through + 1):
        try:
            with filesystem.open_input_stream(f"{base.rstrip('/')}/_delta_log/{version:020d}.json") as f:
                lines = f.read().decode().splitlines()
        except (FileNotFoundError, OSError):
            return None
        actions = [json.loads(line) for line in lines if line]
        changed = changes[version] = set()
        if any(a.get("commitInfo", {}).get("userMetadata") in exempt for a in actions):
            continue
        for action in actions:
            file = action.get("add") or action.get("remove")
            if file is None or not file.get("dataChange", True):
                continue
            value = (file.get("partitionValues") or {}).get(column)
            if value is None:
                return None
            changed.add(value)
    return changes

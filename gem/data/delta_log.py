"""Delta tables read through their log with the `deltalake` package: no Spark, no folder listing.

Files come from the log's add actions at an explicit version, so a reader sees exactly the rows
of that version even after later commits. Every reader outside Spark goes through `read_table` /
`read_logged`, which put back the partition columns (`ds`, `surface`) that Delta keeps in the log
rather than in the data files. (Materialising a table with deltalake's
`to_pyarrow_table` made the interpreter abort at exit about half the time; listing the log and
reading the files with pyarrow.parquet does not.)

A table is a local folder or an object store URI (s3:// or Spark's s3a://, the same table): the log
is read by deltalake with gem.storage's options, and the data files and commit entries of a table
on an object store through gem.storage (fsspec); local files are opened directly.
"""

from __future__ import annotations

import datetime as dt
import json
import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from gem import storage


class UnavailableVersionError(RuntimeError):
    """A pinned table version whose log entries are gone (cleaned up or vacuumed) or a table that is not there."""


class MissingDataFileError(FileNotFoundError):
    """A file the log (or a manifest) lists is not in storage (e.g. removed by VACUUM)."""


@dataclass(frozen=True)
class LoggedFile:
    """One data file of a Delta table at some version."""

    path: str  # absolute, in storage's one spelling (storage.normalized)
    partition: dict[str, str]  # partition column -> value as text ("2026-01-03", "reels")
    rows: int  # num_records from the log's statistics
    bytes: int


def delta_table(table_path: str, version: int | None = None) -> Any:
    """deltalake's DeltaTable at `version` (the latest when None), with the table's storage options
    (storage.delta_storage_options): every deltalake table object is opened here. deltalake is
    imported on use: the GPU device image has no deltalake, and the loader the GPU benches import
    reads through this module."""
    from deltalake import DeltaTable  # noqa: PLC0415 - see the docstring

    uri = storage.normalized(table_path)
    return DeltaTable(uri, version=version, storage_options=storage.delta_storage_options(uri))


def _text(value: object) -> str:
    return value.isoformat() if isinstance(value, dt.date) else str(value)


def table_version(table_path: str) -> int:
    """The table's latest version."""
    try:
        return int(delta_table(table_path).version())
    except Exception as e:  # deltalake raises TableNotFoundError and friends
        raise UnavailableVersionError(f"no Delta table at {table_path}: {e}") from e


def logged_files(table_path: str, version: int) -> list[LoggedFile]:
    """Every data file of the table at `version`, with its partition values and row count."""
    try:
        table = delta_table(table_path, version)
    except Exception as e:
        raise UnavailableVersionError(
            f"version {version} of the Delta table {table_path} cannot be loaded ({e}); its log entries may have "
            "been removed by log retention or VACUUM. Re-create the manifest (python -m jobs.mix) at a live version."
        ) from e
    actions = pa.table(table.get_add_actions(flatten=True))
    part_cols = [c for c in actions.column_names if c.startswith("partition.")]
    parts = {c[len("partition."):]: [_text(v) for v in actions[c].to_pylist()] for c in part_cols}
    base = storage.normalized(table_path)
    out = []
    for i, (p, n, b) in enumerate(zip(actions["path"].to_pylist(), actions["num_records"].to_pylist(),
                                      actions["size_bytes"].to_pylist(), strict=True)):
        out.append(LoggedFile(f"{base}/{p}", {k: v[i] for k, v in parts.items()}, int(n or 0), int(b)))
    return out


def _missing(path: str, context: str) -> MissingDataFileError:
    return MissingDataFileError(
        f"{context}: data file {path} does not exist (vacuumed, or the table was rewritten); "
        "re-create the manifest (python -m jobs.mix) so it lists live files"
    )


def require_file(path: str, context: str) -> None:
    """Fail with a clear message if a data file is gone (a local file is looked at directly, one
    on an object store asked for through gem.storage)."""
    gone = not os.path.exists(storage.local_path(path)) if storage.is_local(path) else not storage.exists(path)
    if gone:
        raise _missing(path, context)


def _read_parquet(path: str, columns: Sequence[str] | None,
                  fields: Mapping[str, Collection[str]] | None = None) -> pa.Table:
    """One data file's columns (those of `columns` it has: a column added to the table after the
    file was written is not in it): a local file read directly (after require_file), one on an
    object store through gem.storage, a missing one reported as MissingDataFileError when the read
    finds it gone (no separate existence check per file)."""
    if storage.is_local(path):
        require_file(path, "read_logged")
        return _read_present(path, columns, fields)
    try:
        with storage.open_read(path) as f:
            return _read_present(f, columns, fields)
    except FileNotFoundError as e:
        raise _missing(path, "read_logged") from e


def _read_present(source: Any, columns: Sequence[str] | None,
                  fields: Mapping[str, Collection[str]] | None = None) -> pa.Table:
    """pq.read_table of the `columns` the file has (its schema read only when one is missing); a
    column in `fields` (a list of structs, a struct) with only those fields of its struct."""
    if fields and columns is not None:
        file = pq.ParquetFile(source)
        leaves = [file.schema.column(i).path for i in range(len(file.schema))]  # "impressions.list.element.ad_id"
        top = {leaf.split(".", 1)[0] for leaf in leaves}
        paths = [p for c in columns if c in top
                 for p in ([leaf for leaf in leaves if leaf.startswith(f"{c}.") and leaf.rsplit(".", 1)[1] in fields[c]]
                           if c in fields else [c])]
        return file.read(columns=paths)
    try:
        return pq.read_table(source, columns=columns)
    except pa.ArrowInvalid:
        if columns is None:
            raise
        present = set(pq.ParquetFile(source).schema_arrow.names)
        return pq.read_table(source, columns=[c for c in columns if c in present])


def partition_types(table_path: str, version: int | None = None) -> dict[str, Any]:
    """Partition column -> its Arrow type, from the table's own schema in the log (ds: date32)."""
    table = delta_table(table_path, version)
    schema = pa.schema(table.schema().to_arrow())
    return {name: schema.field(name).type for name in table.metadata().partition_columns}


def read_logged(files: Sequence[LoggedFile], types: dict[str, Any], columns: Sequence[str] | None = None,
                schema: Any = None, fields: Mapping[str, Collection[str]] | None = None) -> Any:
    """The rows of `files` as one Arrow table, partition columns restored from the log's values.

    Delta data files do not store partition columns (they live in the log's add actions), so
    pyarrow alone would drop `ds`, `surface`, ...; this appends each as a constant column of the
    file, cast to its type in `types` (see `partition_types`). `columns` picks and orders the
    output (data and partition columns alike); None keeps every column, partitions last.
    `schema` (the table's Arrow schema from the log) casts every file to one set of types: files
    of one table written by different engines differ (Spark: INT96 nanoseconds, nullable;
    delta-rs: microseconds UTC, not null), and Arrow concatenates only equal schemas. It also fills
    with nulls the columns a file lacks because they were added to the table after it was written.
    `fields`: column -> the fields of its struct (a list of structs' elements) to read; the other
    fields' pages are never decoded (the loader reads a sequence's hashed ids, not its strings).
    """
    wanted = list(columns) if columns is not None else None
    data_columns = [c for c in wanted if c not in types] if wanted is not None else None
    if schema is not None and data_columns is None:
        data_columns = [n for n in schema.names if n not in types]
    tables = []
    for f in files:
        table = _read_parquet(f.path, data_columns, fields)
        if schema is not None:
            for name in data_columns or []:
                if name not in table.column_names:  # added after this file was written
                    table = table.append_column(name, pa.nulls(table.num_rows, schema.field(name).type))
            table = table.select(data_columns)
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
    schema = pa.schema(delta_table(table_path, version).schema().to_arrow())
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

    Read from the commits' JSON entries (the protocol's add / remove actions), since deltalake
    exposes a version's files, not a commit's actions: a local table's directly, one on an object
    store's through gem.storage.
    """
    log = storage.join(table_path, "_delta_log")
    changes: dict[int, set[str]] = {}
    for version in range(after + 1, through + 1):
        entry = storage.join(log, f"{version:020d}.json")
        try:
            if storage.is_local(entry):
                with open(entry, "rb") as f:
                    lines = f.read().decode().splitlines()
            else:
                lines = storage.read_text(entry).splitlines()
        except OSError:  # FileNotFoundError included: the entry is gone
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

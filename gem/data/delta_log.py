"""Delta tables read through their log with the `deltalake` package: no Spark, no folder listing.

Files come from the log's add actions at an explicit version, so a reader sees exactly the rows
of that version even after later commits. (Materialising a table with deltalake's
`to_pyarrow_table` made the interpreter abort at exit about half the time; listing the log and
reading the files with pyarrow.parquet does not.)
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass
from urllib.parse import urlsplit


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


def _text(value: object) -> str:
    return value.isoformat() if isinstance(value, dt.date) else str(value)


def table_version(table_path: str) -> int:
    """The table's latest version."""
    from deltalake import DeltaTable

    try:
        return int(DeltaTable(table_path).version())
    except Exception as e:  # deltalake raises TableNotFoundError and friends
        raise UnavailableVersionError(f"no Delta table at {table_path}: {e}") from e


def logged_files(table_path: str, version: int) -> list[LoggedFile]:
    """Every data file of the table at `version`, with its partition values and row count."""
    import pyarrow as pa
    from deltalake import DeltaTable

    try:
        table = DeltaTable(table_path, version=version)
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

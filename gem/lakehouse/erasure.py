"""Erasing one user everywhere: their rows in every table, their raw lines in landing and quarantine.

`gem delete-user USER_ID` (`erase_user`):
  * every table whose schema has a `user_id` column: a Delta DELETE of the user's rows through the
    table's writer engine (TableSchema.writer: Spark for the Spark stages' tables, opened only when
    one exists; deltalake for the others), one commit per table that held any;
  * `bronze.quarantine`: the rows whose raw line names the user (parsed as JSON where it parses, so
    an id given as a number counts; matched on its `"user_id"` field where it does not);
  * landing: every file ingestion reads (data files and misnamed ones) with a line naming the user
    rewritten without it (gem.lakehouse.landing.LandingFile, published whole through gem.storage,
    as producers write; the landing root may be an object store). A damaged gzip file whose
    readable part names the user cannot be rewritten line by line: it is listed, for a person to
    remove.
A DELETE leaves the rows in the data files the older table versions name, so time travel (and a
completion record pinned to an older version) still reads them until VACUUM removes files retired
more than `retention_days` ago (the tables' `delta.deletedFileRetentionDuration`). The report says
from which day the first VACUUM removes them. Derived state outside the tables (trained models,
checkpoints) is not touched: retraining from the erased tables is the way to forget there.
"""

from __future__ import annotations

import datetime as dt
import gzip
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gem import storage
from gem.config import GemConfig
from gem.data.delta_log import read_table
from gem.lakehouse.landing import (
    PARTITION_PREFIX,
    LandingFile,
    files_in,
    gzip_problem,
    lines_before_damage,
    partition_dirs,
)
from gem.lakehouse.spark import session_on_demand
from gem.lakehouse.tables import delete_rows, string_literal, table_exists, table_path
from gem.lakehouse.upkeep import next_upkeep_run
from schemas import TABLES
from schemas.events import BRONZE_QUARANTINE

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

USER_COLUMN = "user_id"
# The erasure's commits say what they are (the commit's userMetadata): a day's validation stands after
# one (gem.lakehouse.commit.StageCommit.validated_version), since removing one user's rows adds no bad
# row, so deleting a user does not make every later run refuse the erased days until re-validated.
ERASURE_USER_METADATA = "gem:erasure"


@dataclass
class ErasureReport:
    user_id: str
    rows_deleted: dict[str, int] = field(default_factory=dict)  # table -> rows
    landing_lines_removed: dict[str, int] = field(default_factory=dict)  # landing file -> lines
    damaged_landing_files: list[str] = field(default_factory=list)
    vacuum_from: dt.datetime | None = None  # the first scheduled upkeep whose VACUUM removes the old files

    def lines(self) -> list[str]:
        out = [f"deleted user {self.user_id!r}:"]
        out += [f"  {t:<34} {n:>8,} rows" for t, n in sorted(self.rows_deleted.items())]
        out += [f"  {f:<34} {n:>8,} lines" for f, n in sorted(self.landing_lines_removed.items())]
        if not self.rows_deleted and not self.landing_lines_removed:
            out.append("  nothing held this user")
        out += [f"  damaged landing file, not rewritten (remove it by hand): {f}" for f in self.damaged_landing_files]
        if self.vacuum_from is not None:
            out.append(f"older table versions still hold the deleted rows until VACUUM removes their files, "
                       f"retention_days after this deletion: the first weekly upkeep to do so runs "
                       f"{self.vacuum_from:%Y-%m-%d %H:%M} UTC (the gem_upkeep DAG, which must be unpaused)")
        return out


def names_user(raw_line: str, user_id: str) -> bool:
    """Whether a raw landing line is the user's: its JSON `user_id` is the id (a number written as
    the id counts); a line that is not a JSON object matches on a `"user_id": "<id>"` field."""
    try:
        event = json.loads(raw_line)
    except ValueError:
        event = None
    if isinstance(event, dict):
        value = event.get(USER_COLUMN)
        return value == user_id or (isinstance(value, int | float) and not isinstance(value, bool)
                                    and json.dumps(value) == user_id)
    return re.search(rf'"{USER_COLUMN}"\s*:\s*"?{re.escape(user_id)}"?\s*[,}}]', raw_line) is not None


def erase_tables(cfg: GemConfig, user_id: str, spark: SparkSession | None = None) -> dict[str, int]:
    """The user's rows deleted from every table with a user_id column and the quarantined raw lines
    naming them; -> rows deleted per table (tables that held none left out). `spark`: the session for
    the Spark-written tables (default: one from get_spark, opened when first needed)."""
    session: Callable[[], SparkSession] = session_on_demand(cfg, spark, app_name="gem-erasure")
    deleted: dict[str, int] = {}
    for name, schema in TABLES.items():
        path = table_path(cfg, schema)
        if not table_exists(path):
            continue
        if USER_COLUMN in schema.column_names:
            where = f"{USER_COLUMN} = {string_literal(user_id, schema)}"
        elif name == BRONZE_QUARANTINE.name:
            lines = {r for r in read_table(path, columns=["raw_line"]).column("raw_line").to_pylist()
                     if r is not None and names_user(r, user_id)}
            if not lines:
                continue
            where = f"raw_line IN ({', '.join(string_literal(x, schema) for x in sorted(lines))})"
        else:
            continue
        n = delete_rows(session, schema, path, where, ERASURE_USER_METADATA)
        if n:
            deleted[name] = n
    return deleted


def erase_landing(landing_root: str, user_id: str) -> tuple[dict[str, int], list[str]]:
    """Every landing file ingestion reads (data files, and misnamed ones, whose lines it quarantines)
    rewritten without the user's lines; -> (lines removed per file, the damaged gzip files that could
    not be rewritten). A file is gzip when its name ends in `.gz`, as Spark's reader decides."""
    removed: dict[str, int] = {}
    damaged: list[str] = []
    for folder in partition_dirs(landing_root):
        for uri in files_in(folder).all_files:
            file_name = storage.name(uri)
            if file_name.endswith(".gz") and gzip_problem(uri) is not None:
                if any(names_user(line, user_id) for line in lines_before_damage(uri)):
                    damaged.append(uri)
                continue
            data = storage.read_bytes(uri)
            lines = (gzip.decompress(data) if file_name.endswith(".gz") else data).decode("utf-8", "replace").splitlines()
            keep = [line for line in lines if not names_user(line, user_id)]
            if len(keep) == len(lines):
                continue
            ds = storage.name(folder).removeprefix(PARTITION_PREFIX)
            with LandingFile(landing_root, ds, file_name=file_name) as rewritten:
                rewritten.write_lines(keep)  # replaces the old file whole when closed
            removed[f"{storage.name(folder)}/{file_name}"] = len(lines) - len(keep)
    return removed, damaged


def erase_user(cfg: GemConfig, user_id: str, now: dt.datetime | None = None,
               spark: SparkSession | None = None) -> ErasureReport:
    """Delete one user everywhere (the module docstring); -> what was removed and which scheduled
    upkeep's VACUUM finishes it (`now`: the deletion's time, default the clock's; `spark`: as in
    erase_tables)."""
    if not user_id.strip():
        raise ValueError("a user id is needed (got an empty one)")
    report = ErasureReport(user_id)
    report.rows_deleted = erase_tables(cfg, user_id, spark)
    report.landing_lines_removed, report.damaged_landing_files = erase_landing(cfg.landing_root, user_id)
    if report.rows_deleted:
        deleted_at = now or dt.datetime.now(dt.UTC)
        report.vacuum_from = next_upkeep_run(deleted_at + dt.timedelta(days=cfg.retention_days))
    return report

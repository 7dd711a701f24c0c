"""Two lakehouses built from the same days, compared table by table.

A rerun, a backfill and a run resumed after a kill must leave the rows an uninterrupted daily run
leaves. What may differ by design is left out: the columns of VOLATILE_COLUMNS between any two runs
of the same days, and the wider NOT_COMPARED between two lakehouses in different folders. Tables are
read through their Delta log (gem.data.delta_log), as readers outside Spark read them.
"""

from __future__ import annotations

from gem.config import GemConfig
from gem.data.delta_log import read_table
from gem.lakehouse.tables import table_exists, table_path
from schemas import TABLES

# Differ between any two runs of the same days by design: ids of the run and when things happened.
VOLATILE_COLUMNS = {"run_id", "completed_at", "table_versions", "input_versions", "ingested_at"}

# Differ between two lakehouses built from the same days by design: run ids and times
# (VOLATILE_COLUMNS); Delta versions (two tables with the same rows can have different commit
# histories: a rerun adds a commit, a task process creating a table another already made adds none);
# where files are (each lakehouse has its own folder and random data file names) and what embeds it
# (a mixture's id hashes its rows' paths and versions; a metrics row keeps the run's config, with its
# lakehouse_uri); when rows were computed; the code's commit.
NOT_COMPARED = VOLATILE_COLUMNS | {
    "table_version", "examples_version", "sequences_version",
    "file_path", "table_path", "sequences_path", "model_checkpoint", "mixture_id", "config",
    "created_at", "computed_at", "code_version",
}


def lakehouse_rows(cfg: GemConfig, name: str, ignore: set[str] = VOLATILE_COLUMNS) -> list[tuple[str, ...]]:
    """Table `name`'s rows without the `ignore` columns, each as reprs, sorted: what two lakehouses
    built from the same days must agree on ([] when the table was never written)."""
    path = table_path(cfg, TABLES[name])
    if not table_exists(path):
        return []
    table = read_table(path)
    keep = [c for c in table.column_names if c not in ignore]
    return sorted(tuple(repr(v) for v in row.values()) for row in table.select(keep).to_pylist())

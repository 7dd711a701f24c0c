"""gold.mixture_manifest: what training reads, as a versioned decision instead of a copied dataset.

One partition per mix day ds; one row per (source, data file). A source is a task (surface,
label type) over a range of silver.training_examples days, in a split: "train", "validation" (the
days just before the held-out one, for choosing hyper-parameters) or "eval" (held out). Its
files are the examples table's files at a PINNED Delta version, listed from the Delta log (never
from the folder), so the manifest keeps meaning exactly those rows even after later rewrites. The
rows of a file of partition (ds, surface) belong to every task of that surface: the same file
appears once per label type, each with that source's own rates.

Sampling (gem/data/loader.py applies it; no row is rewritten): a row of source s is drawn in a pass
with probability  p = sampling_rate  if its label for the task is 1, else sampling_rate *
negative_rate, decided by a hash of (seed, pass, source, file, row), and then carries the
importance weight 1 / p for that task. Validation and eval sources always have rate 1 and
negative_rate 1.

Example row:
    {"ds": 2026-01-16, "mixture_id": "mix-2026-01-16-5f0c2a", "split": "train", "source": "reels/click",
     "surface": "reels", "label_type": "click", "first_ds": 2026-01-01, "last_ds": 2026-01-14,
     "table_path": "/lake/silver/training_examples", "table_version": 41,
     "file_path": "/lake/silver/training_examples/ds=2026-01-03/surface=reels/part-0.parquet",
     "file_ds": 2026-01-03, "file_rows": 8123, "file_bytes": 912345, "source_rows": 120400,
     "source_positives": 2650, "sampling_rate": 0.61, "negative_rate": 1.0, "policy": "temperature",
     "temperature": 2.0, "seed": 17, "sequences_path": "/lake/silver/user_sequences", "sequences_version": 30}
"""

from __future__ import annotations

from schemas.table import Column, TableSchema
from schemas.tasks import LABEL_TYPES, SURFACES

# In day order: every training day precedes every validation day, which precede the held-out day.
SPLITS: tuple[str, ...] = ("train", "validation", "eval")

GOLD_MIXTURE_MANIFEST = TableSchema(
    name="gold.mixture_manifest",
    writer="deltalake",
    doc="Sources (task x example days) with pinned Delta versions, their files from the log, and sampling rates.",
    columns=(
        Column("ds", "date", nullable=False, doc="the mix day"),
        Column("mixture_id", "string", nullable=False, doc="identifies this manifest (day + content hash)"),
        Column("split", "string", nullable=False, allowed=SPLITS),
        Column("source", "string", nullable=False, doc="task name, surface/label_type"),
        Column("surface", "string", nullable=False, allowed=SURFACES),
        Column("label_type", "string", nullable=False, allowed=LABEL_TYPES),
        Column("first_ds", "date", nullable=False, doc="first example day of the source"),
        Column("last_ds", "date", nullable=False, doc="last example day of the source"),
        Column("table_path", "string", nullable=False, doc="silver.training_examples location"),
        Column("table_version", "long", nullable=False, doc="pinned Delta version the files are listed at"),
        Column("file_path", "string", nullable=False, doc="absolute data file path, from the Delta log"),
        Column("file_ds", "date", nullable=False, doc="the file's ds partition value"),
        Column("file_rows", "long", nullable=False, doc="rows in the file (Delta log statistics)"),
        Column("file_bytes", "long", nullable=False),
        Column("source_rows", "long", nullable=False, doc="rows of the whole source"),
        Column("source_positives", "long", nullable=False, doc="rows of the source with label 1 for its task"),
        Column("sampling_rate", "double", nullable=False, doc="probability a positive row is drawn per pass"),
        Column("negative_rate", "double", nullable=False, doc="extra keep probability of a negative row"),
        Column("policy", "string", nullable=False),
        Column("temperature", "double", doc="for policy temperature"),
        Column("seed", "long", nullable=False),
        Column("sequences_path", "string", nullable=False, doc="silver.user_sequences location"),
        Column("sequences_version", "long", nullable=False, doc="pinned version the loader reads snapshots at"),
    ),
    partition_by=("ds",),
    key=("ds", "split", "source", "file_path"),
    checks=(("rates_in_unit_interval", "sampling_rate > 0 AND sampling_rate <= 1 AND negative_rate > 0 AND negative_rate <= 1"),),
)

"""gold.metrics: evaluation of a training run, per task, on the held-out day of its mixture.

Written by gem.train.daily without Spark (the `deltalake` package): each run replaces the rows of its
(ds, arch), so a rerun of a day leaves one row per task, from the latest run.
A row says which run (run_id, code version, config), what it read (mixture id and the pinned
Delta versions of the examples and sequences), and how it did: NE, AUC and calibration weighted
by the loader's importance weights (all 1 on the held-out split).
"""

from __future__ import annotations

from schemas.table import Column, TableSchema

GOLD_METRICS = TableSchema(
    name="gold.metrics",
    writer="deltalake",
    doc="Per-task NE / AUC / calibration of a training run on its held-out day.",
    columns=(
        Column("ds", "date", nullable=False, doc="the mixture's day (jobs.mix --ds)"),
        Column("run_id", "string", nullable=False),
        Column("arch", "string", nullable=False),
        Column("task", "string", nullable=False,
               doc="surface/label_type; all/label_type: that label type pooled over the surfaces"),
        Column("split", "string", nullable=False),
        Column("examples", "long", nullable=False),
        Column("positives", "double", nullable=False, doc="weighted count of label 1"),
        Column("ne", "double", doc="null when the task has no positive or no negative"),
        Column("auc", "double"),
        Column("calibration", "double"),
        Column("train_steps", "long", nullable=False),
        Column("mixture_id", "string", nullable=False),
        Column("examples_version", "long", nullable=False),
        Column("sequences_version", "long", nullable=False),
        Column("code_version", "string", nullable=False, doc="git commit of the code that trained"),
        Column("config", "string", nullable=False, doc="the full config as JSON"),
        Column("created_at", "timestamp", nullable=False),
    ),
    partition_by=("ds",),
    key=("run_id", "task", "split"),
)

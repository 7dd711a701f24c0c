"""Operational tables: the per-(stage, ds) completion records downstream readers gate on."""

from __future__ import annotations

from schemas.table import Column, TableSchema

COMPLETIONS = TableSchema(
    name="_ops.completions",
    doc=(
        "One row per (stage, ds), written last by a stage after all its tables committed. "
        "Downstream stages read a ds only when its record exists. Counts reconcile: "
        "rows_in = rows_written + rows_quarantined, and rows_quarantined = sum(quarantined_by_reason)."
    ),
    columns=(
        Column("stage", "string", nullable=False),
        Column("ds", "date", nullable=False),
        Column("run_id", "string", nullable=False),
        Column("rows_in", "long", nullable=False, min=0),
        Column("rows_written", "long", nullable=False, min=0),
        Column("rows_quarantined", "long", nullable=False, min=0),
        Column("quarantined_by_reason", "map<string,long>"),
        Column("table_versions", "map<string,long>", doc="Delta version each output was committed at"),
        Column("completed_at", "timestamp", nullable=False),
    ),
    partition_by=("stage", "ds"),
    key=("stage", "ds"),
    checks=(("counts_reconcile", "rows_in = rows_written + rows_quarantined"),),
)

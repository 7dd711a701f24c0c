"""Operational tables: the per-(stage, ds) completion records downstream readers gate on."""

from __future__ import annotations

from schemas.table import Column, TableSchema

COMPLETIONS = TableSchema(
    name="_ops.completions",
    writer="deltalake",
    doc=(
        "One row per (stage, ds), written last by a stage after all its tables committed. "
        "Downstream stages read a ds only when its record exists. Counts reconcile: "
        "rows_in = rows_written + rows_quarantined, and rows_quarantined = sum(quarantined_by_reason); "
        "a stage without a separate input count leaves rows_in null and says why in reconciliation. "
        "Written through gem.lakehouse.commit.StageCommit."
    ),
    columns=(
        Column("stage", "string", nullable=False),
        Column("ds", "date", nullable=False),
        Column("run_id", "string", nullable=False),
        Column("rows_in", "long", min=0, doc="null: the stage has no separate input count (see reconciliation)"),
        Column("rows_written", "long", nullable=False, min=0),
        Column("rows_quarantined", "long", nullable=False, min=0),
        Column("quarantined_by_reason", "map<string,long>"),
        Column("table_versions", "map<string,long>",
               doc="the version each of the stage's own commits created; a validation's: the versions it validated"),
        Column("input_versions", "map<string,long>",
               doc="'table@day' -> the version the input record of that day named; 'table' -> one read outside a record"),
        Column("reconciliation", "string", nullable=False,
               doc="'checked' (rows_in verified against the commits' row counts) or why there is no input count"),
        Column("completed_at", "timestamp", nullable=False),
        # Added after the first release: a lakehouse made before them gets them on its next write
        # (gem.lakehouse.tables.ensure_table adds missing nullable columns); its older records hold none.
        Column("table_fingerprints", "map<string,string>",
               doc="table -> the fingerprint of the record's day's rows in the version table_versions names "
                   "(gem.lakehouse.fingerprint; tables written through Spark)"),
        Column("input_fingerprints", "map<string,string>",
               doc="the fingerprints the input records named, keyed as input_versions"),
    ),
    partition_by=("stage", "ds"),
    key=("stage", "ds"),
    checks=(("counts_reconcile", "rows_in IS NULL OR rows_in = rows_written + rows_quarantined"),
            ("unchecked_says_why",
             "(rows_in IS NULL AND reconciliation <> 'checked') OR (rows_in IS NOT NULL AND reconciliation = 'checked')")),
)

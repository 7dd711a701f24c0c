"""The stage contract's one commit path: every stage, Spark or torch, commits through StageCommit.

    ctx = StageContext(cfg)                               # opens Spark only if a stage asks for it
    commit = StageCommit.begin(ctx, "assemble_examples", ds)  # 1. inputs checked  2. record withdrawn
    commit.replace(examples, SILVER_TRAINING_EXAMPLES)        # 3. exactly the declared partitions
    commit.replace(quarantine, SILVER_ATTRIBUTION_QUARANTINE)
    commit.publish(rows_in=n_in, rows_written=n_examples + n_attributed,   # 4. reconciled from the
                   quarantined_by_reason=by_reason,                       #    commits' own metrics
                   quarantine_table=SILVER_ATTRIBUTION_QUARANTINE)        # 5. the record, last

Why one path (README, "Rules every stage follows"): the rules (withdraw before writing, replace only
what the registry declares, reconcile against what Delta says it committed, name the versions read
and created, publish last) hold for every stage because no stage writes them itself.

The record names
- `table_versions`: the version each of the stage's own commits created, taken from the commit
  that carries this run's id (never the table's latest version, which another writer may have
  moved); for a validation stage, which writes nothing, the versions it validated;
- `input_versions`: `"{stage}:{table}@{day}"` -> the version the input record (stage, day) named,
  plus any table the stage read outside a record (`read`, keyed by the table alone), so a run can be
  replayed at exactly its inputs, and a record is known stale once an input record names another
  version (gem.staleness);
- `reconciliation`: `checked` when rows_in = rows_written + rows_quarantined was verified against
  the commits' row counts; otherwise why the stage has no separate input count (rows_in is null).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Mapping

from gem import lakehouse, stages, staleness
from gem.config import GemConfig
from gem.days import day_range
from schemas.table import TableSchema

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

CHECKED = "checked"


def input_key(stage: str, table: str, day: str) -> str:
    """How a record names an input version: the record (stage, day) that named `table`'s version,
    e.g. "validate_events:bronze.ad_events@2026-01-03"."""
    return f"{stage}:{table}@{day}"


class UndeclaredWriteError(RuntimeError):
    """A stage tried to replace a table or partition its registry declaration does not name."""


class ReconciliationError(RuntimeError):
    """The rows a stage counted disagree with what its commits wrote."""


@dataclass
class StageContext:
    """What a stage's `run(ctx, ds)` gets: the config and, for Spark stages, a session opened on
    first use (a torch stage never starts a JVM)."""

    cfg: GemConfig
    spark_session: SparkSession | None = None

    def spark_for(self, stage_name: str, ds: str) -> SparkSession:
        if not stages.stage(stage_name).spark:
            raise RuntimeError(f"stage {stage_name} is declared without Spark; it must not start a session")
        if self.spark_session is None:
            from gem.spark import get_spark

            self.spark_session = get_spark(self.cfg, app_name=f"{stage_name}:{ds}")
        return self.spark_session


@dataclass
class StageCommit:
    """One run of one stage for one day; see the module docstring for the order of its steps."""

    cfg: GemConfig
    stage: stages.Stage
    ds: str
    run_id: str
    inputs: dict[tuple[str, str], dict[str, Any]]
    input_versions: dict[str, int]
    table_versions: dict[str, int] = field(default_factory=dict)
    committed_rows: dict[str, int] = field(default_factory=dict)
    published: dict[str, Any] | None = None

    @classmethod
    def begin(cls, ctx: StageContext, name: str, ds: str) -> StageCommit:
        """Check the registry's needs (MissingInputError naming what to run first; StaleInputError
        when one rests on rewritten data, naming what to rerun), then withdraw the stage's record for
        ds, so a crash from here on leaves no record claiming the outputs."""
        stage = stages.stage(name)
        records = lakehouse.require_stage_inputs(ctx.cfg, name, ds)
        versions = {input_key(s, table, day): int(v) for (s, day), record in records.items()
                    for table, v in sorted((record.get("table_versions") or {}).items())}
        staleness.require_fresh(ctx.cfg, name, ds, list(records))
        lakehouse.clear_completion(ctx.cfg, name, ds)
        return cls(ctx.cfg, stage, ds, lakehouse.new_run_id(name, ds), records, versions)

    # --- what the stage read --------------------------------------------------------------------

    def record(self, stage_name: str, day: str) -> dict[str, Any]:
        """The input record (stage_name, day) that `begin` checked."""
        try:
            return self.inputs[(stage_name, day)]
        except KeyError:
            raise KeyError(f"{self.stage.name} ds={self.ds} does not declare a need for {stage_name} ds={day}") from None

    def also_needs(self, stage_name: str, day: str) -> dict[str, Any]:
        """A record needed beyond the registry's day rules, known only from the data (e.g. the
        feature days of late impressions): required like the declared ones (MissingInputError
        naming it), and its versions noted as read."""
        record = lakehouse.require_completed(self.cfg, stage_name, day)
        staleness.require_fresh(self.cfg, self.stage.name, self.ds, [(stage_name, day)])
        self.inputs[(stage_name, day)] = record
        self.input_versions |= {input_key(stage_name, t, day): int(v) for t, v in sorted(record["table_versions"].items())}
        return record

    def validated_version(self, schema: TableSchema, validation_stage: str, days: list[str]) -> int:
        """The one version of the table to read the `days` at: the newest of the versions the
        validation records of those days (inputs of this commit) validated, provided each day's
        partition there (and at the table's latest version) holds exactly the files its validation
        saw. Raises StaleInputError naming the validation to rerun when a later commit rewrote a day
        without a new validation."""
        from gem.data.delta_log import logged_files

        table = schema.name
        validated = {}
        for day in days:
            version = self.record(validation_stage, day)["table_versions"].get(table)
            if version is None:
                raise lakehouse.StaleInputError(
                    f"{self.stage.name} ds={self.ds}: the {validation_stage} record of ds={day} names no validated "
                    f"version of {table}; run `{stages.command(validation_stage, day)}` first")
            validated[day] = int(version)
        if not validated:
            raise ValueError(f"{self.stage.name}: no day of {table} to read")
        path = lakehouse.table_path(self.cfg, schema)
        listings: dict[int, dict[str, set[str]]] = {}

        def files(version: int) -> dict[str, set[str]]:
            if version not in listings:
                by_day: dict[str, set[str]] = {}
                for f in logged_files(path, version):
                    by_day.setdefault(f.partition["ds"], set()).add(f.path)
                listings[version] = by_day
            return listings[version]

        from gem.data.delta_log import table_version

        pinned, latest = max(validated.values()), table_version(path)
        for day, version in sorted(validated.items()):
            seen = files(version).get(day, set())
            if files(pinned).get(day, set()) != seen or files(latest).get(day, set()) != seen:
                raise lakehouse.StaleInputError(
                    f"{self.stage.name} ds={self.ds}: {table} ds={day} changed after its validation (version "
                    f"{version}; read at {pinned}); run `{stages.command(validation_stage, day)}` first")
        return pinned

    def read(self, table: str, version: int) -> int:
        """Note a table version read outside any input record (e.g. the sequences a mixture pins)."""
        self.input_versions[table] = int(version)
        return int(version)

    # --- its writes ----------------------------------------------------------------------------

    @property
    def user_metadata(self) -> str:
        return json.dumps({"run_id": self.run_id, "stage": self.stage.name, "ds": self.ds})

    def _declared_where(self, schema: TableSchema, days: list[str] | None) -> tuple[list[str], Any]:
        declared = self.stage.partitions(self.cfg, self.ds).get(schema.name)
        if declared is None:
            raise UndeclaredWriteError(
                f"{self.stage.name} ds={self.ds} writes {schema.name}, which its registry declaration "
                f"does not name for that day (declared: {sorted(self.stage.partitions(self.cfg, self.ds))})")
        days = list(declared if days is None else days)
        outside = sorted(set(days) - set(declared))
        if not days or outside:
            raise UndeclaredWriteError(
                f"{self.stage.name} ds={self.ds} may replace {schema.name} ds in {declared[0]}..{declared[-1]}; "
                f"asked for {days or 'no day'}")
        if days != day_range(days[0], days[-1]):
            raise UndeclaredWriteError(f"{schema.name}: one replace covers consecutive days, got {days}")
        return days, days[0] if len(days) == 1 else (days[0], days[-1])

    def replace(self, df: DataFrame, schema: TableSchema, days: list[str] | None = None) -> int:
        """Replace the declared partitions (all of the day's, or `days` among them) of `schema` with
        `df` in one Delta commit; -> the version that commit created."""
        _, ds_where = self._declared_where(schema, days)
        version = lakehouse.replace_partition(df, self.cfg, schema, {"ds": ds_where}, self.user_metadata)
        return self._committed(schema, version)

    def replace_arrow(self, rows: pa.Table, schema: TableSchema, also: Mapping[str, str] | None = None) -> int:
        """The same for a stage without Spark, through `deltalake`: replace the rows of the declared
        partition (narrowed by `also`, e.g. one architecture's metrics) with `rows`."""
        from deltalake import write_deltalake

        days, _ = self._declared_where(schema, None)
        if len(days) != 1:
            raise UndeclaredWriteError(f"{schema.name}: replace_arrow replaces one day, declared {days}")
        where = {"ds": days[0], **(also or {})}
        from deltalake import DeltaTable

        path = lakehouse.ensure_table(None, self.cfg, schema)
        # Written through a table object: after the write it stands at the version this transaction
        # committed (after any conflict retries). A fresh read of the log while another process
        # commits to it was measured to miss the commit.
        table = DeltaTable(path)
        write_deltalake(table, rows, mode="overwrite", predicate=lakehouse.predicate(where),
                        partition_by=list(schema.partition_by) or None,
                        commit_properties=lakehouse.commit_properties(self.user_metadata))
        (own,) = [c for c in table.history(1) if c.get("userMetadata") == self.user_metadata] or [None]
        if own is None:
            raise RuntimeError(f"{schema.name}: the write of {self.run_id} left no commit of its own at v{table.version()}")
        self.table_versions[schema.name] = int(table.version())
        self.committed_rows[schema.name] = int((own.get("operationMetrics") or {}).get("num_added_rows", 0))
        return int(table.version())

    def _committed(self, schema: TableSchema, version: int) -> int:
        self.table_versions[schema.name] = version
        self.committed_rows[schema.name] = lakehouse.rows_committed(self.cfg, schema, version, self.user_metadata)
        return version

    # --- the record ----------------------------------------------------------------------------

    def publish(
        self,
        rows_in: int | None,
        rows_written: int | None = None,
        quarantined_by_reason: Mapping[str, int] | None = None,
        *,
        written_tables: tuple[TableSchema, ...] = (),
        quarantine_table: TableSchema | None = None,
        no_input_count: str = "",
        validated: Mapping[str, int] | None = None,
    ) -> dict[str, Any]:
        """Reconcile and publish the record for ds; -> the record.

        rows_written: the stage's output rows; when `written_tables` are given, it must equal (or,
            when omitted, is) the sum of what their commits wrote.
        quarantine_table: its commit must have written exactly sum(quarantined_by_reason) rows.
        rows_in=None: the stage has no separate input count; `no_input_count` says why, and the
            record says so instead of claiming a check.
        validated: a validation stage's validated versions (it creates none of its own).
        """
        by_reason = {k: int(v) for k, v in (quarantined_by_reason or {}).items()}
        committed = sum(self.committed_rows[s.name] for s in written_tables)
        if rows_written is None:
            rows_written = committed
        elif written_tables and committed != rows_written:
            raise ReconciliationError(
                f"{self.stage.name} ds={self.ds}: commits of {[s.name for s in written_tables]} wrote {committed} "
                f"rows, the stage counted {rows_written}")
        if quarantine_table is not None and self.committed_rows[quarantine_table.name] != sum(by_reason.values()):
            raise ReconciliationError(
                f"{self.stage.name} ds={self.ds}: {quarantine_table.name}'s commit wrote "
                f"{self.committed_rows[quarantine_table.name]} rows, quarantined by reason {by_reason}")
        if rows_in is None and not no_input_count:
            raise ValueError(f"{self.stage.name}: without rows_in, say why the stage has no input count")
        versions = dict(self.table_versions)
        if validated is not None:
            if self.table_versions:
                raise ValueError(f"{self.stage.name}: a validation stage commits no table of its own")
            versions = {k: int(v) for k, v in validated.items()}
        self.published = lakehouse.publish_completion(
            self.cfg, self.stage.name, self.ds, self.run_id,
            rows_in=rows_in, rows_written=int(rows_written), quarantined_by_reason=by_reason,
            table_versions=versions, input_versions=self.input_versions,
            reconciliation=CHECKED if rows_in is not None else no_input_count,
        )
        return self.published

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
  version (gem.lakehouse.staleness);
- `table_fingerprints` and `input_fingerprints`: the fingerprint of each day's rows of every table
  the stage wrote through Spark (gem.lakehouse.fingerprint; a validation's: those of the rows it
  validated), and the fingerprints its input records named, so a rewrite with the same rows leaves
  its readers valid;
- `reconciliation`: `checked` when rows_in = rows_written + rows_quarantined was verified against
  the commits' row counts; otherwise why the stage has no separate input count (rows_in is null).
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from deltalake import CommitProperties, Transaction, write_deltalake

from gem.config import GemConfig
from gem.data.delta_log import data_changes_by_version, logged_files, table_version
from gem.days import day_range
from gem.lakehouse import backfill_hold, completions, fingerprint, lease, stages, staleness, tables
from gem.lakehouse.erasure import ERASURE_USER_METADATA
from gem.lakehouse.spark import get_spark
from schemas.table import TableSchema

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

CHECKED = "checked"


def input_key(stage: str, table: str, day: str) -> str:
    """How a record names an input version: the record (stage, day) that named `table`'s version,
    e.g. "validate_events:bronze.ad_events@2026-01-03"."""
    return f"{stage}:{table}@{day}"


def read_from(records: Mapping[tuple[str, str], Mapping[str, Any]]) -> tuple[dict[str, int], dict[str, str]]:
    """The versions and fingerprints the input records name, keyed by `input_key`."""
    versions, fingerprints = {}, {}
    for (stage, day), record in records.items():
        for table, version in sorted((record.get("table_versions") or {}).items()):
            versions[input_key(stage, table, day)] = int(version)
        for table, print_ in (record.get("table_fingerprints") or {}).items():
            fingerprints[input_key(stage, table, day)] = print_
    return versions, fingerprints


class UndeclaredWriteError(RuntimeError):
    """A stage tried to replace a table or partition its registry declaration does not name."""


class ReconciliationError(RuntimeError):
    """The rows a stage counted disagree with what its commits wrote."""


def sum_by_reason(counts: Iterable[Mapping[str, int]]) -> dict[str, int]:
    """Quarantine counts by reason, added over days, sorted by reason."""
    total: Counter[str] = Counter()
    for c in counts:
        total.update({reason: int(n) for reason, n in c.items()})
    return dict(sorted(total.items()))


@dataclass(frozen=True)
class DayCounts:
    """One day's counts in a range commit: rows in (None: the stage has no separate input count),
    rows written, rows quarantined by reason."""

    rows_in: int | None
    rows_written: int
    quarantined_by_reason: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class StageResult:
    """What every stage's `run(ctx, ds)` returns: the completion records it published (one per day
    its commit covered; none when nothing was ready) and the stage's own figures (`details`, e.g.
    the users a feature build advanced, a validation's reports)."""

    stage: str
    ds: str
    seconds: float
    records: tuple[Mapping[str, Any], ...] = ()
    details: Mapping[str, Any] = field(default_factory=dict)

    @property
    def published(self) -> bool:
        return bool(self.records)

    @property
    def record(self) -> Mapping[str, Any]:
        """The last record published: ds's, or the last day's of a range commit."""
        if not self.records:
            raise LookupError(f"{self.stage} ds={self.ds} published no record")
        return self.records[-1]

    @property
    def table_versions(self) -> dict[str, int]:
        return dict(self.record["table_versions"])

    @property
    def rows_in(self) -> int | None:
        counts = [r["rows_in"] for r in self.records]
        return None if not counts or None in counts else sum(counts)

    @property
    def rows_written(self) -> int:
        return sum(int(r["rows_written"]) for r in self.records)

    @property
    def quarantined_by_reason(self) -> dict[str, int]:
        return sum_by_reason(r["quarantined_by_reason"] for r in self.records)

    def summary(self) -> str:
        """One line for the job's output, e.g. "ingest_events ds=2026-01-01: in=1020 written=1000
        quarantined=20 {...} versions={...} in 4.1s"."""
        if not self.records:
            return f"{self.stage} ds={self.ds}: nothing published in {self.seconds:.1f}s"
        days = self.ds if len(self.records) == 1 else f"{self.records[0]['ds']}..{self.records[-1]['ds']}"
        rows_in = "" if self.rows_in is None else f"in={self.rows_in} "
        quarantined = sum(self.quarantined_by_reason.values())
        return (f"{self.stage} ds={days}: {rows_in}written={self.rows_written} "
                + (f"quarantined={quarantined} {self.quarantined_by_reason} " if quarantined else "")
                + f"versions={self.table_versions} in {self.seconds:.1f}s")


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
    days: tuple[str, ...] = ()  # the days this commit covers, ds first (one, unless a range)
    table_versions: dict[str, int] = field(default_factory=dict)
    committed_rows: dict[str, int] = field(default_factory=dict)
    published: dict[str, Any] | None = None  # the record of the last day published
    published_records: list[dict[str, Any]] = field(default_factory=list)
    leases: list[lease.Lease] = field(default_factory=list)  # released once the records are published
    joined: bool = False  # a worker's part of a run another process began (StageCommit.join)
    ensured: dict[str, str] = field(default_factory=dict)  # table -> path, created or verified by this commit
    input_fingerprints: dict[str, str] = field(default_factory=dict)  # keyed as input_versions
    spark_written: dict[str, tuple[TableSchema, SparkSession]] = field(default_factory=dict)  # fingerprinted at publish

    @classmethod
    def begin(cls, ctx: StageContext, name: str, ds: str, through: str | None = None) -> StageCommit:
        """Check the registry's needs (BackfillInProgressError while a backfill rewrites one of them;
        MissingInputError naming what to run first; StaleInputError when one rests on rewritten data,
        naming what to rerun), then withdraw the stage's record for
        ds, so a crash from here on leaves no record claiming the outputs.

        through: one commit for the days ds..through, one record per day (stages declared with
        `ranges`): each day's needs are checked, except the stage's own records of days in the range,
        which this commit makes."""
        stage = stages.stage(name)
        days = tuple(day_range(ds, through)) if through is not None else (ds,)
        if not days:
            raise ValueError(f"{name}: empty range ds={ds} .. {through}")
        if len(days) > 1 and not stage.ranges:
            raise UndeclaredWriteError(f"{name} is not declared with ranges: one commit covers one day")
        # A later day waits while a backfill rewrites a day it reads (gem.lakehouse.backfill_hold).
        backfill_hold.require_not_held(ctx.cfg, name, days[-1], [k for day in days for k in stage.needed(ctx.cfg, day)])
        records: dict[tuple[str, str], dict[str, Any]] = {}
        # A range reads every record once (a day's needs would otherwise read the log per need).
        known = staleness.all_records(ctx.cfg) if len(days) > 1 else None
        for day in days:
            records |= completions.require_stage_inputs(ctx.cfg, name, day, made_here={(name, d) for d in days},
                                                        known=known)
        versions, fingerprints = read_from(records)
        staleness.require_fresh(ctx.cfg, name, ds, list(records))
        run_id = completions.new_run_id(name, ds)
        leases: list[lease.Lease] = []
        try:  # one run at a time per (stage, day): a concurrent run fails here, naming this one
            for day in days:
                leases.append(lease.acquire(ctx.cfg, name, day, run_id))
        except lease.LeaseHeldError:
            for held in leases:
                held.release()
            raise
        completions.clear_completions(ctx.cfg, name, days, known)
        return cls(ctx.cfg, stage, ds, run_id, records, versions, days, leases=leases, input_fingerprints=fingerprints)

    @classmethod
    def join(cls, cfg: GemConfig, name: str, ds: str, run_id: str) -> StageCommit:
        """A worker's view of run `run_id`, which another process began (and will publish): it may
        replace declared partitions in parts (`replace_arrow(..., part=...)`), never publish. The
        beginning process checked the inputs and holds the day's lease."""
        return cls(cfg, stages.stage(name), ds, run_id, {}, {}, (ds,), joined=True)

    @property
    def label(self) -> str:
        """The days this commit covers as a batch label: "2026-01-03", or "2026-01-01..2026-01-03"."""
        return self.ds if len(self.days) == 1 else f"{self.days[0]}..{self.days[-1]}"

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
        naming it; BackfillInProgressError while a backfill rewrites it), and its versions noted as read."""
        backfill_hold.require_not_held(self.cfg, self.stage.name, self.ds, [(stage_name, day)])
        record = completions.require_completed(self.cfg, stage_name, day)
        staleness.require_fresh(self.cfg, self.stage.name, self.ds, [(stage_name, day)])
        self.inputs[(stage_name, day)] = record
        versions, fingerprints = read_from({(stage_name, day): record})
        self.input_versions |= versions
        self.input_fingerprints |= fingerprints
        return record

    def validated_version(self, schema: TableSchema, validation_stage: str, days: list[str]) -> int:
        """The one version of the table to read the `days` at: the newest of the versions the
        validation records of those days (inputs of this commit) validated, provided each day's
        partition there (and at the table's latest version) holds exactly the files its validation
        saw; the latest version when a day's files were since only compacted (dataChange false),
        erased from (gem.lakehouse.erasure), or rewritten with the same rows by a rerun of the stage
        that makes them (its record's fingerprint equals the validated one), which leave its
        validation standing. Raises
        StaleInputError naming the validation to rerun when a later commit changed a day's data
        without a new validation."""
        table = schema.name
        validated = {}
        for day in days:
            version = self.record(validation_stage, day)["table_versions"].get(table)
            if version is None:
                raise completions.StaleInputError(
                    f"{self.stage.name} ds={self.ds}: the {validation_stage} record of ds={day} names no validated "
                    f"version of {table}; run `{stages.command(validation_stage, day)}` first")
            validated[day] = int(version)
        if not validated:
            raise ValueError(f"{self.stage.name}: no day of {table} to read")
        path = tables.table_path(self.cfg, schema)
        listings: dict[int, dict[str, set[str]]] = {}

        def files(version: int) -> dict[str, set[str]]:
            if version not in listings:
                by_day: dict[str, set[str]] = {}
                for f in logged_files(path, version):
                    by_day.setdefault(f.partition["ds"], set()).add(f.path)
                listings[version] = by_day
            return listings[version]

        pinned, latest = max(validated.values()), table_version(path)

        def moved(day: str, version: int) -> bool:
            seen = files(version).get(day, set())
            return files(pinned).get(day, set()) != seen or files(latest).get(day, set()) != seen

        moved_days = {day: version for day, version in validated.items() if moved(day, version)}
        if not moved_days:
            return pinned
        # Other files, maybe the same rows: a compaction (the weekly upkeep's OPTIMIZE) rewrites files
        # without changing data, an erasure (`gem delete-user`) only removes one user's rows, and a
        # rerun of the producing stage may write the same rows again; these leave the validation
        # standing. Any other change of the day's rows does not. Each commit's changes are read once,
        # from the oldest of these days' validated versions.
        changes = data_changes_by_version(path, min(moved_days.values()), latest, exempt={ERASURE_USER_METADATA})
        for day, version in sorted(moved_days.items()):
            same_rows = self.same_rows_version(validation_stage, table, day)
            since = version if same_rows is None else max(version, same_rows)
            if changes is None or any(day in changed for v, changed in changes.items() if v > since):
                raise completions.StaleInputError(
                    f"{self.stage.name} ds={self.ds}: {table} ds={day} changed after its validation (version "
                    f"{version}; read at {pinned}); run `{stages.command(validation_stage, day)}` first")
        # Read the files as they are now: the validated rows, less an erased user's (the older files
        # still hold those, and VACUUM removes them after the retention).
        return latest

    def same_rows_version(self, validation_stage: str, table: str, day: str) -> int | None:
        """The version of `table` that the record now naming `day`'s rows names, when its fingerprint
        equals the one the day's validation read (a rewrite with the validated rows); else None."""
        validation = self.record(validation_stage, day)
        for key, read in (validation.get("input_fingerprints") or {}).items():
            parsed = staleness.parse_input_key(key)
            if parsed is None or parsed[1:] != (table, day):
                continue
            producer = completions.completion(self.cfg, parsed[0], day)
            if producer is not None and producer["table_fingerprints"].get(table) == read:
                return int(producer["table_versions"][table])
        return None

    def read(self, table: str, version: int) -> int:
        """Note a table version read outside any input record (e.g. the sequences a mixture pins)."""
        self.input_versions[table] = int(version)
        return int(version)

    # --- its writes ----------------------------------------------------------------------------

    @property
    def user_metadata(self) -> str:
        return self.part_metadata(None)

    def part_metadata(self, part: str | None) -> str:
        """The userMetadata of this run's commits; a part's commit names its part too."""
        through = {"through": self.days[-1]} if len(self.days) > 1 else {}
        named = {"part": part} if part is not None else {}
        return json.dumps({"run_id": self.run_id, "stage": self.stage.name, "ds": self.ds, **through, **named})

    def _declared(self, table: str) -> list[str] | None:
        """The partitions of `table` this commit's days declare, oldest first (None: none)."""
        found = [self.stage.partitions(self.cfg, day).get(table) for day in self.days]
        if all(f is None for f in found):
            return None
        return sorted({d for f in found if f for d in f})

    def _declared_where(self, schema: TableSchema, days: list[str] | None) -> tuple[list[str], Any]:
        declared = self._declared(schema.name)
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
        # Consecutive days as a closed range; others (e.g. a range's compaction days) as a set.
        return days, tables.days_value(days)

    def replace(self, df: DataFrame, schema: TableSchema, days: list[str] | None = None) -> int:
        """Replace the declared partitions (all of the commit's days', or `days` among them, consecutive
        or not) of `schema` with `df` in one Delta commit; -> the version that commit created."""
        _, ds_where = self._declared_where(schema, days)
        committed = tables.replace_partition(df, self.cfg, schema, {"ds": ds_where}, self.user_metadata)
        self.spark_written[schema.name] = (schema, df.sparkSession)
        self.table_versions[schema.name] = committed.version
        self.committed_rows[schema.name] = committed.rows
        return committed.version

    def replace_arrow(self, rows: pa.Table, schema: TableSchema, also: Mapping[str, Any] | None = None,
                      part: str | None = None) -> int:
        """The same for a stage without Spark, through `deltalake`: replace the rows of the declared
        partition (narrowed by `also`, e.g. one architecture's metrics) with `rows`.

        part: the commit is one part of the run (e.g. a precompute shard, `also` its rows), written
        by whichever process does that part; it carries the Delta transaction id
        (`{stage}:{ds}:{table}:{part}`, the run's attempt time as its version), and `adopt_parts`
        gathers the parts into the run's record."""
        tables.require_writer(schema, "deltalake")
        days, _ = self._declared_where(schema, None)
        if len(days) != 1:
            raise UndeclaredWriteError(f"{schema.name}: replace_arrow replaces one day, declared {days}")
        where = {"ds": days[0], **(also or {})}
        if schema.name not in self.ensured:  # once per commit: a part commit writes the same table often
            self.ensured[schema.name] = tables.ensure_table(None, self.cfg, schema)
        path = self.ensured[schema.name]
        # Written through a table object: after the write it stands at the version this transaction
        # committed (after any conflict retries). A fresh read of the log while another process
        # commits to it can miss the commit.
        table = tables.delta_table(path)
        metadata = self.part_metadata(part)
        properties = tables.commit_properties(metadata)
        if part is not None:
            txn = Transaction(app_id=self.transaction_app_id(schema, part), version=time.time_ns() // 1000)
            properties = CommitProperties(custom_metadata={"userMetadata": metadata}, app_transactions=[txn])
        write_deltalake(table, rows, mode="overwrite", predicate=tables.predicate(where),
                        partition_by=list(schema.partition_by) or None, commit_properties=properties)
        # The newest commit carrying this write's metadata (other workers may have committed since).
        own = next((c for c in table.history(64) if c.get("userMetadata") == metadata), None)
        if own is None:
            raise RuntimeError(f"{schema.name}: the write of {self.run_id} left no commit of its own at v{table.version()}")
        if part is None:
            self.table_versions[schema.name] = int(table.version())
            self.committed_rows[schema.name] = int((own.get("operationMetrics") or {}).get("num_added_rows", 0))
        return int(table.version())

    def transaction_app_id(self, schema: TableSchema, part: str) -> str:
        return f"{self.stage.name}:{self.ds}:{schema.name}:{part}"

    def adopt_parts(self, schema: TableSchema, parts: Collection[str]) -> int:
        """Take the run's part commits of `schema` (replace_arrow(..., part=p) by any process) as
        this commit's: its version is the newest of them, its rows the sum of each part's last
        commit (a part rerun after its worker died counts once). -> that version. Raises when a part
        has no commit of this run."""
        path = tables.ensure_table(None, self.cfg, schema)
        last: dict[str, dict[str, Any]] = {}
        for c in tables.delta_table(path).history():  # newest first
            try:
                meta = json.loads(c.get("userMetadata") or "{}")
            except json.JSONDecodeError:
                continue
            if meta.get("run_id") == self.run_id and meta.get("part") in parts and meta["part"] not in last:
                last[meta["part"]] = c
        missing = sorted(set(parts) - set(last))
        if missing:
            raise RuntimeError(f"{self.stage.name} ds={self.ds}: {schema.name} has no commit of parts {missing} "
                               f"of run {self.run_id}")
        self.table_versions[schema.name] = max(int(c["version"]) for c in last.values())
        self.committed_rows[schema.name] = sum(int((c.get("operationMetrics") or {}).get("num_added_rows", 0))
                                               for c in last.values())
        return self.table_versions[schema.name]

    # --- the record ----------------------------------------------------------------------------

    def publish(
        self,
        rows_in: int | None = None,
        rows_written: int | None = None,
        quarantined_by_reason: Mapping[str, int] | None = None,
        *,
        written_tables: tuple[TableSchema, ...] = (),
        quarantine_table: TableSchema | tuple[TableSchema, ...] | None = None,
        no_input_count: str = "",
        validated: Mapping[str, int] | None = None,
        per_day: Mapping[str, DayCounts] | None = None,
    ) -> dict[str, Any]:
        """Reconcile and publish the record for ds; -> the record.

        rows_written: the stage's output rows; when `written_tables` are given, it must equal (or,
            when omitted, is) the sum of what their commits wrote.
        quarantine_table: its commit (or the commits of several, together) must have written exactly
            sum(quarantined_by_reason) rows.
        rows_in=None: the stage has no separate input count; `no_input_count` says why, and the
            record says so instead of claiming a check.
        validated: a validation stage's validated versions (it creates none of its own).
        per_day: a range commit's counts per day (its totals are the sums, and rows_in,
            rows_written and quarantined_by_reason are left out); one record per day is published.
        """
        if self.joined:
            raise RuntimeError(f"{self.stage.name} ds={self.ds}: a joined worker never publishes; the run's beginner does")
        if len(self.days) > 1 or per_day is not None:
            if per_day is None or sorted(per_day) != list(self.days):
                raise ValueError(f"{self.stage.name}: a commit of {list(self.days)} publishes counts per day, "
                                 f"got {sorted(per_day or {})}")
            if rows_in is not None or rows_written is not None or quarantined_by_reason:
                raise ValueError(f"{self.stage.name}: a range commit's totals come from per_day")
            counts = [per_day[d] for d in self.days]
            rows_in = None if any(c.rows_in is None for c in counts) else sum(c.rows_in for c in counts)
            rows_written = sum(c.rows_written for c in counts)
            quarantined_by_reason = sum_by_reason(c.quarantined_by_reason for c in counts)
        by_reason = {k: int(v) for k, v in (quarantined_by_reason or {}).items()}
        committed = sum(self.committed_rows[s.name] for s in written_tables)
        if rows_written is None:
            rows_written = committed
        elif written_tables and committed != rows_written:
            raise ReconciliationError(
                f"{self.stage.name} ds={self.ds}: commits of {[s.name for s in written_tables]} wrote {committed} "
                f"rows, the stage counted {rows_written}")
        quarantines = quarantine_table if isinstance(quarantine_table, tuple) else (quarantine_table,)
        names = [t.name for t in quarantines if t is not None]
        if names and sum(self.committed_rows[n] for n in names) != sum(by_reason.values()):
            raise ReconciliationError(
                f"{self.stage.name} ds={self.ds}: the commits of {names} wrote "
                f"{sum(self.committed_rows[n] for n in names)} rows, quarantined by reason {by_reason}")
        if rows_in is None and not no_input_count:
            raise ValueError(f"{self.stage.name}: without rows_in, say why the stage has no input count")
        versions = dict(self.table_versions)
        if validated is not None:
            if self.table_versions:
                raise ValueError(f"{self.stage.name}: a validation stage commits no table of its own")
            versions = {k: int(v) for k, v in validated.items()}
        reconciliation = CHECKED if rows_in is not None else no_input_count
        days = per_day or {self.ds: DayCounts(rows_in, int(rows_written), by_reason)}
        prints = self.validated_fingerprints(versions) if validated is not None else self.written_fingerprints()
        rows = [  # one record per day, each reconciled on its own counts, all in one commit
            completions.completion_row(
                self.stage.name, day, self.run_id,
                rows_in=c.rows_in, rows_written=int(c.rows_written), quarantined_by_reason=c.quarantined_by_reason,
                table_versions=versions, input_versions=self.input_versions, reconciliation=reconciliation,
                table_fingerprints=prints.get(day), input_fingerprints=self.input_fingerprints,
            )
            for day, c in sorted(days.items())
        ]
        self.published_records.extend(completions.publish_rows(self.cfg, self.stage.name, self.run_id, rows))
        self.published = self.published_records[-1]
        for held in self.leases:
            held.release()
        return self.published

    def written_fingerprints(self) -> dict[str, dict[str, str]]:
        """day -> table -> the fingerprint of the day's partitions (those its registry declares) of
        each table this commit wrote through Spark, at the version the commit created: one Spark
        job for all of them, over all the commit's days."""
        out: dict[str, dict[str, str]] = {day: {} for day in self.days}
        if not self.spark_written:
            return out
        covered = {name: {day: self.stage.partitions(self.cfg, day).get(name) or [] for day in self.days}
                   for name in self.spark_written}
        spark = next(iter(self.spark_written.values()))[1]
        per_table = fingerprint.tables_by_day(
            spark, {name: (tables.spark_location(spark, tables.table_path(self.cfg, schema)), self.table_versions[name])
                    for name, (schema, _) in self.spark_written.items()},
            {name: sorted({d for days in by_day.values() for d in days}) for name, by_day in covered.items()})
        for name, by_day in covered.items():
            for day, days in by_day.items():
                if days:
                    out[day][name] = fingerprint.combined(per_table[name], days)
        return out

    def validated_fingerprints(self, validated: Mapping[str, int]) -> dict[str, dict[str, str]]:
        """day -> table -> the fingerprint of the rows a validation validated: the one its input
        record of that day and table names (none when the record names none)."""
        out: dict[str, dict[str, str]] = {day: {} for day in self.days}
        for key, print_ in self.input_fingerprints.items():
            parsed = staleness.parse_input_key(key)
            if parsed is not None and parsed[1] in validated and parsed[2] in out:
                out[parsed[2]][parsed[1]] = print_
        return out

    def result(self, started: float, **details: Any) -> StageResult:
        """The run's StageResult: its published record, the seconds since `started` (time.time()),
        the stage's own figures."""
        if self.published is None:
            raise RuntimeError(f"{self.stage.name} ds={self.ds}: result() before publish()")
        return StageResult(self.stage.name, self.ds, time.time() - started, tuple(self.published_records), details)

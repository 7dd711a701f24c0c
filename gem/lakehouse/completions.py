"""Completion records (ops.completions): written last by a stage; the only signal downstream readers
trust.

The records live in a small Delta table read and written with `deltalake`: a check or a publish
costs milliseconds and no Spark job, and stages without a JVM (training) publish the same way.
Stages publish through gem.lakehouse.commit.StageCommit, never by calling `publish_completion`
themselves.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from typing import Any

import pyarrow as pa
from deltalake import write_deltalake

from gem.config import GemConfig
from gem.data.delta_log import read_table as read_logged_table
from gem.lakehouse import landing, stages
from gem.lakehouse.tables import (
    commit_properties,
    days_value,
    delta_table,
    ensure_table,
    predicate,
    require_writer,
    table_exists,
    table_path,
)
from schemas.ops import COMPLETIONS


class MissingInputError(RuntimeError):
    """An input partition a stage needs has not been completed by its producer."""


class StaleInputError(MissingInputError):
    """An input partition changed after the record a reader relies on (e.g. rewritten after its
    validation); the message names the stage to rerun."""


# --------------------------------------------------------------------------------------------------
# Completion records: written last by a stage; the only signal downstream readers trust.


def new_run_id(stage: str, ds: str) -> str:
    return f"{stage}:{ds}:{uuid.uuid4().hex[:12]}"


# The records live in a small Delta table read and written with `deltalake`: a check or a publish
# costs milliseconds and no Spark job, and stages without a JVM (training) publish the same way.


def clear_completion(cfg: GemConfig, stage: str, ds: str) -> None:
    """Withdraw a (stage, ds) record before rewriting its outputs, so a crash mid-rerun leaves none."""
    clear_completions(cfg, stage, [ds])


def clear_completions(cfg: GemConfig, stage: str, days: Sequence[str],
                      known: Mapping[tuple[str, str], Any] | None = None) -> None:
    """Withdraw the records of `stage` for `days` (sorted) in one commit; none when no day has one
    (`known`: every record, when the caller has read them; else they are looked up)."""
    # A read is far cheaper than a no-op DELETE commit.
    if known is not None:
        held = any((stage, d) in known for d in days)
    else:
        held = any(completion(cfg, stage, d) is not None for d in days)
    if held:
        delta_table(table_path(cfg, COMPLETIONS)).delete(_completions_where(stage, days))


def _completions_where(stage: str, days: Sequence[str]) -> str:
    return predicate({"stage": stage, "ds": days_value(days)})


def completion_row(
    stage: str,
    ds: str,
    run_id: str,
    rows_in: int | None,
    rows_written: int,
    quarantined_by_reason: Mapping[str, int],
    table_versions: Mapping[str, int],
    input_versions: Mapping[str, int] | None = None,
    reconciliation: str = "checked",
    table_fingerprints: Mapping[str, str] | None = None,
    input_fingerprints: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The (stage, ds) record as a row of the completions table; RuntimeError when rows_in is given
    and does not reconcile (rows_in None means the stage has no separate input count:
    `reconciliation` says why)."""
    rows_quarantined = int(sum(quarantined_by_reason.values()))
    if rows_in is not None and rows_in != rows_written + rows_quarantined:
        raise RuntimeError(
            f"{stage} ds={ds}: counts do not reconcile: in={rows_in} != written={rows_written} "
            f"+ quarantined={rows_quarantined} ({dict(quarantined_by_reason)})"
        )
    return {
        "stage": stage,
        "ds": dt.date.fromisoformat(ds),
        "run_id": run_id,
        "rows_in": None if rows_in is None else int(rows_in),
        "rows_written": int(rows_written),
        "rows_quarantined": rows_quarantined,
        "quarantined_by_reason": sorted((k, int(v)) for k, v in quarantined_by_reason.items()),
        "table_versions": sorted((k, int(v)) for k, v in table_versions.items()),
        "input_versions": sorted((k, int(v)) for k, v in (input_versions or {}).items()),
        "reconciliation": reconciliation,
        "completed_at": dt.datetime.now(dt.UTC),
        "table_fingerprints": sorted((table_fingerprints or {}).items()),
        "input_fingerprints": sorted((input_fingerprints or {}).items()),
    }


MAP_COLUMNS = ("quarantined_by_reason", "table_versions", "input_versions", "table_fingerprints", "input_fingerprints")


def as_record(row: Mapping[str, Any]) -> dict[str, Any]:
    """A completions row as a record: its map columns as dicts (Arrow gives maps as (key, value)
    pairs; a record written before a map column existed has none: an empty dict)."""
    return dict(row) | {key: dict(row.get(key) or []) for key in MAP_COLUMNS}


def publish_rows(cfg: GemConfig, stage: str, run_id: str, rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Write `completion_row`s of `stage` (days ascending) in one commit, replacing any earlier
    records of those days; -> the records as `completion` returns them."""
    require_writer(COMPLETIONS, "deltalake")
    days = [row["ds"].isoformat() for row in rows]
    path = ensure_table(None, cfg, COMPLETIONS)
    table = pa.Table.from_pylist(list(rows), schema=COMPLETIONS.arrow_schema())
    write_deltalake(delta_table(path), table, mode="overwrite", predicate=_completions_where(stage, days),
                    partition_by=list(COMPLETIONS.partition_by), commit_properties=commit_properties(run_id))
    return [as_record(row) | {"ds": day} for day, row in zip(days, rows, strict=True)]


def publish_completion(cfg: GemConfig, stage: str, ds: str, run_id: str, *counts: Any, **versions: Any) -> dict[str, Any]:
    """Write the (stage, ds) record in one commit (replacing any earlier one); -> the record. The
    counts and versions are `completion_row`'s (rows_in, rows_written, quarantined_by_reason,
    table_versions, input_versions, reconciliation, and the fingerprints). Stages publish through
    gem.lakehouse.commit.StageCommit, which fills in the versions and the reconciliation (several
    days' records at once: `publish_rows`)."""
    return publish_rows(cfg, stage, run_id, [completion_row(stage, ds, run_id, *counts, **versions)])[0]


def completion(cfg: GemConfig, stage: str, ds: str) -> dict[str, Any] | None:
    path = table_path(cfg, COMPLETIONS)
    if not table_exists(path):
        return None
    rows = read_logged_table(path, where={"stage": stage, "ds": ds}).to_pylist()
    if not rows:
        return None
    return as_record(rows[-1])


def require_stage_inputs(cfg: GemConfig, stage: str, ds: str,
                         made_here: AbstractSet[tuple[str, str]] = frozenset(),
                         known: Mapping[tuple[str, str], dict[str, Any]] | None = None,
                         ) -> dict[tuple[str, str], dict[str, Any]]:
    """The completion records the registry says `stage` needs for ds, by (stage, day); raises
    MissingInputError naming every missing one and the command to run first. A landing need
    (stages.LANDING) is met by the partition's `_SUCCESS` marker: its record names no versions and
    carries the producer's manifest. Needs in `made_here` (a range commit's own days) count as met
    and are not returned. `known`: every record by (stage, day), when the caller has read them all
    (gem.lakehouse.staleness.all_records); else each is read from the log."""
    found: dict[tuple[str, str], Any] = {}

    def completed(needed_stage: str, day: str) -> dict[str, Any] | None:
        if (needed_stage, day) in made_here:
            return {}
        if needed_stage == stages.LANDING:
            manifest = landing.completed_manifest(cfg.landing_root, day)
            record = None if manifest is None else {"stage": stages.LANDING, "ds": day, "table_versions": {},
                                                    "manifest": manifest}
        else:
            record = completion(cfg, needed_stage, day) if known is None else known.get((needed_stage, day))
        found[(needed_stage, day)] = record
        return record

    missing = stages.missing_inputs(stage, cfg, ds, completed)
    if missing:
        raise MissingInputError(stages.describe_missing(stage, ds, missing))
    return {key: record for key, record in found.items() if key not in made_here}


def require_completed(cfg: GemConfig, stage: str, ds: str) -> dict[str, Any]:
    record = completion(cfg, stage, ds)
    if record is None:
        raise MissingInputError(
            f"input not ready: stage {stage!r} has no completion record for ds={ds} in "
            f"{table_path(cfg, COMPLETIONS)}; run `python -m jobs.{stage} --ds {ds}` first"
        )
    return record

"""Which completion records still hold: done, stale or missing, per (stage, day).

A record names the versions it read, as `"{stage}:{table}@{day}"` -> version: the version the input
record (stage, day) named when the stage ran (gem.lakehouse.commit). It is stale when

- an input record it read is gone (withdrawn by a rerun that has not finished), or
- an input record now names another version of that table (its day was rewritten) with other
  rows: a record names the fingerprint of the rows it wrote (gem.lakehouse.fingerprint), and a
  rewrite whose fingerprint equals the one read leaves its readers valid, or
- an input record is itself stale,

so rewriting day D marks stale every later record that rested on it: the sequences and features of
later days, the compactions in them, the examples that read D, the mixtures and models that read
those. Readers (StageCommit.begin) refuse a stale input and name the record to rerun first; the
listing (`python -m jobs.status`) shows every (stage, day).

All of it from one read of `_ops.completions` (deltalake, no Spark).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gem.data.delta_log import read_table
from gem.lakehouse import completions, stages, tables
from schemas.ops import COMPLETIONS

if TYPE_CHECKING:
    from gem.config import GemConfig

DONE, STALE, MISSING = "done", "stale", "missing"

Key = tuple[str, str]  # (stage, day)


@dataclass(frozen=True)
class Status:
    stage: str
    day: str
    state: str  # DONE | STALE | MISSING
    why: str = ""  # for STALE: what changed, e.g. "validate_events ds=2026-01-03 now names bronze.ad_events v9 (read v4)"
    rerun_first: Key | None = None  # the upstream record to rerun first: the one whose own inputs still hold

    @property
    def record_exists(self) -> bool:
        return self.state != MISSING


def parse_input_key(key: str) -> tuple[str, str, str] | None:
    """"validate_events:bronze.ad_events@2026-01-03" -> (stage, table, day); None for a read outside
    any record (keyed by the table alone)."""
    if ":" not in key or "@" not in key:
        return None
    stage, rest = key.split(":", 1)
    table, day = rest.rsplit("@", 1)
    return stage, table, day


def all_records(cfg: GemConfig) -> dict[Key, dict[str, Any]]:
    """Every completion record, by (stage, day), in one read of the log."""
    path = tables.table_path(cfg, COMPLETIONS)
    if not tables.table_exists(path):
        return {}
    out = {}
    for row in read_table(path).to_pylist():
        out[(row["stage"], row["ds"].isoformat())] = completions.as_record(row)
    return out


class Ledger:
    """The records and their states, memoized (a chain of daily records is walked once)."""

    def __init__(self, records: dict[Key, dict[str, Any]]) -> None:
        self.records = records
        self._memo: dict[Key, Status] = {}

    def status(self, stage: str, day: str) -> Status:
        key = (stage, day)
        if key in self._memo:
            return self._memo[key]
        record = self.records.get(key)
        if record is None:
            result = Status(stage, day, MISSING)
        else:
            result = Status(stage, day, DONE)
            # Oldest inputs first: a chain of daily records is walked from its start, iteratively
            # deep (the memo holds the days before), not recursively from the newest day.
            for input_stage, table, input_day, version, read in self._inputs(record):
                found = self._stale_input(stage, day, input_stage, table, input_day, version, read)
                if found is not None:
                    result = found
                    break
        self._memo[key] = result
        return result

    def _inputs(self, record: dict[str, Any]) -> list[tuple[str, str, str, int, str | None]]:
        """(stage, table, day, version, fingerprint or None) of each input record's table read."""
        read = record["input_fingerprints"]
        parsed = [(*p, int(v), read.get(k)) for k, v in record["input_versions"].items() if (p := parse_input_key(k))]
        return sorted(parsed, key=lambda x: (x[2], x[0], x[1]))

    def _stale_input(self, stage: str, day: str, input_stage: str, table: str, input_day: str,
                     version: int, read: str | None) -> Status | None:
        current = self.records.get((input_stage, input_day))
        if current is None:
            return Status(stage, day, STALE, f"its input {input_stage} ds={input_day} has no record now",
                          (input_stage, input_day))
        now = current["table_versions"].get(table)
        same_rows = read is not None and current["table_fingerprints"].get(table) == read
        if now is None or (int(now) != version and not same_rows):
            return Status(stage, day, STALE, f"{input_stage} ds={input_day} now names {table} "
                                             f"v{now} (read v{version})", (stage, day))
        upstream = self.status(input_stage, input_day)
        if upstream.state == STALE:
            return Status(stage, day, STALE, f"its input {input_stage} ds={input_day} is stale: {upstream.why}",
                          upstream.rerun_first)
        return None

    def warm(self, keys: Iterable[Key]) -> None:
        """Compute states oldest day first, so deep chains never recurse far."""
        for stage, day in sorted(keys, key=lambda k: (k[1], k[0])):
            self.status(stage, day)


def require_fresh(cfg: GemConfig, stage_name: str, ds: str, inputs: list[Key]) -> None:
    """Raise StaleInputError when a needed record rests on data rewritten since it was made."""
    ledger = Ledger(all_records(cfg))
    ledger.warm(ledger.records)
    for s, d in inputs:
        status = ledger.status(s, d)
        if status.state == STALE:
            first = status.rerun_first or (s, d)
            raise completions.StaleInputError(
                f"{stage_name} ds={ds} needs {s} ds={d}, which is stale ({status.why}); rerun "
                f"`{stages.command(*first)}` first, then the stages after it")

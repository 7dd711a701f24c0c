"""A backfill's hold on the days after its range: a later run that reads a day being rewritten waits.

While `gem backfill --start A --end B` rewrites days A..B, a run of a later day D that reads one of
them (the registry's needs: build_sequences of D reads its own record of D-1, build_features the
counter window before D, mix its training days) could build on a day the backfill rewrites after
the read. Its record would then rest on replaced data (stale, gem.lakehouse.staleness), and retries
of the stages after it could never succeed, since Airflow does not rerun a task that succeeded
(e.g. a later day's build_features reads a day between two of the backfill's rewrites, and that
day's validate_silver then refuses on every retry). So the backfill holds its range for its
whole duration, and `StageCommit.begin` of such a run raises BackfillInProgressError before it
reads anything; the DAG's task turns that into a reschedule (gem.pipeline.airflow.orchestration.run_stage_task), so
the day waits without spending its retries and runs once the backfill has finished.

Limits, by design: a later run that read its inputs before the backfill began is not stopped (its
records go stale when the backfill rewrites what they read; `gem backfill` lists them with the one
command that reruns them), and a run of a day inside the range other than the backfill's own is not
held (the per-(stage, day) lease keeps two runs of one day from writing at once).

The hold is a lease file `{lakehouse}/_ops/backfills/{A}..{B}.json` (gem.lakehouse.lease, on the
local disk or an object store) whose `renewed_at` the backfill rewrites every RENEW_S seconds. A
backfill killed without releasing it stops holding at once on its own host (its pid is gone) and on
any other EXPIRY_S seconds after its last renewal.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from gem import storage
from gem.config import GemConfig
from gem.lakehouse import lease

EXPIRY_S = 120.0
RENEW_S = 15.0


class BackfillInProgressError(RuntimeError):
    """A run needs a day that an unfinished backfill is rewriting; run it again once that has finished."""


def holds_dir(cfg: GemConfig) -> str:
    return storage.join(cfg.lakehouse_uri, "_ops", "backfills")


def hold_path(cfg: GemConfig, start: str, end: str) -> str:
    return storage.join(holds_dir(cfg), f"{start}..{end}.json")


@contextmanager
def hold(cfg: GemConfig, start: str, end: str, run_id: str) -> Iterator[lease.Lease]:
    """Hold days start..end for the duration of the block (renewed in a background thread);
    LeaseHeldError naming the holder when a live backfill already holds this very range."""
    with lease.held(hold_path(cfg, start, end), run_id, f"backfill {start}..{end}", EXPIRY_S, RENEW_S) as held:
        yield held


def live_holds(cfg: GemConfig) -> list[tuple[str, str, dict]]:
    """(first day, last day, holder) of every live backfill hold, oldest range first."""
    holds = []
    for uri in storage.listdir(holds_dir(cfg)):
        file_name = storage.name(uri)
        start, dots, end = file_name.removesuffix(".json").partition("..")
        if file_name.startswith(".") or not file_name.endswith(".json") or not dots:
            continue  # not a hold (a temporary file of a write in progress)
        holder = lease.live_holder(uri, EXPIRY_S, renewed=True)
        if holder is not None:
            holds.append((start, end, holder))
    return holds


def require_not_held(cfg: GemConfig, stage: str, ds: str, needed: Iterable[tuple[str, str]]) -> None:
    """Raise BackfillInProgressError when the run of (stage, ds) comes after a live backfill's range
    and reads a day inside it (`needed`: the (stage, day) records it reads)."""
    needed = list(needed)
    for start, end, holder in live_holds(cfg):
        if ds <= end:
            continue
        inside = [(s, d) for s, d in needed if start <= d <= end]
        if inside:
            what = ", ".join(f"{s} ds={d}" for s, d in inside[:3]) + (" ..." if len(inside) > 3 else "")
            raise BackfillInProgressError(
                f"{stage} ds={ds} reads {what}, which backfill {start}..{end} is rewriting ({holder['run_id']}, "
                f"pid {holder['pid']} on {holder['host']}, since {holder['started_at']}); it runs once that "
                "backfill has finished")

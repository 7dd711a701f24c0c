"""A backfill of the daily DAG through Airflow's own backfill (`airflow backfill create`), run to the end.

    gem backfill --start A --end B [--from-stage S] [--reprocess completed|failed|none]

What it does, in order:
1. The metadata DB is created or upgraded; a run whose logical date is one of the range's midnights
   but which processed another day (a manual run made before manual runs moved off midnight, see
   gem.pipeline.airflow.orchestration.manual_logical_date) is refused: Airflow would clear and rerun it as that date.
2. The range is held in the lakehouse (gem.lakehouse.backfill_hold) until the backfill ends: a run
   of a later day that reads a day of the range waits (its task is rescheduled) rather than build
   on a day the backfill may rewrite after it read it. A second backfill of the same range is refused.
3. The scheduler: the one already heartbeating into the DB if there is one (production, or a daily
   stack), else a local stack for the backfill's duration (gem.pipeline.airflow.scheduler, making no
   scheduled runs of its own), with its logs under $AIRFLOW_HOME/runs/backfill-A..B/.
4. The DAG is unpaused while the backfill runs (the scheduler runs no task of a paused DAG) and
   paused again afterwards if it was paused.
5. `airflow backfill create --max-active-runs 1`: one day at a time, in date order (the DAG's
   max_active_runs is 1 too, and depends_on_past holds each stateful stage until its previous day
   succeeded), with dag-run conf {"from_stage": S}: the tasks before S in the registry succeed
   without running (their records of the day stay as they are) and S onward rerun.
   Reprocess behaviour (Airflow's): `completed` (the default) reruns every day of the range, done or
   failed, which is what a backfill after a fix is for; `failed` reruns only days whose run failed
   or never ran; `none` only days that never ran.
6. Every task line is printed as it finishes (day, task, state, seconds), then each day's run state.
7. Later days: a rewritten day makes the records of later days that read it stale (the stage
   contract's lineage, gem.lakehouse.staleness). They are not rerun here; they are listed with what
   to rerun first, and `gem status` shows them too.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import time
import uuid
from collections.abc import Callable, Mapping
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from gem.config import GemConfig
from gem.days import day_range, shift_day
from gem.lakehouse.backfill_hold import hold
from gem.lakehouse.lease import LeaseHeldError
from gem.pipeline.airflow.orchestration import DAG_ID, FROM_STAGE_CONF
from gem.pipeline.airflow.runs import POLL_S, TaskLine, airflow, airflow_home, init_db, run_task_lines
from gem.pipeline.airflow.scheduler import dag_parsed, scheduler_alive, scheduler_stack

REPROCESS_BEHAVIOURS = ("completed", "failed", "none")
PARSE_TIMEOUT_S = 300.0
RUN_STATES_DONE = ("success", "failed")


class BackfillError(RuntimeError):
    """The backfill could not be created or its scheduler stopped before it finished."""


@dataclass
class BackfillResult:
    backfill_id: int
    runs: dict[str, str] = field(default_factory=dict)  # ds -> the run's final state
    not_run: dict[str, str] = field(default_factory=dict)  # ds -> why Airflow made no run (e.g. already exists)
    stale_later: list[str] = field(default_factory=list)  # later days' stale records, with what to rerun

    @property
    def ok(self) -> bool:
        return all(state == "success" for state in self.runs.values())


def conflicting_manual_runs(db: Path, start: str, end: str, dag_id: str = DAG_ID) -> list[str]:
    """Runs whose logical date is a midnight of start..end but whose data interval starts on another
    day: `airflow backfill create` would clear and rerun them as that date, processing the wrong day."""
    if not db.is_file():
        return []
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT run_id, substr(logical_date, 1, 19), substr(data_interval_start, 1, 10) FROM dag_run "
            "WHERE dag_id = ? AND substr(logical_date, 1, 10) BETWEEN ? AND ?", (dag_id, start, end)).fetchall()
    return [f"{run_id} (logical date {logical}, processed ds={ds})" for run_id, logical, ds in rows
            if logical[11:] == "00:00:00" and ds != logical[:10]]


def _paused(db: Path, dag_id: str) -> bool:
    with sqlite3.connect(db) as conn:
        row = conn.execute("SELECT is_paused FROM dag WHERE dag_id = ?", (dag_id,)).fetchone()
    return bool(row and row[0])


def _backfill_runs(db: Path, backfill_id: int) -> tuple[list[tuple[str, str, str]], dict[str, str], bool]:
    """([(ds, run_id, state)] of the runs the backfill made or cleared, {day: reason} of those it did
    not, whether Airflow marked the backfill completed)."""
    with sqlite3.connect(db) as conn:
        runs = conn.execute(
            "SELECT substr(r.data_interval_start, 1, 10), r.run_id, r.state FROM backfill_dag_run b "
            "JOIN dag_run r ON r.id = b.dag_run_id WHERE b.backfill_id = ? ORDER BY b.sort_ordinal",
            (backfill_id,)).fetchall()
        skipped = conn.execute(
            "SELECT substr(logical_date, 1, 10), exception_reason FROM backfill_dag_run "
            "WHERE backfill_id = ? AND dag_run_id IS NULL", (backfill_id,)).fetchall()
        done = conn.execute("SELECT completed_at FROM backfill WHERE id = ?", (backfill_id,)).fetchone()
    return runs, dict(skipped), bool(done and done[0])


def _newest_backfill(db: Path, dag_id: str) -> int:
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT coalesce(max(id), 0) FROM backfill WHERE dag_id = ?", (dag_id,)).fetchone()[0]


def _wait_until_parsed(db: Path, dag_id: str, procs: list[subprocess.Popen[bytes]], logs: Path) -> None:
    deadline = time.monotonic() + PARSE_TIMEOUT_S
    while not dag_parsed(db, dag_id):
        if any(p.poll() is not None for p in procs):
            raise BackfillError(f"the Airflow stack stopped before {dag_id} was parsed; see the logs in {logs}")
        if time.monotonic() > deadline:
            raise BackfillError(f"{dag_id} not parsed within {PARSE_TIMEOUT_S:.0f}s; see {logs / 'dag-processor.log'}")
        time.sleep(POLL_S)


def backfill(start: str, end: str, env: Mapping[str, str], *, reprocess: str = "completed",
             from_stage: str | None = None, on_task: Callable[[TaskLine], None] = print,
             later_stale: Callable[[str], list[str]] | None = None, dag_id: str = DAG_ID,
             cfg: GemConfig | None = None) -> BackfillResult:
    """Backfill run days start..end (see the module docstring). `env`: the Airflow environment
    (gem.pipeline.airflow.runs.airflow_env); `later_stale(end)`: the stale records of days after end (the
    `gem` command passes the stage contract's); `cfg`: the lakehouse whose later days wait while
    the backfill runs (step 2); -> the runs' states and what is left stale."""
    if reprocess not in REPROCESS_BEHAVIOURS:
        raise ValueError(f"reprocess must be one of {REPROCESS_BEHAVIOURS}, got {reprocess!r}")
    if end < start:
        raise ValueError(f"--end {end} is before --start {start}")
    env = dict(env)
    home = airflow_home(env)
    db = home / "airflow.db"
    logs = home / "runs" / f"backfill-{start}..{end}"
    init_db(env)
    conflicts = conflicting_manual_runs(db, start, end, dag_id)
    if conflicts:
        raise BackfillError(
            "Airflow would rerun these runs under the range's dates, though they processed other days: "
            + "; ".join(conflicts) + f". Delete them first: `airflow dags delete {dag_id}` drops the DAG's run history "
            "(the lakehouse keeps its data and records).")
    own_stack = not scheduler_alive(db)
    with ExitStack() as running:
        if cfg is not None:
            try:
                running.enter_context(hold(cfg, start, end, f"backfill-{start}..{end}-{uuid.uuid4().hex[:8]}"))
            except LeaseHeldError as e:
                raise BackfillError(f"another backfill of the same days is running: {e}") from None
        procs = running.enter_context(scheduler_stack(env, logs) if own_stack else nullcontext([]))
        _wait_until_parsed(db, dag_id, procs, logs)
        was_paused = _paused(db, dag_id)
        airflow(f"airflow dags unpause {dag_id} > /dev/null", env)
        try:
            conf = json.dumps({FROM_STAGE_CONF: from_stage or ""})
            created = airflow(
                f"airflow backfill create --dag-id {dag_id} --from-date {start} --to-date {end} "
                f"--max-active-runs 1 --reprocess-behavior {reprocess} --dag-run-conf '{conf}'",
                env, capture=True, check=False)
            backfill_id = _newest_backfill(db, dag_id)
            if created.returncode != 0 or not backfill_id:
                raise BackfillError(f"`airflow backfill create` failed (exit {created.returncode}): "
                                    f"{(created.stdout + created.stderr)[-2000:]}")
            result = _follow(db, backfill_id, procs, logs, on_task, dag_id)
        finally:
            if was_paused:
                airflow(f"airflow dags pause {dag_id} > /dev/null", env, check=False)
    if later_stale is not None:
        result.stale_later = later_stale(end)
    return result


def _follow(db: Path, backfill_id: int, procs: list[subprocess.Popen[bytes]], logs: Path,
            on_task: Callable[[TaskLine], None], dag_id: str) -> BackfillResult:
    """Print each task as it finishes until Airflow marks the backfill completed."""
    reported: set[tuple[str, str]] = set()
    while True:
        runs, not_run, completed = _backfill_runs(db, backfill_id)
        for ds, run_id, _ in runs:
            for line in run_task_lines(db, dag_id, run_id, ds):
                if (run_id, line.task) not in reported:
                    reported.add((run_id, line.task))
                    on_task(line)
        if completed and all(state in RUN_STATES_DONE for *_, state in runs):
            return BackfillResult(backfill_id, {ds: state for ds, _, state in runs}, not_run)
        if any(p.poll() is not None for p in procs):
            raise BackfillError(f"the Airflow stack stopped during backfill {backfill_id}; see the logs in {logs}")
        time.sleep(POLL_S)


def later_days(start_after: str, newest: str | None) -> list[str]:
    """The days after `start_after` through `newest` (none when newest is not later)."""
    if newest is None or newest <= start_after:
        return []
    return day_range(shift_day(start_after, 1), newest)


"""A backfill of the daily DAG through Airflow's own backfill (`airflow backfill create`), run to the end.

    gem backfill --start A --end B [--from-stage S] [--reprocess completed|failed|none]

What it does, in order (Airflow's state is read and changed through its REST API,
gem.pipeline.airflow.api: the server configured, else one started for the backfill):
1. The metadata DB is created or upgraded, and the range is held in the lakehouse
   (gem.lakehouse.backfill_hold) until the backfill ends: a run of a later day that reads a day of
   the range waits (its task is rescheduled) rather than build on a day the backfill may rewrite
   after it read it. A second backfill of the same range is refused.
2. A run whose logical date is one of the range's midnights but which processed another day (a
   manual run made before manual runs moved off midnight, see
   gem.pipeline.airflow.orchestration.manual_logical_date) is refused: Airflow would clear and rerun it as that date.
3. The scheduler: the one already heartbeating into the DB if there is one (production, or a daily
   stack), else a local stack for the backfill's duration (gem.pipeline.airflow.scheduler, making no
   scheduled runs of its own, reporting to the API server started for the backfill when there is
   one), with its logs under $AIRFLOW_HOME/runs/backfill-A..B/.
4. The DAG is unpaused while the backfill runs (the scheduler runs no task of a paused DAG) and
   paused again afterwards if it was paused.
5. Airflow's backfill (POST /api/v2/backfills) with max_active_runs 1: one day at a time, in date
   order (the DAG's max_active_runs is 1 too, and depends_on_past holds each stateful stage until
   its previous day succeeded), with dag-run conf {"from_stage": S}: the tasks before S in the
   registry succeed without running (their records of the day stay as they are) and S onward rerun.
   Reprocess behaviour (Airflow's; its dry run says which days will run): `completed` (the default)
   reruns every day of the range, done or failed, which is what a backfill after a fix is for;
   `failed` reruns only days whose run failed or never ran; `none` only days that never ran.
6. Every task line is printed as it finishes (day, task, state, seconds), then each day's run state.
7. Later days: a rewritten day makes the records of later days that read it stale (the stage
   contract's lineage, gem.lakehouse.staleness). They are not rerun here; they are listed with what
   to rerun first, and `gem status` shows them too.
"""

from __future__ import annotations

import datetime as dt
import subprocess
import time
import uuid
from collections.abc import Callable, Mapping
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

from airflow_client.client.exceptions import ApiException

from gem.config import GemConfig
from gem.days import day_range, shift_day
from gem.lakehouse.backfill_hold import hold
from gem.lakehouse.lease import LeaseHeldError
from gem.pipeline.airflow.api import AirflowApi, Run, airflow_api, api_error, midnight
from gem.pipeline.airflow.orchestration import DAG_ID, FROM_STAGE_CONF
from gem.pipeline.airflow.runs import POLL_S, TaskLine, airflow_home, init_db, run_task_lines
from gem.pipeline.airflow.scheduler import scheduler_stack

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


def conflicting_manual_runs(runs: list[Run], start: str, end: str) -> list[str]:
    """Of `runs`, those whose logical date is a midnight of start..end but whose data interval starts
    on another day: Airflow's backfill would clear and rerun them as that date, processing the wrong day."""
    found = []
    for run in runs:
        if run.logical_date is None:
            continue
        day, time_of_day = run.logical_date.astimezone(dt.UTC).strftime("%Y-%m-%d %H:%M:%S").split()
        if start <= day <= end and time_of_day == "00:00:00" and run.ds != day:
            found.append(f"{run.run_id} (logical date {day} {time_of_day}, processed ds={run.ds})")
    return found


def not_run_reason(existing: Run | None) -> str:
    """Why Airflow's backfill makes no run of a day (its dry run left the day out): the day's run
    exists and is still going, or exists and the reprocess behaviour keeps it."""
    if existing is None:
        return "no run made (unknown reason)"
    why = "in flight" if existing.state not in RUN_STATES_DONE else "already exists"
    return f"{why} (run {existing.run_id}, {existing.state})"


def _wait_until_parsed(api: AirflowApi, dag_id: str, procs: list[subprocess.Popen[bytes]], logs: Path) -> None:
    deadline = time.monotonic() + PARSE_TIMEOUT_S
    while not api.dag_parsed(dag_id):
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
    the backfill runs (step 1); -> the runs' states and what is left stale."""
    if reprocess not in REPROCESS_BEHAVIOURS:
        raise ValueError(f"reprocess must be one of {REPROCESS_BEHAVIOURS}, got {reprocess!r}")
    if end < start:
        raise ValueError(f"--end {end} is before --start {start}")
    env = dict(env)
    logs = airflow_home(env) / "runs" / f"backfill-{start}..{end}"
    init_db(env)
    with ExitStack() as running:
        api = running.enter_context(airflow_api(env, logs / "api-server.log"))  # starting while the hold is taken
        if cfg is not None:
            try:
                running.enter_context(hold(cfg, start, end, f"backfill-{start}..{end}-{uuid.uuid4().hex[:8]}"))
            except LeaseHeldError as e:
                raise BackfillError(f"another backfill of the same days is running: {e}") from None
        in_range = api.runs(dag_id, logical_from=midnight(start),
                            logical_to=midnight(shift_day(end, 1)) - dt.timedelta(microseconds=1))
        conflicts = conflicting_manual_runs(in_range, start, end)
        if conflicts:
            raise BackfillError(
                "Airflow would rerun these runs under the range's dates, though they processed other days: "
                + "; ".join(conflicts) + f". Delete them first: `airflow dags delete {dag_id}` drops the DAG's run "
                "history (the lakehouse keeps its data and records).")
        own_stack = not api.scheduler_healthy()
        api_port = api.server.port if api.server is not None else None
        procs = running.enter_context(scheduler_stack(env, logs, api_port=api_port) if own_stack else nullcontext([]))
        _wait_until_parsed(api, dag_id, procs, logs)
        was_paused = api.paused(dag_id)
        api.set_paused(dag_id, False)
        try:
            try:
                days = api.backfill_days(dag_id, start, end, reprocess)
                backfill_id = api.create_backfill(dag_id, start, end, reprocess, max_active_runs=1,
                                                  conf={FROM_STAGE_CONF: from_stage or ""})
            except ApiException as e:
                raise BackfillError(f"Airflow refused the backfill of {dag_id} {start}..{end}: {api_error(e)}") from None
            at_midnight = {r.logical_date: r for r in in_range}  # the runs Airflow's backfill finds per day
            not_run = {ds: not_run_reason(at_midnight.get(midnight(ds))) for ds in day_range(start, end) if ds not in days}
            result = _follow(api, backfill_id, start, end, days, not_run, procs, logs, on_task, dag_id)
        finally:
            if was_paused:
                api.set_paused(dag_id, True)
    if later_stale is not None:
        result.stale_later = later_stale(end)
    return result


def _follow(api: AirflowApi, backfill_id: int, start: str, end: str, days: list[str], not_run: dict[str, str],
            procs: list[subprocess.Popen[bytes]], logs: Path, on_task: Callable[[TaskLine], None],
            dag_id: str) -> BackfillResult:
    """Print each task of the backfill's runs (of `days`) as it finishes until Airflow marks the
    backfill completed."""
    reported: set[tuple[str, str]] = set()
    while True:
        completed = api.backfill_completed(backfill_id)  # before the runs: a run read after it is final then
        runs = {ds: run for ds, run in api.backfill_runs(dag_id, start, end).items() if ds in days}
        for ds, run in sorted(runs.items()):
            for line in run_task_lines(api, dag_id, run.run_id, ds):
                if (run.run_id, line.task) not in reported:
                    reported.add((run.run_id, line.task))
                    on_task(line)
        if completed and all(run.state in RUN_STATES_DONE for run in runs.values()):
            missing = {ds: "no run made (the backfill skipped it)" for ds in days if ds not in runs}
            return BackfillResult(backfill_id, {ds: run.state for ds, run in sorted(runs.items())}, not_run | missing)
        if any(p.poll() is not None for p in procs):
            raise BackfillError(f"the Airflow stack stopped during backfill {backfill_id}; see the logs in {logs}")
        time.sleep(POLL_S)


def later_days(start_after: str, newest: str | None) -> list[str]:
    """The days after `start_after` through `newest` (none when newest is not later)."""
    if newest is None or newest <= start_after:
        return []
    return day_range(shift_day(start_after, 1), newest)


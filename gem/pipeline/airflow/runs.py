"""Running the daily DAG through Airflow from Python: its environment, its metadata DB, one day.

`make demo` (gem.pipeline.demo) and the `gem` command (gem.pipeline.command) go through here. Airflow itself runs as
a subprocess with infra/airflow/airflow_env.sh sourced ($AIRFLOW_HOME, the metadata DB, dags/), and
the jobs its tasks launch find the pipeline's config through $GEM_CONFIG. What Airflow recorded
(runs, task instances) is read through its REST API (gem.pipeline.airflow.api), never from the DB.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from gem.config import REPO_ROOT, GemConfig
from gem.environment import CONFIG_FILE_ENV
from gem.pipeline.airflow.api import AirflowApi, TaskRun, airflow_api, airflow_home
from gem.pipeline.airflow.orchestration import DAG_ID, DAG_START_ENV, manual_logical_date
from gem.pipeline.services import stop_group

# Task states after which a task of a run does not change any more.
FINISHED_STATES = ("success", "failed", "skipped", "upstream_failed", "removed")
POLL_S = 2.0
STOP_TIMEOUT_S = 20.0


@dataclass(frozen=True)
class TaskLine:
    """One finished task of a run, as `make demo` and `gem run` print it."""

    ds: str
    task: str
    state: str
    seconds: float

    def __str__(self) -> str:
        return f"  {self.ds}  {self.task:<20} {self.state:<16} {self.seconds:>6.0f}s"


def finished_lines(tasks: Iterable[TaskRun], ds: str) -> list[TaskLine]:
    """The finished ones of a run's task instances (processing ds), in the order they ended."""
    done = sorted((t for t in tasks if t.state in FINISHED_STATES),
                  key=lambda t: (t.end is None, t.end or dt.datetime.min.replace(tzinfo=dt.UTC)))
    return [TaskLine(ds, t.task_id, t.state or "", t.seconds) for t in done]


def run_task_lines(api: AirflowApi, dag_id: str, run_id: str, ds: str) -> list[TaskLine]:
    """The finished tasks of one run (processing ds), in the order they ended."""
    return finished_lines(api.task_runs(dag_id, run_id), ds)


def airflow_env(cfg: GemConfig, cfg_path: str | os.PathLike[str] | None) -> dict[str, str]:
    """This process's environment for Airflow and its tasks: $GEM_CONFIG (absolute, when a config
    file is given), the DAG's start date at the config's start_ds (a history before the default one
    gets task instances), and this interpreter's bin/ first on PATH (the `airflow` it installed)."""
    env = dict(os.environ)
    if cfg_path is not None:
        env[CONFIG_FILE_ENV] = str(Path(cfg_path).resolve())
    env[DAG_START_ENV] = cfg.start_ds
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    return env


def airflow(cmd: str, env: dict[str, str], capture: bool = False, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a shell command with infra/airflow/airflow_env.sh sourced, from the repo root."""
    script = f". infra/airflow/airflow_env.sh && {cmd}"
    return subprocess.run(["bash", "-c", script], cwd=REPO_ROOT, env=env, check=check, text=True,
                          capture_output=capture)


def init_db(env: dict[str, str]) -> None:
    """Create or upgrade the metadata DB and the gpu pool (infra/airflow/init_db.sh; idempotent)."""
    airflow("bash infra/airflow/init_db.sh >/dev/null", env)


def run_day(ds: str, env: dict[str, str], log: Path, on_task: Callable[[TaskLine], None] = print,
            dag_id: str = DAG_ID, api: AirflowApi | None = None) -> bool:
    """One DAG run processing ds (`airflow dags test DAG ds+1`; gem/pipeline/airflow/orchestration.py says why +1);
    True when the run succeeded. Airflow's log, with the jobs' (Spark's) output in it, goes to `log`;
    `on_task` gets each task as it finishes, read through Airflow's API (`api`, else one opened here,
    its server starting while the run does)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with ExitStack() as opened:
        if api is None:
            api = opened.enter_context(airflow_api(env, api_server_log(log)))
        reporter = TaskReporter(api, ds, now(), on_task, dag_id)
        with open(log, "w") as out:
            # Its own session: when this function ends early (the API failing, an interrupt), the
            # run and the jobs it started are stopped with it.
            proc = subprocess.Popen(
                ["bash", "-c", f". infra/airflow/airflow_env.sh && airflow dags test {dag_id} {manual_logical_date(ds)}"],
                cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            while proc.poll() is None:
                time.sleep(POLL_S)
                reporter.report()
        finally:
            if proc.poll() is None:
                stop_group(proc, STOP_TIMEOUT_S)
        reporter.report(wait=True)
    return proc.returncode == 0


def now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


@dataclass
class TaskReporter:
    """Hands each task of the newest run of ds made at or after `since` to `on_task` once, as it
    finishes (`report()` polls Airflow's API); `tasks` holds that run's task instances as last read."""

    api: AirflowApi
    ds: str
    since: dt.datetime
    on_task: Callable[[TaskLine], None]
    dag_id: str = DAG_ID
    run_id: str | None = None
    tasks: list[TaskRun] = field(default_factory=list)
    reported: set[str] = field(default_factory=set)

    def report(self, wait: bool = False) -> None:
        """Read the run's task instances and hand on the newly finished ones. While the API server is
        still starting this returns at once, unless `wait` (the last report of a run)."""
        if not wait and not self.api.ready():
            return
        if self.run_id is None:
            run = self.api.newest_run(self.dag_id, self.ds, since=self.since)
            if run is None:
                return
            self.run_id = run.run_id
        self.tasks = self.api.task_runs(self.dag_id, self.run_id)
        for line in finished_lines(self.tasks, self.ds):
            if line.task not in self.reported:
                self.reported.add(line.task)
                self.on_task(line)


def run_log(env: Mapping[str, str], ds: str, dag_id: str = DAG_ID) -> Path:
    """Where run_day writes the log of the run of ds: $AIRFLOW_HOME/runs/<dag>-<ds>.log."""
    return airflow_home(env) / "runs" / f"{dag_id}-{ds}.log"


def api_server_log(log: Path) -> Path:
    """Where the output of an API server started for a run logging to `log` goes: beside it."""
    return log.with_name(f"{log.stem}.api-server.log")

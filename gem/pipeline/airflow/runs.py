"""Running the daily DAG through Airflow from Python: its environment, its metadata DB, one day.

`make demo` (gem.pipeline.demo) and the `gem` command (gem.pipeline.command) go through here. Airflow itself runs as
a subprocess with infra/airflow/airflow_env.sh sourced ($AIRFLOW_HOME, the SQLite DB, dags/), and
the jobs its tasks launch find the pipeline's config through $GEM_CONFIG.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gem.config import REPO_ROOT, GemConfig
from gem.environment import CONFIG_FILE_ENV
from gem.pipeline.airflow.orchestration import DAG_ID, DAG_START_ENV, manual_logical_date

# Task states after which a task of a run does not change any more.
FINISHED_STATES = ("success", "failed", "skipped", "upstream_failed", "removed")
POLL_S = 2.0


def airflow_home(environ: Mapping[str, str] | None = None) -> Path:
    """Where infra/airflow/airflow_env.sh puts Airflow's files: $AIRFLOW_HOME, else <repo>/.airflow."""
    environ = os.environ if environ is None else environ
    return Path(environ.get("AIRFLOW_HOME") or REPO_ROOT / ".airflow")


@dataclass(frozen=True)
class TaskLine:
    """One finished task of a run, as `make demo` and `gem run` print it."""

    ds: str
    task: str
    state: str
    seconds: float

    def __str__(self) -> str:
        return f"  {self.ds}  {self.task:<20} {self.state:<16} {self.seconds:>6.0f}s"


def newest_run_id(db: Path) -> int:
    """The id of the newest DAG run in the SQLite metadata DB (0 when there is none)."""
    if not db.is_file():
        return 0
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT coalesce(max(id), 0) FROM dag_run").fetchone()[0]


def finished_tasks(db: Path, ds: str, dag_id: str = DAG_ID, newer_than: int = 0) -> list[TaskLine]:
    """The finished tasks of the newest run of dag_id processing ds (among the runs with an id above
    `newer_than`), in the order they ended, from the SQLite metadata DB (the embedded default's)."""
    if not db.is_file():
        return []
    with sqlite3.connect(db) as conn:
        row = conn.execute("SELECT run_id FROM dag_run WHERE dag_id = ? AND id > ? "
                           "AND substr(data_interval_start, 1, 10) = ? ORDER BY id DESC LIMIT 1",
                           (dag_id, newer_than, ds)).fetchone()
    return run_task_lines(db, dag_id, row[0], ds) if row else []


def run_task_lines(db: Path, dag_id: str, run_id: str, ds: str) -> list[TaskLine]:
    """The finished tasks of one run (processing ds), in the order they ended."""
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT task_id, state, start_date, end_date FROM task_instance WHERE dag_id = ? AND run_id = ? "
            f"AND state IN ({', '.join('?' * len(FINISHED_STATES))}) ORDER BY end_date",
            (dag_id, run_id, *FINISHED_STATES),
        ).fetchall()
    return [TaskLine(ds, task, state, (dt.datetime.fromisoformat(end) - dt.datetime.fromisoformat(start)).total_seconds()
                     if start and end else 0.0) for task, state, start, end in rows]


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
            dag_id: str = DAG_ID) -> bool:
    """One DAG run processing ds (`airflow dags test DAG ds+1`; gem/pipeline/airflow/orchestration.py says why +1);
    True when the run succeeded. Airflow's log, with the jobs' (Spark's) output in it, goes to `log`;
    `on_task` gets each task as it finishes, read from the metadata DB."""
    log.parent.mkdir(parents=True, exist_ok=True)
    db = airflow_home(env) / "airflow.db"
    reporter = TaskReporter(db, ds, newest_run_id(db), on_task, dag_id)
    with open(log, "w") as out:
        proc = subprocess.Popen(
            ["bash", "-c", f". infra/airflow/airflow_env.sh && airflow dags test {dag_id} {manual_logical_date(ds)}"],
            cwd=REPO_ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, text=True)
        while proc.poll() is None:
            time.sleep(POLL_S)
            reporter.report()
    reporter.report()
    return proc.returncode == 0


@dataclass
class TaskReporter:
    """Hands each task of the run of ds that started after run id `before` to `on_task` once, as it
    finishes (`report()` polls the metadata DB)."""

    db: Path
    ds: str
    before: int
    on_task: Callable[[TaskLine], None]
    dag_id: str = DAG_ID
    reported: set[str] = field(default_factory=set)

    def report(self) -> None:
        for line in finished_tasks(self.db, self.ds, self.dag_id, newer_than=self.before):
            if line.task not in self.reported:
                self.reported.add(line.task)
                self.on_task(line)


def run_log(env: Mapping[str, str], ds: str, dag_id: str = DAG_ID) -> Path:
    """Where run_day writes the log of the run of ds: $AIRFLOW_HOME/runs/<dag>-<ds>.log."""
    return airflow_home(env) / "runs" / f"{dag_id}-{ds}.log"


def failed_runs(env: dict[str, str], dag_id: str = DAG_ID) -> list[dict[str, Any]]:
    """The DAG's failed runs, from Airflow's metadata DB (`airflow dags list-runs --state failed`)."""
    out = airflow(f"airflow dags list-runs {dag_id} --state failed -o json", env, capture=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"`airflow dags list-runs {dag_id}` failed (exit {out.returncode}): {out.stderr[-2000:]}")
    # The JSON list is the last line that parses; Airflow logs warnings to stdout before it.
    for line in reversed(out.stdout.splitlines()):
        if line.startswith("["):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return []

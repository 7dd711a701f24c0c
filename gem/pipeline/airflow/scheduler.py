"""Airflow's scheduler stack on this machine: the processes that run DAG runs the way production does.

`airflow dags test` (gem run, make demo) runs one DAG run's tasks in its own process. Anything the
scheduler has to drive (a backfill's runs, catchup of scheduled intervals) needs three more
processes against the same metadata DB, started here with infra/airflow/airflow_env.sh sourced:

    api-server --apps execution    the execution API the task processes report to
    dag-processor                  parses dags/ into the DB (the scheduler reads DAGs only from there)
    scheduler                      LocalExecutor: each task in its own process, `parallelism` at once

Each runs in its own session, so stopping it takes its workers and their Spark JVMs along. With
`scheduled_runs=False` the scheduler makes no runs of its own from the DAGs' schedules
([scheduler] use_job_schedule): it only runs what it is given (a backfill's runs, triggered runs),
so starting it for a backfill never starts today's run as a side effect. With `api_port`, the
stack's processes report to the API server already serving on that loopback port (one that
gem.pipeline.airflow.api started, with the execution app) instead of starting one of their own.

Whether some scheduler already heartbeats into the DB (a production stack or another backfill) is
Airflow's API's to say (gem.pipeline.airflow.api.AirflowApi.scheduler_healthy); callers then use
that one instead of starting a second.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from gem.config import REPO_ROOT

PROCESSES = (
    ("api-server", "airflow api-server --apps execution --workers 1 --port $AIRFLOW__API__PORT"),
    ("dag-processor", "airflow dag-processor"),
    ("scheduler", "airflow scheduler"),
)
STOP_GRACE_S = 60.0


def stack_env(env: Mapping[str, str], scheduled_runs: bool, parallelism: int = 2) -> dict[str, str]:
    """`env` plus the stack's settings: LocalExecutor with `parallelism` task processes, the DAG
    processor and scheduler polling every few seconds (local runs are short), and time for a task's
    first API call to wait on SQLite's lock (three processes share the file)."""
    return dict(env) | {
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": str(parallelism),
        "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": str(scheduled_runs),
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "5",
        "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "2",
        "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "120",
    }


@contextmanager
def scheduler_stack(env: Mapping[str, str], logs: Path, scheduled_runs: bool = False, parallelism: int = 2,
                    dags_folder: Path | None = None, api_port: int | None = None) -> Iterator[list[subprocess.Popen[bytes]]]:
    """The processes of PROCESSES, each logging to logs/<name>.log, stopped on exit (SIGTERM to its
    session, SIGKILL after STOP_GRACE_S); with `api_port`, all but the API server, reporting to the
    one on that port. `env` is an Airflow environment (gem.pipeline.airflow.runs.airflow_env or a
    test's); the metadata DB must exist (gem.pipeline.airflow.runs.init_db). `dags_folder` replaces
    dags/ (a test's copy of the DAG)."""
    logs.mkdir(parents=True, exist_ok=True)
    settings = stack_env(env, scheduled_runs, parallelism)
    processes = PROCESSES
    if api_port is not None:  # airflow_env.sh derives the execution API's URL from it
        settings["GEM_AIRFLOW_PORT"] = str(api_port)
        processes = tuple(p for p in PROCESSES if p[0] != "api-server")
    setup = ". infra/airflow/airflow_env.sh && "
    if dags_folder is not None:  # after sourcing: airflow_env.sh points Airflow at dags/
        setup += f"export AIRFLOW__CORE__DAGS_FOLDER={shlex.quote(str(dags_folder))} && "
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for name, command in processes:
            with open(logs / f"{name}.log", "w") as log:
                procs.append(subprocess.Popen(
                    ["bash", "-c", f"{setup}exec {command}"], cwd=REPO_ROOT,
                    env=settings, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        yield procs
    finally:
        stop(procs)


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each process's session, then SIGKILL what is still up after STOP_GRACE_S."""
    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()

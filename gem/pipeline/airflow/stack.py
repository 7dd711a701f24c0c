"""Airflow as a small cluster on this machine: the CeleryExecutor on a Redis broker, the metadata DB on
Postgres, each Airflow process in its own process group.

    api-server        the REST API and the execution API the task processes report to
    dag-processor     parses dags/ into the metadata DB
    scheduler         CeleryExecutor: queues each task on the broker's `default` queue
    worker-1..N       `airflow celery worker`: takes tasks off the queue, `worker_concurrency` at a time

Every process sources infra/airflow/airflow_env.sh (as gem.pipeline.airflow.scheduler's stack does)
on the environment `AirflowCluster.environment()` gives it: the metadata DB URL, the broker, the
executor, the API server's port and URL (so `gem backfill` and gem.pipeline.airflow.api's clients
given that environment use this cluster's server and scheduler instead of starting their own).
Each worker has its own hostname, the one its task instances record (Airflow's
`[core] hostname_callable` is `worker_hostname`, which reads WORKER_HOSTNAME_ENV), and its own
log-server port; task logs go to the shared $AIRFLOW_HOME/logs, where the API server
reads them. The Celery results go to another database of the same Redis, so the workers need no
metadata DB connection of their own. Celery's configuration is gem.pipeline.airflow.celery_worker's
(Airflow's, with pool processes whose tasks may start child processes).

Readiness: the API server's health endpoint answers and reports the metadata DB, the scheduler and
the DAG processor healthy; each worker answers a Celery ping. `kill_worker(i)` SIGKILLs a worker and
every process under it (the task processes Airflow puts in process groups of their own, their Spark
JVMs): a node lost mid-task. `restart(name)` stops one process and starts it again (a supervisor's
restart). `stop()` stops everything it started, scheduler first.

`local_airflow` starts the whole of it on this machine: PostgreSQL and Redis (gem.pipeline.services,
each in a folder of its own on a free loopback port), then the cluster on them.

`unpause`, `trigger_day`, `wait_for_run` and `task_tries` are what a caller of the cluster's REST
API needs beyond gem.pipeline.airflow.api: the DAG unpaused once parsed, a manual run of one day, its
end, and every try of a task with the host it ran on.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shlex
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import psutil
from airflow_client.client.api.dag_run_api import DagRunApi
from airflow_client.client.api.task_instance_api import TaskInstanceApi
from airflow_client.client.models.trigger_dag_run_post_body import TriggerDAGRunPostBody
from celery import Celery

from gem.config import REPO_ROOT
from gem.days import shift_day
from gem.environment import API_URL_ENV
from gem.pipeline.airflow.api import REQUEST_TIMEOUT_S, AirflowApi, ApiServer, Run, TaskRun, midnight
from gem.pipeline.airflow.backfill import PARSE_TIMEOUT_S, RUN_STATES_DONE
from gem.pipeline.airflow.orchestration import DAG_ID, manual_logical_date
from gem.pipeline.airflow.runs import POLL_S, init_db
from gem.pipeline.airflow.scheduler import stack_env
from gem.pipeline.services import PostgresServer, RedisServer, ServiceStartError, free_port, stop_group

# The variable a worker's processes read their hostname from (`worker_hostname`).
WORKER_HOSTNAME_ENV = "GEM_WORKER_HOSTNAME"
HOSTNAME_CALLABLE = "gem.pipeline.airflow.stack.worker_hostname"
# Celery's configuration (`[celery] celery_config_options`); imported only by Airflow's processes,
# since importing it builds Airflow's Celery settings from the environment.
CELERY_CONFIG_PATH = "gem.pipeline.airflow.celery_worker.CELERY_CONFIG"
API_SERVER = "api-server"
DAG_PROCESSOR = "dag-processor"
SCHEDULER = "scheduler"
COMMANDS = {
    DAG_PROCESSOR: "airflow dag-processor",
    SCHEDULER: "airflow scheduler",
}
QUEUE = "default"
# Seconds a process gets after SIGTERM before it is killed (a worker's warm shutdown waits for its task).
STOP_GRACE_S = 30.0


def worker_hostname() -> str:
    """Airflow's hostname of this process (`[core] hostname_callable`): $GEM_WORKER_HOSTNAME on a
    worker of an AirflowCluster, else the machine's fully qualified name (Airflow's default)."""
    return os.environ.get(WORKER_HOSTNAME_ENV) or socket.getfqdn()


def processes_under(process: subprocess.Popen[bytes]) -> list[psutil.Process]:
    """Every process under `process` now, whichever process group each is in."""
    try:
        return psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def kill_all(processes: list[psutil.Process]) -> None:
    """SIGKILL each of `processes` still running, and wait for them."""
    for child in processes:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(processes, timeout=10)


def kill_tree(process: subprocess.Popen[bytes]) -> None:
    """SIGKILL `process`, its process group and every process under it, whichever group each is in;
    the leader is reaped."""
    below = processes_under(process)
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    kill_all(below)
    process.wait()


def stop_tree(process: subprocess.Popen[bytes], timeout_s: float) -> None:
    """SIGTERM `process`'s group (services.stop_group: SIGKILL after timeout_s), then SIGKILL what
    still runs under it in other groups (an Airflow task process in its own group)."""
    below = processes_under(process)
    stop_group(process, timeout_s)
    kill_all(below)


def health(api_url: str) -> dict[str, Any] | None:
    """The API server's health report (`/api/v2/monitor/health`, no login needed); None when it
    does not answer."""
    try:
        with urllib.request.urlopen(f"{api_url}/api/v2/monitor/health", timeout=5) as r:
            return json.loads(r.read())
    except (OSError, ValueError):
        return None


def unhealthy(report: Mapping[str, Any] | None, components: tuple[str, ...]) -> list[str]:
    """Which of `components` (metadatabase, scheduler, dag_processor, ...) the health report does not
    call healthy; all of them when there is no report."""
    if report is None:
        return list(components)
    return [c for c in components if (report.get(c) or {}).get("status") != "healthy"]


@dataclass(frozen=True)
class TaskTry:
    """One try of a task instance: its number, and its state, times and host (`task`)."""

    number: int
    task: TaskRun


def unpause(api: AirflowApi, dag_id: str = DAG_ID, timeout_s: float = PARSE_TIMEOUT_S) -> None:
    """Unpause dag_id (the scheduler runs no task of a paused DAG) once the DAG processor has written
    it into the DB; TimeoutError when it has not after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while not api.dag_parsed(dag_id):
        if time.monotonic() > deadline:
            raise TimeoutError(f"{dag_id} not parsed into the metadata DB after {timeout_s:.0f}s")
        time.sleep(POLL_S)
    api.set_paused(dag_id, False)


def trigger_day(api: AirflowApi, ds: str, dag_id: str = DAG_ID, conf: Mapping[str, Any] | None = None) -> str:
    """A manual run of dag_id processing ds, through the REST API -> its run id. Dated as `gem run`
    dates its runs (orchestration.manual_logical_date: never a scheduled or backfill run's midnight),
    with the data interval [ds, ds + 1) given outright (a trigger infers it from now otherwise)."""
    after = dt.datetime.fromisoformat(manual_logical_date(ds))
    body = TriggerDAGRunPostBody(logical_date=after, run_after=after, data_interval_start=midnight(ds),
                                 data_interval_end=midnight(shift_day(ds, 1)), conf=dict(conf or {}))
    made = api.call(lambda c: DagRunApi(c).trigger_dag_run(dag_id, body, _request_timeout=REQUEST_TIMEOUT_S))
    return str(made.dag_run_id)


def wait_for_run(api: AirflowApi, run_id: str, timeout_s: float, dag_id: str = DAG_ID,
                 on_poll: Callable[[], None] | None = None) -> Run:
    """The run once it has finished (success or failed), polled every POLL_S seconds (`on_poll` is
    called at each poll: a reporter of its tasks); TimeoutError after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while True:
        run = next((r for r in api.runs(dag_id) if r.run_id == run_id), None)
        if run is None:
            raise LookupError(f"Airflow has no run {run_id} of {dag_id}")
        if on_poll is not None:
            on_poll()
        if run.state in RUN_STATES_DONE:
            return run
        if time.monotonic() > deadline:
            raise TimeoutError(f"run {run_id} of {dag_id} not finished after {timeout_s:.0f}s (it is {run.state})")
        time.sleep(POLL_S)


def task_tries(api: AirflowApi, dag_id: str, run_id: str, task_id: str) -> list[TaskTry]:
    """Every try of one task instance, the current one included, oldest first."""
    found = api.call(lambda c: TaskInstanceApi(c).get_task_instance_tries(
        dag_id, run_id, task_id, _request_timeout=REQUEST_TIMEOUT_S)).task_instances
    return sorted((TaskTry(int(t.try_number), TaskRun.of(t)) for t in found), key=lambda t: t.number)


@dataclass
class AirflowCluster:
    """Airflow's API server, DAG processor, scheduler and `workers` Celery workers on the metadata DB
    `db_url` (a SQLAlchemy URL) and the Redis at `redis_url` (database 0 the broker, 1 the results).

    `env`: the Airflow environment to start from (gem.pipeline.airflow.runs.airflow_env or a test's:
    AIRFLOW_HOME, GEM_CONFIG, PATH); `settings`: Airflow or GEM_ variables on top (a test's short
    heartbeat timeouts). `scheduled_runs`: whether the scheduler makes runs from the DAGs' schedules
    ([scheduler] use_job_schedule); off, it runs only what it is given (triggered and backfill runs).
    Logs: logs/<process>.log (a restarted API server's earlier log: api-server.<n>.log)."""

    env: Mapping[str, str]
    db_url: str
    redis_url: str
    logs: Path
    workers: int = 2
    worker_concurrency: int = 1
    scheduled_runs: bool = False
    settings: Mapping[str, str] = field(default_factory=dict)
    ready_timeout_s: float = 300.0
    api_port: int = 0
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict, init=False)
    api_server: ApiServer | None = field(default=None, init=False)
    _log_ports: dict[str, int] = field(default_factory=dict, init=False)
    _api_starts: int = field(default=0, init=False)

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    @property
    def broker_url(self) -> str:
        return self.redis_url.rsplit("/", 1)[0] + "/0"

    @property
    def result_backend(self) -> str:
        return self.redis_url.rsplit("/", 1)[0] + "/1"

    @staticmethod
    def worker_name(index: int) -> str:
        """The hostname of worker `index` (1-based): what its task instances record."""
        return f"gem-worker-{index}"

    def worker_names(self) -> list[str]:
        return [self.worker_name(i) for i in range(1, self.workers + 1)]

    def environment(self) -> dict[str, str]:
        """What every process of the cluster runs with, and what a client of it (`gem backfill`,
        gem.pipeline.airflow.api.airflow_api) needs: the metadata DB, the executor and broker, the
        API server's port and URL."""
        self.api_port = self.api_port or free_port()
        parallelism = self.workers * self.worker_concurrency
        return stack_env(self.env, self.scheduled_runs, parallelism) | {
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.db_url,
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__CELERY__BROKER_URL": self.broker_url,
            "AIRFLOW__CELERY__RESULT_BACKEND": self.result_backend,
            "AIRFLOW__CELERY__WORKER_CONCURRENCY": str(self.worker_concurrency),
            "AIRFLOW__CELERY__CELERY_CONFIG_OPTIONS": CELERY_CONFIG_PATH,
            "AIRFLOW__OPERATORS__DEFAULT_QUEUE": QUEUE,
            "AIRFLOW__CORE__HOSTNAME_CALLABLE": HOSTNAME_CALLABLE,
            "GEM_AIRFLOW_PORT": str(self.api_port),
            API_URL_ENV: self.api_url,
            # The scheduler's and DAG processor's own log servers, apart from every worker's.
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(self._log_port("main")),
        } | dict(self.settings)

    def _log_port(self, name: str) -> int:
        if name not in self._log_ports:
            self._log_ports[name] = free_port()
        return self._log_ports[name]

    def command_of(self, name: str) -> tuple[str, dict[str, str]]:
        """The shell command (run with infra/airflow/airflow_env.sh sourced) and the environment of
        the cluster's process `name` (dag-processor, scheduler, worker-<i>)."""
        env = self.environment()
        if name in COMMANDS:
            return COMMANDS[name], env
        index = int(name.rsplit("-", 1)[1])
        host = self.worker_name(index)
        env |= {WORKER_HOSTNAME_ENV: host, "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(self._log_port(name))}
        return (f"airflow celery worker --celery-hostname {shlex.quote(host)} --queues {QUEUE} "
                f"--concurrency {self.worker_concurrency}"), env

    def start_process(self, name: str) -> None:
        """Start one process of the cluster (api-server, dag-processor, scheduler, worker-<i>) in
        its own session, appending to logs/<name>.log."""
        self.logs.mkdir(parents=True, exist_ok=True)
        if name == API_SERVER:
            log = self.logs / "api-server.log"
            if log.exists():
                log.rename(self.logs / f"api-server.{self._api_starts}.log")
            self._api_starts += 1
            self.api_server = ApiServer(self.environment(), log, port=self.api_port).start()
            return
        command, env = self.command_of(name)
        with open(self.logs / f"{name}.log", "ab") as log_file:
            self.processes[name] = subprocess.Popen(
                ["bash", "-c", f". infra/airflow/airflow_env.sh && exec {command}"], cwd=REPO_ROOT, env=env,
                stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)

    def stop_process(self, name: str, timeout_s: float = STOP_GRACE_S) -> None:
        if name == API_SERVER:
            if self.api_server is not None:
                self.api_server.stop()
            return
        process = self.processes.get(name)
        if process is not None:
            stop_tree(process, timeout_s)

    def restart(self, *names: str) -> None:
        """Stop these processes and start them again, as a supervisor restarts services; waits until
        the cluster is ready again."""
        for name in names:
            self.stop_process(name)
        for name in names:
            self.start_process(name)
        self.wait_ready()

    def kill_worker(self, index: int) -> None:
        """SIGKILL worker `index` (1-based) with every process under it: a node lost mid-task."""
        kill_tree(self.processes[f"worker-{index}"])

    def start(self) -> Self:
        """Migrate the metadata DB (and its gpu pool), start every process, wait until all are ready."""
        init_db(self.environment())
        try:
            for name in (API_SERVER, DAG_PROCESSOR, SCHEDULER, *(f"worker-{i}" for i in range(1, self.workers + 1))):
                self.start_process(name)
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def workers_answering(self) -> list[str]:
        """The workers' hostnames that answer a Celery ping on the broker."""
        app = Celery(broker=self.broker_url)
        try:
            replies = app.control.ping(destination=[f"celery@{h}" for h in self.worker_names()], timeout=1.0)
        except OSError:
            return []
        finally:
            app.close()
        return sorted(node.split("@", 1)[1] for reply in replies for node in reply)

    def exited(self) -> list[str]:
        """The processes of the cluster that have exited, each with its exit status."""
        found = [f"{name} exited with {p.returncode}" for name, p in self.processes.items() if p.poll() is not None]
        server = self.api_server.process if self.api_server is not None else None
        if server is not None and server.poll() is not None:
            found.append(f"{API_SERVER} exited with {server.returncode}")
        return found

    def not_ready(self) -> list[str]:
        """What is not ready yet: processes that exited, health components, workers not answering."""
        sick = unhealthy(health(self.api_url), ("metadatabase", "scheduler", "dag_processor"))
        silent = sorted(set(self.worker_names()) - set(self.workers_answering()))
        return self.exited() + [f"{c} not healthy" for c in sick] + [f"{w} not answering a ping" for w in silent]

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            missing = self.not_ready()
            if not missing:
                return
            if self.exited() or time.monotonic() > deadline:
                raise ServiceStartError(f"the Airflow cluster was not ready after {self.ready_timeout_s:.0f} s: "
                                        f"{'; '.join(missing)}; logs in {self.logs}")
            time.sleep(1.0)

    def stop(self) -> None:
        """The scheduler first (nothing new is queued), then the workers, the DAG processor and the
        API server."""
        order = [SCHEDULER, *sorted(n for n in self.processes if n.startswith("worker-")), DAG_PROCESSOR, API_SERVER]
        for name in order:
            self.stop_process(name)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass(frozen=True)
class LocalAirflow:
    """What `local_airflow` started: the metadata DB, the broker and the cluster on them."""

    postgres: PostgresServer
    redis: RedisServer
    airflow: AirflowCluster


@contextmanager
def local_airflow(env: Mapping[str, str], work_dir: Path, workers: int = 2,
                  settings: Mapping[str, str] | None = None) -> Iterator[LocalAirflow]:
    """PostgreSQL (work_dir/postgres), Redis (work_dir/redis) and an AirflowCluster of `workers`
    workers on them (its logs in work_dir/airflow), all stopped at the end, the cluster first."""
    with PostgresServer(work_dir / "postgres") as postgres, RedisServer(work_dir / "redis") as redis, \
            AirflowCluster(env, postgres.url, redis.url, work_dir / "airflow", workers=workers,
                           settings=dict(settings or {})) as cluster:
        yield LocalAirflow(postgres, redis, cluster)

"""Airflow's REST API (apache-airflow-client): how gem reads and drives Airflow.

`gem run`, `gem backfill`, `gem status` and `make demo` ask Airflow's API server what Airflow
recorded (runs, their task instances, backfills, the scheduler's health) and never open the
metadata DB themselves, so the DB is whatever Airflow is configured with: Postgres or any other
database AIRFLOW__DATABASE__SQL_ALCHEMY_CONN names, or the embedded default, SQLite in
$AIRFLOW_HOME/airflow.db (infra/airflow/airflow_env.sh).

Which server `airflow_api` talks to:
- $GEM_AIRFLOW_API_URL when set (a deployment's server), logged into as $GEM_AIRFLOW_API_USER
  (default admin) with $GEM_AIRFLOW_API_PASSWORD, else with the password Airflow generated for that
  user into this AIRFLOW_HOME;
- else `airflow api-server` started for the block on a free loopback port (core and execution
  apps, so a scheduler stack started beside it reports to it too), logged into with the generated
  password, and stopped with its process group at the end. It starts in the background: the first
  query waits for it, and `ready()` says without waiting whether it is up.
Every call carries a bearer token from POST /auth/token; an expired token is renewed once.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self, TypeVar

import urllib3
from airflow_client.client import ApiClient, Configuration
from airflow_client.client.api.backfill_api import BackfillApi
from airflow_client.client.api.dag_api import DAGApi
from airflow_client.client.api.dag_run_api import DagRunApi
from airflow_client.client.api.monitor_api import MonitorApi
from airflow_client.client.api.task_instance_api import TaskInstanceApi
from airflow_client.client.exceptions import ApiException, NotFoundException, ServiceException, UnauthorizedException
from airflow_client.client.models.backfill_post_body import BackfillPostBody
from airflow_client.client.models.dag_patch_body import DAGPatchBody
from airflow_client.client.models.reprocess_behavior import ReprocessBehavior

from gem.config import REPO_ROOT
from gem.environment import API_PASSWORD_ENV, API_URL_ENV, API_USER_ENV, DEFAULT_DB_ENV
from gem.pipeline.services import ServiceStartError, free_port, stop_group

# Airflow's own settings that name the metadata DB (the URL, or a command or secret giving it).
DB_CONN_ENVS = ("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_CMD",
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN_SECRET")
PASSWORDS_FILE_ENV = "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"
PASSWORDS_FILE = "simple_auth_manager_passwords.json.generated"
DEFAULT_USER = "admin"
PAGE = 100  # Airflow's largest page ([api] maximum_page_limit)
REQUEST_TIMEOUT_S = 60.0
# Attempts per call when the server answers 5xx or the connection drops (SQLite busy under a writer).
ATTEMPTS = 3
READY_TIMEOUT_S = 300.0
STOP_TIMEOUT_S = 20.0
SHUTDOWN_GRACE_S = 1.0  # from uvicorn closing its socket to its application's shutdown being done

T = TypeVar("T")


class AirflowApiError(RuntimeError):
    """Airflow's API server could not be reached or refused the login, or no credentials were found."""


# What a command reports as "Airflow's API is not there" (a started server that never came up included).
API_UNAVAILABLE = (AirflowApiError, ServiceStartError)


def airflow_home(environ: Mapping[str, str] | None = None) -> Path:
    """Where infra/airflow/airflow_env.sh puts Airflow's files: $AIRFLOW_HOME, else <repo>/.airflow."""
    environ = os.environ if environ is None else environ
    return Path(environ.get("AIRFLOW_HOME") or REPO_ROOT / ".airflow")


def embedded_db(env: Mapping[str, str]) -> Path | None:
    """The SQLite file of the embedded default when Airflow's metadata DB is that default and no API
    server is configured (gem then starts one on it), else None. The DB is the default when no
    DB_CONN_ENVS is set, or when the URL set is the one airflow_env.sh put there ($GEM_AIRFLOW_DEFAULT_DB)."""
    if env.get(API_URL_ENV):
        return None
    conn, *others = (env.get(name) for name in DB_CONN_ENVS)
    if any(others) or (conn and conn != env.get(DEFAULT_DB_ENV)):
        return None
    return airflow_home(env) / "airflow.db"


def generated_password(env: Mapping[str, str], user: str) -> str:
    """The password SimpleAuthManager generated for `user` into this AIRFLOW_HOME (its API server
    writes the file when it starts)."""
    path = Path(env.get(PASSWORDS_FILE_ENV) or airflow_home(env) / PASSWORDS_FILE)
    try:
        passwords = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise AirflowApiError(f"no Airflow password for {user!r}: cannot read {path} ({e}); set ${API_PASSWORD_ENV}") from None
    if user not in passwords:
        raise AirflowApiError(f"{path} holds no password for Airflow user {user!r} (it has {sorted(passwords)}); "
                              f"set ${API_USER_ENV} to one of them or ${API_PASSWORD_ENV}")
    return str(passwords[user])


def _utc(value: dt.datetime | None) -> dt.datetime | None:
    """A time the API gave, in UTC (the API's times carry their zone; one without is UTC)."""
    if value is None:
        return None
    return value.astimezone(dt.UTC) if value.tzinfo else value.replace(tzinfo=dt.UTC)


def midnight(ds: str) -> dt.datetime:
    """00:00 UTC of day ds: the logical date of the DAG's scheduled and backfill runs of ds."""
    return dt.datetime.fromisoformat(ds).replace(tzinfo=dt.UTC)


@dataclass(frozen=True)
class Run:
    """One DAG run as Airflow recorded it; `ds` is the day it processed (its data interval's start)."""

    dag_id: str
    run_id: str
    ds: str | None
    logical_date: dt.datetime | None
    run_after: dt.datetime
    run_type: str
    state: str

    @classmethod
    def of(cls, r: Any) -> Run:
        start = _utc(r.data_interval_start)
        return cls(r.dag_id, r.dag_run_id, start.date().isoformat() if start else None, _utc(r.logical_date),
                   _utc(r.run_after), str(getattr(r.run_type, "value", r.run_type)),
                   str(getattr(r.state, "value", r.state)))


@dataclass(frozen=True)
class TaskRun:
    """One task instance of a run: its state, when it started and ended, and where it ran."""

    task_id: str
    state: str | None
    start: dt.datetime | None
    end: dt.datetime | None
    hostname: str | None = None

    @property
    def seconds(self) -> float:
        return (self.end - self.start).total_seconds() if self.start and self.end else 0.0

    @classmethod
    def of(cls, t: Any) -> TaskRun:
        state = getattr(t.state, "value", t.state)
        return cls(t.task_id, None if state is None else str(state), _utc(t.start_date), _utc(t.end_date),
                   t.hostname or None)


@dataclass
class ApiServer:
    """`airflow api-server` (core and execution apps, one worker) on a free loopback port, with
    infra/airflow/airflow_env.sh sourced in `env`; its own session, so `stop` takes its workers along.
    `start` returns at once; `wait_ready` waits until it answers /api/v2/monitor/health."""

    env: Mapping[str, str]
    log: Path
    host: str = "127.0.0.1"
    port: int = 0
    ready_timeout_s: float = READY_TIMEOUT_S
    process: subprocess.Popen[bytes] | None = field(default=None, init=False)
    started: float = field(default=0.0, init=False)
    ready: bool = field(default=False, init=False)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> Self:
        self.port = self.port or free_port(self.host)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        # GEM_AIRFLOW_HOST / _PORT: airflow_env.sh derives the API's base URL and the execution API's
        # URL from them, so a scheduler stack given the same variables reports to this server.
        env = {**self.env, "GEM_AIRFLOW_HOST": self.host, "GEM_AIRFLOW_PORT": str(self.port)}
        command = (f". infra/airflow/airflow_env.sh && exec {shlex.quote(sys.executable)} -m airflow api-server "
                   f"--apps all --workers 1 --host {self.host} --port {self.port}")
        with open(self.log, "w") as out:
            self.process = subprocess.Popen(["bash", "-c", command], cwd=REPO_ROOT, env=env, stdout=out,
                                            stderr=subprocess.STDOUT, start_new_session=True)
        self.started = time.monotonic()
        return self

    def poll_ready(self) -> bool:
        """Whether it answers now (raises ServiceStartError when it exited or ran out of time)."""
        if self.ready:
            return True
        if self.process is None:
            raise ServiceStartError("the Airflow API server was never started")
        if self.process.poll() is not None:
            raise ServiceStartError(f"the Airflow API server exited with {self.process.returncode}; see {self.log}")
        try:
            with urllib.request.urlopen(f"{self.url}/api/v2/monitor/health", timeout=5):
                self.ready = True
        except OSError:
            if time.monotonic() - self.started > self.ready_timeout_s:
                self.stop()
                raise ServiceStartError(f"the Airflow API server was not ready on {self.url} after "
                                        f"{self.ready_timeout_s:.0f} s; see {self.log}") from None
        return self.ready

    def wait_ready(self) -> None:
        while not self.poll_ready():
            time.sleep(0.25)

    def listening(self) -> bool:
        try:
            with socket.create_connection((self.host, self.port), timeout=1):
                return True
        except OSError:
            return False

    def stop(self) -> None:
        """SIGTERM; once uvicorn has closed its socket and a moment has passed for its shutdown, what
        is left is the interpreter's exit (seconds of garbage collection on a busy machine), not waited
        for: the group is killed."""
        if self.process is None:
            return
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_TIMEOUT_S
            while self.process.poll() is None and self.listening() and time.monotonic() < deadline:
                time.sleep(0.1)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=SHUTDOWN_GRACE_S)
        stop_group(self.process, timeout_s=0)


class AirflowApi:
    """The queries gem needs, through apache-airflow-client, on the server at `url`. With `server`
    (one started here) the first query waits until it is up."""

    def __init__(self, url: str, user: str, password: Callable[[], str], server: ApiServer | None = None) -> None:
        self.url = url.rstrip("/")
        self.user = user
        self._password = password
        self.server = server
        self._client: ApiClient | None = None

    # --- connection ---------------------------------------------------------------------------

    def ready(self) -> bool:
        """Whether a query would run now without waiting for the server to start."""
        return self._client is not None or self.server is None or self.server.poll_ready()

    def _token(self) -> str:
        body = json.dumps({"username": self.user, "password": self._password()}).encode()
        request = urllib.request.Request(f"{self.url}/auth/token", data=body, method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=REQUEST_TIMEOUT_S) as response:
                return json.loads(response.read())["access_token"]
        except urllib.error.HTTPError as e:
            raise AirflowApiError(f"Airflow's API at {self.url} refused user {self.user!r} (HTTP {e.code}): "
                                  f"{e.read()[:500].decode(errors='replace')}") from None
        except OSError as e:
            raise AirflowApiError(f"cannot reach Airflow's API at {self.url}: {e}") from None

    def client(self) -> ApiClient:
        if self._client is None:
            if self.server is not None:
                self.server.wait_ready()
            self._client = ApiClient(Configuration(host=self.url, access_token=self._token()))
        return self._client

    def call(self, query: Callable[[ApiClient], T]) -> T:
        """query(client), logging in again once on 401 and retrying a 5xx or a dropped connection."""
        client = self.client()
        for attempt in range(1, ATTEMPTS + 1):
            try:
                return query(client)
            except UnauthorizedException:
                if attempt > 1:
                    raise
                client.configuration.access_token = self._token()
            except (ServiceException, urllib3.exceptions.HTTPError):
                if attempt == ATTEMPTS:
                    raise
                time.sleep(attempt)
        raise AssertionError("unreachable")

    def listing(self, page: Callable[[ApiClient, int], list[T]]) -> list[T]:
        """Every item of a listing, page by page: page(client, offset) -> at most PAGE items from offset."""
        items: list[T] = []
        while True:
            got = self.call(functools.partial(page, offset=len(items)))
            items += got
            if len(got) < PAGE:
                return items

    # --- runs and task instances ----------------------------------------------------------------

    def runs(self, dag_id: str, *, states: list[str] | None = None, run_types: list[str] | None = None,
             logical_from: dt.datetime | None = None, logical_to: dt.datetime | None = None,
             since: dt.datetime | None = None) -> list[Run]:
        """The DAG's runs, oldest first (by Airflow's run id), filtered by state, run type, logical
        date (inclusive) and run_after >= since; none when the DAG is not in the DB yet."""
        try:
            return [Run.of(r) for r in self.listing(lambda c, offset: DagRunApi(c).get_dag_runs(
                dag_id, state=states, run_type=run_types, logical_date_gte=logical_from, logical_date_lte=logical_to,
                run_after_gte=since, order_by=["id"], limit=PAGE, offset=offset,
                _request_timeout=REQUEST_TIMEOUT_S).dag_runs)]
        except NotFoundException:
            return []

    def newest_run(self, dag_id: str, ds: str, since: dt.datetime | None = None) -> Run | None:
        """The newest run of dag_id that processed ds (among those made at or after `since`)."""
        runs = [r for r in self.runs(dag_id, since=since) if r.ds == ds]
        return runs[-1] if runs else None

    def failed_runs(self, dag_id: str) -> list[Run]:
        return self.runs(dag_id, states=["failed"])

    def task_runs(self, dag_id: str, run_id: str) -> list[TaskRun]:
        """Every task instance of one run (state, start, end, hostname)."""
        return [TaskRun.of(t) for t in self.listing(lambda c, offset: TaskInstanceApi(c).get_task_instances(
            dag_id, run_id, order_by=["id"], limit=PAGE, offset=offset,
            _request_timeout=REQUEST_TIMEOUT_S).task_instances)]

    # --- DAGs and the scheduler -------------------------------------------------------------------

    def dag_parsed(self, dag_id: str) -> bool:
        """Whether the DAG processor (or a `dags test`) has written the DAG into the DB."""
        try:
            self.call(lambda c: DAGApi(c).get_dag(dag_id, _request_timeout=REQUEST_TIMEOUT_S))
        except NotFoundException:
            return False
        return True

    def paused(self, dag_id: str) -> bool:
        return bool(self.call(lambda c: DAGApi(c).get_dag(dag_id, _request_timeout=REQUEST_TIMEOUT_S)).is_paused)

    def set_paused(self, dag_id: str, paused: bool) -> None:
        self.call(lambda c: DAGApi(c).patch_dag(dag_id, DAGPatchBody(is_paused=paused), update_mask=["is_paused"],
                                                _request_timeout=REQUEST_TIMEOUT_S))

    def scheduler_healthy(self) -> bool:
        """Whether a scheduler heartbeats into the DB (/api/v2/monitor/health: Airflow's own threshold)."""
        health = self.call(lambda c: MonitorApi(c).get_health(_request_timeout=REQUEST_TIMEOUT_S))
        return health.scheduler.status == "healthy"

    # --- backfills -------------------------------------------------------------------------------

    def _backfill_body(self, dag_id: str, start: str, end: str, reprocess: str, max_active_runs: int,
                       conf: dict[str, Any] | None) -> BackfillPostBody:
        return BackfillPostBody(dag_id=dag_id, from_date=midnight(start), to_date=midnight(end),
                                reprocess_behavior=ReprocessBehavior(reprocess), max_active_runs=max_active_runs,
                                dag_run_conf=conf)

    def backfill_days(self, dag_id: str, start: str, end: str, reprocess: str) -> list[str]:
        """The days of start..end a backfill with `reprocess` would run (Airflow's dry run)."""
        body = self._backfill_body(dag_id, start, end, reprocess, 1, None)
        dry = self.call(lambda c: BackfillApi(c).create_backfill_dry_run(body, _request_timeout=REQUEST_TIMEOUT_S))
        return [_utc(b.logical_date).date().isoformat() for b in dry.backfills if b.logical_date is not None]

    def create_backfill(self, dag_id: str, start: str, end: str, reprocess: str, max_active_runs: int = 1,
                        conf: dict[str, Any] | None = None) -> int:
        """A backfill of days start..end (its runs queued for the scheduler) -> its id."""
        body = self._backfill_body(dag_id, start, end, reprocess, max_active_runs, conf)
        return int(self.call(lambda c: BackfillApi(c).create_backfill(body, _request_timeout=REQUEST_TIMEOUT_S)).id)

    def backfill_completed(self, backfill_id: int) -> bool:
        """Whether Airflow marked the backfill completed (every run of it finished)."""
        found = self.call(lambda c: BackfillApi(c).get_backfill(backfill_id, _request_timeout=REQUEST_TIMEOUT_S))
        return found.completed_at is not None

    def backfill_runs(self, dag_id: str, start: str, end: str) -> dict[str, Run]:
        """ds -> the backfill run of each day of start..end that has one."""
        runs = self.runs(dag_id, run_types=["backfill"], logical_from=midnight(start), logical_to=midnight(end))
        return {r.logical_date.date().isoformat(): r for r in runs if r.logical_date is not None}


def api_error(e: ApiException) -> str:
    """An API error as one line: status, reason and the server's detail."""
    return f"HTTP {e.status} {e.reason}: {(e.body or '')[:1000]}"


@contextmanager
def airflow_api(env: Mapping[str, str], log: Path) -> Iterator[AirflowApi]:
    """The Airflow API for the block (see the module docstring): the configured server, else an
    `airflow api-server` started now in the background (its output in `log`) and stopped at the end."""
    user = env.get(API_USER_ENV) or DEFAULT_USER
    url = env.get(API_URL_ENV)
    if url:
        given = env.get(API_PASSWORD_ENV)
        yield AirflowApi(url, user, (lambda: given) if given else (lambda: generated_password(env, user)))
        return
    server = ApiServer(env, log).start()
    try:
        yield AirflowApi(server.url, user, lambda: generated_password(env, user), server=server)
    finally:
        server.stop()

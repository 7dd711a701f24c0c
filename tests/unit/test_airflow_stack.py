"""The pieces of the Airflow cluster (gem.pipeline.airflow.stack) that need no Airflow running: the
environment each process gets, the hostname a worker's tasks record, killing a lost node's whole
tree, and the two services under it (Redis; PostgreSQL shut down and resumed on its data)."""

from __future__ import annotations

import importlib
import socket
import subprocess
import time
from pathlib import Path

import psutil
import pytest
import sqlalchemy as sa
from airflow.providers.celery.executors.default_celery import DEFAULT_CELERY_CONFIG
from celery.signals import worker_process_init

from gem.environment import API_URL_ENV
from gem.pipeline.airflow import celery_worker
from gem.pipeline.airflow.stack import (
    CELERY_CONFIG_PATH,
    HOSTNAME_CALLABLE,
    WORKER_HOSTNAME_ENV,
    AirflowCluster,
    kill_tree,
    unhealthy,
    worker_hostname,
)
from gem.pipeline.services import PostgresServer, RedisServer
from tests.celery_support import require_cluster_services


def cluster(tmp_path: Path, **kwargs: object) -> AirflowCluster:
    return AirflowCluster({"AIRFLOW_HOME": str(tmp_path / "home"), "PATH": "/usr/bin"},
                          "postgresql+psycopg2://gem@127.0.0.1:5999/airflow", "redis://127.0.0.1:6999/0",
                          tmp_path / "logs", **kwargs)


def imported(path: str) -> object:
    """What Airflow's settings that name an object (`module.attribute`) import."""
    module, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module), name)


def test_the_hostname_callable_is_the_worker_s_name_else_the_machine_s(monkeypatch: pytest.MonkeyPatch) -> None:
    assert imported(HOSTNAME_CALLABLE) is worker_hostname
    monkeypatch.delenv(WORKER_HOSTNAME_ENV, raising=False)
    assert worker_hostname() == socket.getfqdn()
    monkeypatch.setenv(WORKER_HOSTNAME_ENV, "gem-worker-7")
    assert worker_hostname() == "gem-worker-7"


def test_every_process_gets_the_db_the_broker_and_the_api_and_each_worker_its_own_name_and_log_port(tmp_path: Path) -> None:
    c = cluster(tmp_path, workers=3, settings={"AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "30"})
    env = c.environment()
    assert env["AIRFLOW__CORE__EXECUTOR"] == "CeleryExecutor"
    assert env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == "postgresql+psycopg2://gem@127.0.0.1:5999/airflow"
    assert env["AIRFLOW__CELERY__BROKER_URL"] == "redis://127.0.0.1:6999/0"
    assert env["AIRFLOW__CELERY__RESULT_BACKEND"] == "redis://127.0.0.1:6999/1"
    assert env["AIRFLOW__CORE__PARALLELISM"] == "3"  # 3 workers x 1 task slot
    assert env["AIRFLOW__CELERY__CELERY_CONFIG_OPTIONS"] == CELERY_CONFIG_PATH
    assert env[API_URL_ENV] == c.api_url == f"http://127.0.0.1:{env['GEM_AIRFLOW_PORT']}"
    assert env["AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT"] == "30"
    assert c.environment() == env  # ports chosen once
    workers = [c.command_of(f"worker-{i}") for i in (1, 2, 3)]
    assert [e[WORKER_HOSTNAME_ENV] for _, e in workers] == ["gem-worker-1", "gem-worker-2", "gem-worker-3"]
    ports = {e["AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT"] for _, e in workers}
    assert len(ports | {env["AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT"]}) == 4
    command, _ = workers[1]
    assert "airflow celery worker --celery-hostname gem-worker-2 --queues default --concurrency 1" == command


def test_celery_s_pool_processes_may_start_children() -> None:
    """The configuration the workers import is Airflow's, and connects the pool processes' start."""
    assert imported(CELERY_CONFIG_PATH) is DEFAULT_CELERY_CONFIG
    assert any(ref() is celery_worker.pool_process_may_start_children
               for _, ref in worker_process_init.receivers if callable(ref))


def test_health_components_not_reported_healthy_are_named() -> None:
    report = {"metadatabase": {"status": "healthy"}, "scheduler": {"status": "unhealthy"}, "dag_processor": None}
    assert unhealthy(report, ("metadatabase", "scheduler", "dag_processor")) == ["scheduler", "dag_processor"]
    assert unhealthy(None, ("metadatabase",)) == ["metadatabase"]


def test_kill_tree_takes_children_in_other_sessions_too(tmp_path: Path) -> None:
    """A lost node: the leader, its group and a grandchild that left for a session of its own."""
    pid_file = tmp_path / "grandchild.pid"
    leader = subprocess.Popen(["bash", "-c", f"setsid sleep 600 & echo $! > {pid_file}; sleep 600"],
                              start_new_session=True)
    deadline = time.monotonic() + 10
    while not (pid_file.exists() and pid_file.read_text().strip()) and time.monotonic() < deadline:
        time.sleep(0.05)
    grandchild = psutil.Process(int(pid_file.read_text()))
    assert grandchild.pid != leader.pid and psutil.Process(leader.pid).children(recursive=True)
    kill_tree(leader)
    assert leader.returncode is not None
    grandchild.wait(timeout=10)
    assert not psutil.pid_exists(grandchild.pid) or grandchild.status() == psutil.STATUS_ZOMBIE


def test_redis_answers_and_stops(tmp_path: Path) -> None:
    require_cluster_services()
    with RedisServer(tmp_path / "redis") as redis:
        assert redis.ping()
        assert redis.url.startswith("redis://127.0.0.1:") and redis.url.endswith("/0")
    assert not redis.ping()


def test_postgres_shut_down_and_resumed_keeps_its_data(tmp_path: Path) -> None:
    require_cluster_services()
    with PostgresServer(tmp_path / "pg") as pg:
        engine = sa.create_engine(pg.url)
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE t (x int)"))
            conn.execute(sa.text("INSERT INTO t VALUES (7)"))
        engine.dispose()
        pg.shut_down()
        with pytest.raises(sa.exc.OperationalError, match="refused"):
            sa.create_engine(pg.url).connect()
        pg.resume()
        with sa.create_engine(pg.url).connect() as conn:
            assert conn.execute(sa.text("SELECT x FROM t")).scalar() == 7

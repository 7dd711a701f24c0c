"""The Celery configuration of an AirflowCluster's processes (`[celery] celery_config_options`):
Airflow's own, and a pool process that may start child processes.

A Celery worker runs each task in a process of its prefork pool, and billiard marks those processes
daemonic. Airflow's task process is forked from one and inherits the mark, and a daemonic process
may start no child processes (multiprocessing refuses: "daemonic processes are not allowed to have
children"), so a task whose job starts any (torch's DataLoader workers in pretraining, for one)
would fail on a Celery worker while it runs under `airflow dags test` and the LocalExecutor. Each
pool process clears the mark on itself when it starts (Celery's worker_process_init signal, connected
here when the worker imports this configuration); the worker still stops its pool processes itself.
"""

from __future__ import annotations

import multiprocessing
from typing import Any

from airflow.providers.celery.executors.default_celery import DEFAULT_CELERY_CONFIG
from celery.signals import worker_process_init

# gem.pipeline.airflow.stack.CELERY_CONFIG_PATH names it.
CELERY_CONFIG: dict[str, Any] = DEFAULT_CELERY_CONFIG


@worker_process_init.connect
def pool_process_may_start_children(**_: Any) -> None:
    """In each new pool process: not daemonic, so the task processes forked from it may start
    child processes."""
    multiprocessing.current_process().daemon = False

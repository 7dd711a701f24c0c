"""gem.pipeline.airflow.api against a real `airflow api-server` on the embedded SQLite DB: what the
queries return is what Airflow recorded in the DB (read back here with sqlite3).

A two-task DAG of its own (one task succeeds, the next raises) runs once through `airflow dags test`
while the API server gem starts comes up beside it; then the run, its task instances, the failed
runs, whether the DAG is parsed and paused, the scheduler's health (none runs) and a backfill (its
dry run, its queued runs, not completed without a scheduler) are read through the API. No Spark.
"""

from __future__ import annotations

import datetime as dt
import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gem.pipeline.airflow.api import AirflowApi, airflow_api, embedded_db, midnight
from gem.pipeline.airflow.runs import REPO_ROOT, airflow, now
from tests.support import airflow_test_env

DAG_ID = "gem_api_probe"
DS = "2026-01-01"
DAG = f'''
import datetime as dt

from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG


def boom():
    raise RuntimeError("boom")


with DAG("{DAG_ID}", schedule="@daily", start_date=dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc), catchup=False):
    PythonOperator(task_id="ok", python_callable=lambda: None) >> PythonOperator(task_id="boom", python_callable=boom)
'''


@dataclass(frozen=True)
class Probe:
    api: AirflowApi
    db: Path
    since: dt.datetime
    run_output: str


def _rows(db: Path, sql: str, *args: object) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql, args).fetchall()


def _utc(text: str | None) -> dt.datetime | None:
    """A time as Airflow's SQLite DB stores it (UTC, no zone)."""
    return dt.datetime.fromisoformat(text).replace(tzinfo=dt.UTC) if text else None


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Probe]:
    tmp = tmp_path_factory.mktemp("airflow_api")
    (tmp / "dags").mkdir()
    (tmp / "dags" / "probe.py").write_text(DAG)
    (tmp / "gem.yaml").write_text(f"lakehouse_uri: {tmp / 'lakehouse'}\n")
    env = airflow_test_env(tmp / "airflow_home", tmp / "gem.yaml",
                           PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    airflow("airflow db migrate > /dev/null", env)  # the DB (init_db also sets a pool this test needs not)
    assert embedded_db(env) == tmp / "airflow_home" / "airflow.db"
    with airflow_api(env, tmp / "api-server.log") as api:  # starts while the run below runs
        since = now()
        script = (f". infra/airflow/airflow_env.sh && export AIRFLOW__CORE__DAGS_FOLDER={tmp / 'dags'} "
                  f"&& airflow dags test {DAG_ID} {DS}T00:00:00+00:00")
        run = subprocess.run(["bash", "-c", script], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                             timeout=300, check=False)
        assert run.returncode != 0 and "boom" in run.stdout + run.stderr, (run.stdout + run.stderr)[-3000:]
        yield Probe(api, embedded_db(env), since, run.stdout + run.stderr)


def test_the_run_and_its_task_instances_are_what_airflow_recorded(probe: Probe) -> None:
    (run_id, state, interval_start), = _rows(
        probe.db, "SELECT run_id, state, data_interval_start FROM dag_run WHERE dag_id = ?", DAG_ID)
    run = probe.api.newest_run(DAG_ID, interval_start[:10], since=probe.since)
    assert run is not None and (run.run_id, run.state, run.ds) == (run_id, state, interval_start[:10]) \
        and state == "failed"
    assert probe.api.newest_run(DAG_ID, interval_start[:10], since=now()) is None  # made before then
    assert [r.run_id for r in probe.api.failed_runs(DAG_ID)] == [run_id]
    recorded = {task: (state, _utc(start), _utc(end), hostname) for task, state, start, end, hostname in _rows(
        probe.db, "SELECT task_id, state, start_date, end_date, hostname FROM task_instance WHERE run_id = ?", run_id)}
    tasks = {t.task_id: (t.state, t.start, t.end, t.hostname) for t in probe.api.task_runs(DAG_ID, run_id)}
    assert tasks == recorded and tasks["ok"][0] == "success" and tasks["boom"][0] == "failed"
    assert all(start and end and end >= start and host for _, start, end, host in tasks.values())


def test_the_dag_is_parsed_and_pausing_goes_through(probe: Probe) -> None:
    assert probe.api.dag_parsed(DAG_ID) and not probe.api.dag_parsed("no_such_dag")
    for paused in (False, True):
        probe.api.set_paused(DAG_ID, paused)
        assert probe.api.paused(DAG_ID) is paused
        assert _rows(probe.db, "SELECT is_paused FROM dag WHERE dag_id = ?", DAG_ID) == [(int(paused),)]
    assert not probe.api.scheduler_healthy()  # no scheduler ever ran on this DB


def test_a_backfill_queues_the_days_of_its_dry_run(probe: Probe) -> None:
    start, end = "2026-01-03", "2026-01-04"
    assert probe.api.backfill_days(DAG_ID, start, end, "none") == [start, end]
    backfill_id = probe.api.create_backfill(DAG_ID, start, end, "none", conf={"from_stage": ""})
    assert _rows(probe.db, "SELECT dag_id, max_active_runs FROM backfill WHERE id = ?", backfill_id) == [(DAG_ID, 1)]
    runs = probe.api.backfill_runs(DAG_ID, start, end)
    assert sorted(runs) == [start, end]
    assert {(r.run_id, r.state, r.run_type) for r in runs.values()} == set(_rows(
        probe.db, "SELECT run_id, state, run_type FROM dag_run WHERE backfill_id = ?", backfill_id))
    assert all(r.logical_date == midnight(ds) for ds, r in runs.items())
    assert not probe.api.backfill_completed(backfill_id)  # no scheduler runs its runs
    assert probe.api.backfill_days(DAG_ID, start, end, "none") == []  # each day has its run now

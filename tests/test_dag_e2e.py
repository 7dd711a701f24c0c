"""One real gem_daily DagRun on SQLite, end to end: Airflow -> job subprocesses -> Delta tables.

Runs exactly what `make demo` runs (`airflow dags test`, in-process, no scheduler or API server)
with a throwaway AIRFLOW_HOME and a tiny config, then checks the run state in the metadata DB and
the Delta outputs of ds=2026-01-01. Slow: three Spark-job subprocesses (a few minutes on 2 cores).
"""

from __future__ import annotations

import os
import shlex
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gem.orchestration import REPO_ROOT, RETRIES_ENV, manual_logical_date

pytestmark = pytest.mark.slow

DS = "2026-01-01"
# CronDataIntervalTimetable + `dags test DATE` process the last complete day before DATE.
LOGICAL_DATE = manual_logical_date(DS)  # "2026-01-02"
# task id -> the command line it must have run (a window of 0 days makes the examples of DS ready
# in the same run, so every task does work).
COMMANDS = {
    "generate_events": f"-m jobs.generate_events --ds {DS}",
    "ingest_events": f"-m jobs.ingest_events --ds {DS}",
    "validate_events": f"-m jobs.validate_events --ds {DS}",
    "build_sequences": f"-m jobs.build_sequences --ds {DS}",
    "build_features": f"-m jobs.build_features --ds {DS}",
    "validate_silver": f"-m jobs.validate_silver --ds {DS}",
    "assemble_examples": f"-m jobs.assemble_examples --ready-on {DS}",
    "validate_examples": f"-m jobs.validate_silver --ready-on {DS} --examples",
    "mix": f"-m jobs.mix --ds {DS}",
}
# One day has no training day before its held-out day: the mix exits 99 and shows as skipped, and
# pretraining, which needs its manifest, is skipped with it (it never starts).
EXPECTED_STATES = {task: "success" for task in COMMANDS} | {"mix": "skipped", "pretrain": "skipped"}
JOBS = list(COMMANDS)
RUN_TIMEOUT_S = 1800


@dataclass(frozen=True)
class DagRunResult:
    returncode: int
    log: str
    seconds: float
    db: Path
    lakehouse: Path

    def tail(self, n: int = 6000) -> str:
        return self.log[-n:]


def _config(tmp: Path) -> Path:
    path = tmp / "gem.yaml"
    cfg = {
        "lakehouse_uri": str(tmp / "lakehouse"),
        "attribution_window_days": 0,
        "spark": {"master": "local[2]", "shuffle_partitions": 2, "driver_memory": "2g"},
        "generator": {
            "users": 300,
            "ads": 60,
            "advertisers": 10,
            "events_per_day": 3000,
            "chunk_impressions": 3000,
        },
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def dag_run(tmp_path_factory: pytest.TempPathFactory) -> DagRunResult:
    missing = [j for j in JOBS if not (REPO_ROOT / "jobs" / f"{COMMANDS[j].split()[1][5:]}.py").exists()]
    if missing:
        pytest.fail(f"jobs not written yet: {missing}; the DAG would fail at the first of them")
    tmp = tmp_path_factory.mktemp("dag_e2e")
    # A clean environment: nothing from the developer's Airflow home, DB or GEM__ overrides leaks in.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "GEM_"))}
    env |= {
        "AIRFLOW_HOME": str(tmp / "airflow_home"),
        "GEM_CONFIG": str(_config(tmp)),
        RETRIES_ENV: "0",  # a broken job fails the run now instead of after two 5-minute waits
    }
    py = shlex.quote(sys.executable)
    script = (
        "set -euo pipefail\n"
        ". infra/airflow/airflow_env.sh\n"
        "bash infra/airflow/init_db.sh > /dev/null\n"  # as make demo does: the DB and the gpu pool
        f"exec {py} -m airflow dags test gem_daily {LOGICAL_DATE}\n"
    )
    started = time.monotonic()
    out = subprocess.run(
        ["bash", "-c", script],
        check=False,
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    seconds = time.monotonic() - started
    (tmp / "dags_test.log").write_text(out.stdout)
    print(f"airflow db migrate + dags test took {seconds:.1f}s; log: {tmp / 'dags_test.log'}")
    return DagRunResult(
        returncode=out.returncode,
        log=out.stdout,
        seconds=seconds,
        db=tmp / "airflow_home" / "airflow.db",
        lakehouse=tmp / "lakehouse",
    )


def _query(db: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql, args).fetchall()


def test_dag_run_succeeded(dag_run: DagRunResult) -> None:
    assert dag_run.returncode == 0, dag_run.tail()
    runs = _query(
        dag_run.db,
        "SELECT state, logical_date, data_interval_start FROM dag_run WHERE dag_id = 'gem_daily'",
    )
    assert len(runs) == 1, runs
    state, logical_date, interval_start = runs[0]
    assert state == "success", dag_run.tail()
    assert logical_date.startswith(LOGICAL_DATE) and interval_start.startswith(DS), runs
    tis = dict(_query(dag_run.db, "SELECT task_id, state FROM task_instance WHERE dag_id = 'gem_daily'"))
    assert tis == EXPECTED_STATES, tis


def test_jobs_got_the_interval_start_ds(dag_run: DagRunResult) -> None:
    for task, command in COMMANDS.items():
        assert command in dag_run.log, f"{task} did not run `{command}`\n{dag_run.tail()}"


def test_bronze_and_completions(dag_run: DagRunResult, spark: Any) -> None:
    assert dag_run.returncode == 0, "the DAG run failed; see test_dag_run_succeeded"
    lake = str(dag_run.lakehouse)
    bronze = spark.read.format("delta").load(f"{lake}/bronze/ad_events")
    assert [str(r.ds) for r in bronze.select("ds").distinct().collect()] == [DS]
    bronze_rows = bronze.count()
    assert bronze_rows > 0

    quarantine = spark.read.format("delta").load(f"{lake}/bronze/quarantine")
    quarantined = quarantine.where(f"ds = DATE'{DS}'").count()
    assert quarantine.where(f"ds <> DATE'{DS}'").count() == 0

    done = {
        r.stage: r
        for r in spark.read.format("delta").load(f"{lake}/_ops/completions").where(f"ds = DATE'{DS}'").collect()
    }
    assert set(done) == {
        "ingest_events", "validate_events", "build_sequences", "build_features", "validate_silver",
        "assemble_examples", "validate_examples",
    }, sorted(done)
    ingest = done["ingest_events"]
    assert ingest.rows_written == bronze_rows
    assert ingest.rows_quarantined == quarantined
    assert ingest.rows_in == bronze_rows + quarantined
    # The generator plants ~1% dirty lines by default; ingest must have caught some.
    assert quarantined > 0


def test_user_sequences_cover_every_active_user(dag_run: DagRunResult, spark: Any) -> None:
    assert dag_run.returncode == 0, "the DAG run failed; see test_dag_run_succeeded"
    lake = str(dag_run.lakehouse)
    users = spark.read.format("delta").load(f"{lake}/bronze/ad_events").select("user_id").distinct().count()
    sequences = spark.read.format("delta").load(f"{lake}/silver/user_sequences").where(f"ds = DATE'{DS}'")
    assert sequences.count() == users
    assert sequences.where("n_impressions + n_clicks + n_conversions = 0").count() == 0


def test_training_examples_one_per_impression_with_labels(dag_run: DagRunResult, spark: Any) -> None:
    assert dag_run.returncode == 0, "the DAG run failed; see test_dag_run_succeeded"
    lake = str(dag_run.lakehouse)
    impressions = spark.read.format("delta").load(f"{lake}/bronze/ad_events").where("event_type = 'impression'")
    examples = spark.read.format("delta").load(f"{lake}/silver/training_examples")
    assert examples.count() == impressions.count()
    assert examples.select("impression_id").distinct().count() == examples.count()
    assert examples.where("label_click = 1").count() > 0

"""Two real gem_daily DagRuns on SQLite, end to end: Airflow -> job subprocesses -> Delta tables.

Runs exactly what `make demo` runs (`airflow dags test`, in-process, no scheduler or API server)
with a throwaway AIRFLOW_HOME and a tiny config, for two consecutive days: the first has no
training day before its held-out day (mix and pretraining are skipped), the second mixes day 1
(train) with day 2 (held out) and pretrains on it, so the main path through to gold.metrics runs
under Airflow. Slow: Spark-job subprocesses and a short CPU training (a few minutes on 2 cores).
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gem.data.delta_log import read_table
from gem.pipeline.airflow.orchestration import REPO_ROOT, manual_logical_date
from schemas.metrics import GOLD_METRICS
from tests.support import C1_JVM_CONF, airflow_test_env, query_db

pytestmark = pytest.mark.slow

DAYS = ("2026-01-01", "2026-01-02")
# CronDataIntervalTimetable + `dags test DATE` process the last complete day before DATE.
LOGICAL_DATES = tuple(manual_logical_date(ds) for ds in DAYS)  # "2026-01-02T00:00:01+00:00", ...
TRAIN_STEPS = 4


def task_log_lines(ds: str) -> dict[str, str]:
    """task id -> the line its task logs when it ran its stage for ds (gem.pipeline.airflow.orchestration.run_stage_task;
    a window of 0 days makes the examples of run day ds ready in the same run, so every stage
    processes ds itself)."""
    return {task: f"{task}: run day {ds} -> ds={ds} success" for task in (
        "generate_events", "ingest_events", "validate_events", "build_sequences", "build_features",
        "validate_silver", "assemble_examples", "validate_examples", "mix", "pretrain", "precompute")}


# Day 1 has no training day before its held-out day: the mix has nothing ready and is skipped, and
# pretraining, which needs its manifest, is skipped with it, and so is precompute. Day 2 runs every
# other task; distill needs precompute on its day and the day before, so it skips on both days.
# The landing sensor (no command of its own) passes at once: generate_events wrote the marker.
EXPECTED_STATES = {
    DAYS[0]: {task: "success" for task in task_log_lines(DAYS[0])}
    | {"wait_for_landing": "success", "mix": "skipped", "pretrain": "skipped", "precompute": "skipped",
       "distill": "skipped"},
    DAYS[1]: {task: "success" for task in task_log_lines(DAYS[1])}
    | {"wait_for_landing": "success", "distill": "skipped"},
}
RUN_TIMEOUT_S = 1800


@dataclass(frozen=True)
class DagRunResult:
    returncode: int
    log: str
    seconds: float
    db: Path
    lakehouse: Path
    config: Path

    def tail(self, n: int = 6000) -> str:
        return self.log[-n:]


def _config(tmp: Path) -> Path:
    path = tmp / "gem.yaml"
    cfg = {
        "lakehouse_uri": str(tmp / "lakehouse"),
        "attribution_window_days": 0,
        # As the demo: C1 only in the short-lived job JVMs (they start and warm faster).
        "spark": {"master": "local[2]", "shuffle_partitions": 2, "driver_memory": "2g",
                  "conf": C1_JVM_CONF},
        "generator": {
            "users": 300,
            "ads": 60,
            "advertisers": 10,
            "events_per_day": 3000,
            "chunk_impressions": 3000,
        },
        # As the demo: 2 days, day 1 trains and day 2 is held out; none is left to validate on.
        "mix": {"train_days": 1, "validation_days": 0},
        "loader": {"batch_size": 128, "num_workers": 0},
        "model": {"embeddings": {"backend": "torchrec"}},  # as the demo trains
        "train": {"steps": TRAIN_STEPS, "checkpoint_every": 2},
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


@pytest.fixture(scope="module")
def dag_run(tmp_path_factory: pytest.TempPathFactory) -> DagRunResult:
    tmp = tmp_path_factory.mktemp("dag_e2e")
    config = _config(tmp)
    env = airflow_test_env(tmp / "airflow_home", config)
    py = shlex.quote(sys.executable)
    script = "set -euo pipefail\n. infra/airflow/airflow_env.sh\n"
    script += "bash infra/airflow/init_db.sh > /dev/null\n"  # as make demo does: the DB and the gpu pool
    script += "".join(f"{py} -m airflow dags test gem_daily {d}\n" for d in LOGICAL_DATES)
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
    print(f"airflow db migrate + 2 x dags test took {seconds:.1f}s; log: {tmp / 'dags_test.log'}")
    return DagRunResult(
        returncode=out.returncode,
        log=out.stdout,
        seconds=seconds,
        db=tmp / "airflow_home" / "airflow.db",
        lakehouse=tmp / "lakehouse",
        config=config,
    )


def test_dag_runs_succeeded(dag_run: DagRunResult) -> None:
    assert dag_run.returncode == 0, dag_run.tail()
    runs = query_db(
        dag_run.db,
        "SELECT logical_date, data_interval_start, state FROM dag_run WHERE dag_id = 'gem_daily' ORDER BY logical_date",
    )
    # SQLite keeps "YYYY-MM-DD HH:MM:SS.ffffff": the logical date one second after the interval closes.
    assert [(r[0][:19], r[1][:10], r[2]) for r in runs] == [
        (logical[:19].replace("T", " "), ds, "success") for logical, ds in zip(LOGICAL_DATES, DAYS, strict=True)
    ], dag_run.tail()
    for ds in DAYS:
        tis = dict(query_db(
            dag_run.db,
            "SELECT t.task_id, t.state FROM task_instance t JOIN dag_run r ON r.run_id = t.run_id "
            "WHERE t.dag_id = 'gem_daily' AND substr(r.data_interval_start, 1, 10) = ?",
            ds,
        ))
        assert tis == EXPECTED_STATES[ds], (ds, tis)


def test_jobs_got_the_interval_start_ds(dag_run: DagRunResult) -> None:
    for ds in DAYS:
        for task, line in task_log_lines(ds).items():
            if EXPECTED_STATES[ds][task] == "success":
                assert line in dag_run.log, f"{task} did not log `{line}`\n{dag_run.tail()}"


def test_bronze_and_completions(dag_run: DagRunResult, spark: Any) -> None:
    assert dag_run.returncode == 0, "the DAG runs failed; see test_dag_runs_succeeded"
    lake = str(dag_run.lakehouse)
    bronze = spark.read.format("delta").load(f"{lake}/bronze/ad_events")
    assert sorted(str(r.ds) for r in bronze.select("ds").distinct().collect()) == list(DAYS)
    quarantine = spark.read.format("delta").load(f"{lake}/bronze/quarantine")
    completions = spark.read.format("delta").load(f"{lake}/_ops/completions")
    for ds in DAYS:
        bronze_rows = bronze.where(f"ds = DATE'{ds}'").count()
        quarantined = quarantine.where(f"ds = DATE'{ds}'").count()
        assert bronze_rows > 0
        done = {r.stage: r for r in completions.where(f"ds = DATE'{ds}'").collect()}
        expected = {"ingest_events", "validate_events", "build_sequences", "build_features", "validate_silver",
                    "assemble_examples", "validate_examples"} | ({"mix", "pretrain", "precompute"} if ds == DAYS[1] else set())
        assert set(done) == expected, (ds, sorted(done))
        ingest = done["ingest_events"]
        assert ingest.rows_written == bronze_rows
        assert ingest.rows_quarantined == quarantined
        assert ingest.rows_in == bronze_rows + quarantined
        # Every record went through the one commit path: counts checked where the stage has an
        # input count of its own, and a reason where it has none.
        for stage, record in done.items():
            assert (record.rows_in is None) == (record.reconciliation != "checked"), (stage, record.reconciliation)
        assert done["assemble_examples"].reconciliation == "checked"
        if "pretrain" in done:  # it trained on that day's mixture: the record names its version
            assert set(done["pretrain"].input_versions) == {f"mix:gold.mixture_manifest@{ds}"}
        # The generator plants ~1% dirty lines by default; ingest must have caught some.
        assert quarantined > 0


def test_user_sequences_cover_every_active_user(dag_run: DagRunResult, spark: Any) -> None:
    assert dag_run.returncode == 0, "the DAG runs failed; see test_dag_runs_succeeded"
    lake = str(dag_run.lakehouse)
    bronze = spark.read.format("delta").load(f"{lake}/bronze/ad_events")
    sequences = spark.read.format("delta").load(f"{lake}/silver/user_sequences")
    for ds in DAYS:  # a day's partition holds exactly the users active that day
        users = bronze.where(f"ds = DATE'{ds}'").select("user_id").distinct().count()
        day = sequences.where(f"ds = DATE'{ds}'")
        assert day.count() == users
        assert day.where("n_impressions + n_clicks + n_conversions = 0").count() == 0


def test_training_examples_one_per_impression_with_labels(dag_run: DagRunResult, spark: Any) -> None:
    assert dag_run.returncode == 0, "the DAG runs failed; see test_dag_runs_succeeded"
    lake = str(dag_run.lakehouse)
    impressions = spark.read.format("delta").load(f"{lake}/bronze/ad_events").where("event_type = 'impression'")
    examples = spark.read.format("delta").load(f"{lake}/silver/training_examples")
    assert examples.count() == impressions.count()
    assert examples.select("impression_id").distinct().count() == examples.count()
    assert examples.where("label_click = 1").count() > 0


def test_pretraining_wrote_held_out_metrics(dag_run: DagRunResult) -> None:
    """The second run's pretraining scored the held-out day (day 2) into gold.metrics: one row per
    task, read outside Spark with the partition column restored from the Delta log."""
    assert dag_run.returncode == 0, "the DAG runs failed; see test_dag_runs_succeeded"
    rows = read_table(GOLD_METRICS.path(str(dag_run.lakehouse))).to_pylist()
    assert rows, "gold.metrics is empty"
    assert {r["ds"].isoformat() for r in rows} == {DAYS[1]}
    assert len({r["run_id"] for r in rows}) == 1
    assert len({r["task"] for r in rows}) == len(rows)  # one row per task
    assert {r["train_steps"] for r in rows} == {TRAIN_STEPS}
    click = [r for r in rows if r["task"].endswith("/click") and r["auc"] is not None]
    assert click and all(0.0 <= r["auc"] <= 1.0 and r["ne"] > 0 for r in click)
    assert f"trained {TRAIN_STEPS} steps" in dag_run.log

"""Airflow's real scheduler runs two daily intervals of imported MovieLens-format data to success.

Not `dags test`: an API server (the execution API the tasks report to), the DAG processor and the
scheduler with LocalExecutor run as separate processes on a throwaway SQLite metadata DB, and a test
copy of the DAG (gem.pipeline.airflow.daily_dag under another id) starts two intervals back with catchup on, so the
scheduler itself creates both runs, in order. The source is `landing` (configs/movielens.yaml):
MovieLens-format ratings written by this test for those two days are imported with `gem
import-movielens`; generate_events skips, and the landing sensor waits in reschedule mode for the
second day's `_SUCCESS`, which the test withholds until the sensor has been rescheduled once.

Checked: both runs scheduled and successful, every task's state, the reschedule, the Assets the
tasks updated, and the imported events in bronze and the training examples, counted from the
ratings this test wrote. Slow: about 14 Spark-job subprocesses and a short CPU training.
"""

from __future__ import annotations

import datetime as dt
import os
import random
import shutil
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from bench.backfill import free_port
from gem.data.delta_log import read_table
from gem.lakehouse.landing import marker_uri
from gem.pipeline.airflow.orchestration import LANDING_POKE_ENV, REPO_ROOT
from gem.pipeline.airflow.scheduler import scheduler_stack
from gem.pipeline.command import app
from schemas.metrics import GOLD_METRICS
from tests.support import C1_JVM_CONF, DAG_OUTLETS, airflow_test_env, query_db

# The scheduler's run of both days counts against the first test's timeout: on 2 cores shared with
# other work, two days can take longer than pytest's 30-minute default.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

DAG_ID = "gem_daily_scheduled"
# Both intervals are complete now: [D1, D2) ran after D2 00:00 and [D2, today) after today 00:00.
TODAY = dt.datetime.now(dt.UTC).date()
DAYS = ((TODAY - dt.timedelta(days=2)).isoformat(), (TODAY - dt.timedelta(days=1)).isoformat())
RUN_TIMEOUT_S = 3300
TRAIN_STEPS = 4
# Every task of a run and its final state; generate_events skips under `source: landing`, and the
# first day has no training day before its held-out day (mix, pretraining and precompute skip).
EXPECTED_STATES = {
    DAYS[0]: {"generate_events": "skipped", "wait_for_landing": "success", "ingest_events": "success",
              "validate_events": "success", "build_sequences": "success", "build_features": "success",
              "validate_silver": "success", "assemble_examples": "success", "validate_examples": "success",
              "mix": "skipped", "pretrain": "skipped", "precompute": "skipped",
              # Distill needs precompute on its day and the day before: it skips on both days here.
              "distill": "skipped"},
}
EXPECTED_STATES[DAYS[1]] = EXPECTED_STATES[DAYS[0]] | {"mix": "success", "pretrain": "success", "precompute": "success"}
# --- MovieLens-format input ------------------------------------------------------------------------

GENRES = ("Action", "Comedy", "Drama", "Horror", "Animation", "Romance", "Thriller", "Documentary")
USERS, MOVIES, RATINGS_PER_DAY = 120, 40, 900


def write_movielens(folder: Path, days: tuple[str, ...], seed: int = 5) -> dict[str, Counter[str]]:
    """An ml-1m-format folder (ratings.dat, movies.dat, users.dat) with RATINGS_PER_DAY ratings on
    each day; -> day -> events the import must land (impressions, clicks for ratings >= 4,
    conversions for 5s), counted here from the ratings written."""
    rng = random.Random(seed)
    folder.mkdir(parents=True)
    (folder / "movies.dat").write_text("".join(
        f"{m}::Movie {m} ({1950 + m})::{GENRES[m % len(GENRES)]}|{GENRES[(m + 3) % len(GENRES)]}\n"
        for m in range(1, MOVIES + 1)), encoding="latin-1")
    (folder / "users.dat").write_text("".join(
        f"{u}::{'MF'[u % 2]}::{(18, 25, 35, 45)[u % 4]}::{u % 21}::{10000 + u}\n" for u in range(1, USERS + 1)))
    lines, expected = [], {}
    seen: set[tuple[int, int]] = set()  # MovieLens has one rating per (user, movie)
    for day in days:
        midnight = int(dt.datetime.fromisoformat(day).replace(tzinfo=dt.UTC).timestamp())
        counts: Counter[str] = Counter()
        while counts["impression"] < RATINGS_PER_DAY:
            user, movie = rng.randint(1, USERS), rng.randint(1, MOVIES)
            if (user, movie) in seen:
                continue
            seen.add((user, movie))
            rating = rng.choices((1, 2, 3, 4, 5), weights=(5, 10, 25, 35, 25))[0]
            lines.append(f"{user}::{movie}::{rating}::{midnight + rng.randrange(86_400)}\n")
            counts.update(["impression"] + ["click"] * (rating >= 4) + ["conversion"] * (rating == 5))
        expected[day] = counts
    (folder / "ratings.dat").write_text("".join(lines))
    return expected


# --- the run -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SchedulerRun:
    db: Path
    lakehouse: Path
    logs: Path
    expected_events: dict[str, Counter[str]]
    finished: bool

    def tail(self) -> str:
        return "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(self.logs.glob("*.log")))


def _config(tmp: Path) -> Path:
    """configs/movielens.yaml with a throwaway lakehouse, the test's first day and small jobs."""
    cfg = yaml.safe_load((REPO_ROOT / "configs" / "movielens.yaml").read_text())
    cfg |= {
        "lakehouse_uri": str(tmp / "lakehouse"),
        "start_ds": DAYS[0],
        "spark": {"master": "local[2]", "shuffle_partitions": 2, "driver_memory": "2g",
                  "conf": C1_JVM_CONF},
        "mix": {"train_days": 1, "validation_days": 0},  # day 1 trains, day 2 is held out
        "loader": {"batch_size": 128, "num_workers": 0},
        "train": {"steps": TRAIN_STEPS, "checkpoint_every": 2},
    }
    path = tmp / "gem.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _dag_copy(folder: Path) -> None:
    """The test copy of the DAG: the real builder, starting two intervals back, catchup on."""
    folder.mkdir()
    start = dt.datetime.fromisoformat(DAYS[0])
    (folder / f"{DAG_ID}.py").write_text(
        '"""Test copy of the gem_daily Airflow DAG: starts two intervals back, catchup on."""\n'
        "import datetime as dt\n\nfrom gem.pipeline.airflow.daily_dag import daily_dag\n\n"
        f"dag = daily_dag({DAG_ID!r}, start=dt.datetime({start.year}, {start.month}, {start.day}, tzinfo=dt.UTC), "
        "catchup=True)\n"
    )


def _states(db: Path) -> dict[str, dict[str, str]]:
    """ds -> task -> state of the test DAG's runs (ds: the data interval's start day)."""
    rows = query_db(db, "SELECT substr(r.data_interval_start, 1, 10), t.task_id, t.state FROM task_instance t "
                        "JOIN dag_run r ON r.dag_id = t.dag_id AND r.run_id = t.run_id WHERE t.dag_id = ?", DAG_ID)
    out: dict[str, dict[str, str]] = {}
    for ds, task, state in rows:
        out.setdefault(ds, {})[task] = state
    return out


def _run_states(db: Path) -> list[tuple[str, str, str]]:
    return [(ds, run_type, state) for ds, run_type, state in query_db(
        db, "SELECT substr(data_interval_start, 1, 10), run_type, state FROM dag_run WHERE dag_id = ? "
            "ORDER BY data_interval_start", DAG_ID)]


@pytest.fixture(scope="module")
def scheduler_run(tmp_path_factory: pytest.TempPathFactory) -> SchedulerRun:
    tmp = tmp_path_factory.mktemp("scheduler")
    config = _config(tmp)
    expected = write_movielens(tmp / "ml-1m", DAYS)
    imported = CliRunner().invoke(app, ["import-movielens", str(tmp / "ml-1m"), "--config", str(config)])
    assert imported.exit_code == 0, imported.output
    # Withhold day 2's marker: its run's sensor must wait (reschedule) until the test puts it back.
    marker = marker_uri(str(tmp / "lakehouse" / "_landing"), DAYS[1])
    held = tmp / "held_SUCCESS"
    shutil.move(marker, held)

    _dag_copy(tmp / "dags")
    logs = tmp / "logs"
    logs.mkdir()
    home = tmp / "airflow_home"
    env = airflow_test_env(home, config, **{
        LANDING_POKE_ENV: "5",
        # Free ports, never another Airflow's on this machine: the API server, the workers' log server.
        "GEM_AIRFLOW_PORT": str(free_port()),
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__API_AUTH__JWT_SECRET": "gem-scheduler-test-" + "0" * 45,  # 64 bytes, as HS512 wants
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
    })
    subprocess.run(["bash", "-c", ". infra/airflow/airflow_env.sh && bash infra/airflow/init_db.sh > /dev/null"],
                   cwd=REPO_ROOT, env=env, check=True, timeout=600)
    db = home / "airflow.db"
    finished = False
    deadline = time.monotonic() + RUN_TIMEOUT_S
    # The scheduler makes the runs itself (catchup of the copy's two intervals); only this test's DAG.
    with scheduler_stack(env, logs, scheduled_runs=True, dags_folder=tmp / "dags") as procs:
        while time.monotonic() < deadline and all(p.poll() is None for p in procs):
            time.sleep(10)
            if held.exists() and _states(db).get(DAYS[1], {}).get("wait_for_landing") == "up_for_reschedule":
                shutil.move(held, marker)  # the sensor waited; let day 2 through
            runs = _run_states(db)
            if len(runs) == 2 and all(state in ("success", "failed") for *_, state in runs):
                finished = True
                break
            if any(state == "failed" for *_, state in runs):
                break
    return SchedulerRun(db, tmp / "lakehouse", logs, expected, finished)


def test_the_scheduler_ran_both_intervals_to_success(scheduler_run: SchedulerRun) -> None:
    assert scheduler_run.finished, scheduler_run.tail()
    assert _run_states(scheduler_run.db) == [(ds, "scheduled", "success") for ds in DAYS], scheduler_run.tail()
    assert _states(scheduler_run.db) == EXPECTED_STATES


def test_the_sensor_waited_for_the_withheld_marker(scheduler_run: SchedulerRun) -> None:
    """Day 2's sensor found no `_SUCCESS`, gave its slot back (a reschedule row), then passed."""
    rescheduled = query_db(
        scheduler_run.db,
        "SELECT substr(r.data_interval_start, 1, 10), count(*) FROM task_reschedule tr "
        "JOIN task_instance t ON t.id = tr.ti_id JOIN dag_run r ON r.dag_id = t.dag_id AND r.run_id = t.run_id "
        "WHERE t.dag_id = ? AND t.task_id = 'wait_for_landing' GROUP BY 1", DAG_ID)
    assert dict(rescheduled).get(DAYS[1], 0) >= 1, rescheduled
    assert DAYS[0] not in dict(rescheduled)  # day 1's marker was there: no wait


def test_tasks_updated_their_tables_assets(scheduler_run: SchedulerRun) -> None:
    rows = query_db(
        scheduler_run.db,
        "SELECT substr(r.data_interval_start, 1, 10), e.source_task_id, a.name FROM asset_event e "
        "JOIN asset a ON a.id = e.asset_id JOIN dag_run r ON r.dag_id = e.source_dag_id AND r.run_id = e.source_run_id "
        "WHERE e.source_dag_id = ?", DAG_ID)
    for ds in DAYS:
        updated: dict[str, set[str]] = {}
        for day, task, asset in rows:
            if day == ds:
                updated.setdefault(task, set()).add(asset)
        ran = {t for t, state in EXPECTED_STATES[ds].items() if state == "success"}
        assert updated == {t: tables for t, tables in DAG_OUTLETS.items() if t in ran}, (ds, updated)


def test_imported_events_became_bronze_and_examples(scheduler_run: SchedulerRun, spark) -> None:
    """Every imported event of each day is in bronze (MovieLens has no dirty rows), and each
    impression became one training example; the second run pretrained on day 1 and scored day 2."""
    assert scheduler_run.finished, scheduler_run.tail()
    lake = str(scheduler_run.lakehouse)
    bronze = spark.read.format("delta").load(f"{lake}/bronze/ad_events")
    examples = spark.read.format("delta").load(f"{lake}/silver/training_examples")
    for ds in DAYS:
        by_type = {r.event_type: r["count"] for r in bronze.where(f"ds = DATE'{ds}'").groupBy("event_type").count().collect()}
        assert by_type == dict(scheduler_run.expected_events[ds]), ds
        assert examples.where(f"ds = DATE'{ds}'").count() == scheduler_run.expected_events[ds]["impression"]
    metrics = read_table(GOLD_METRICS.path(lake)).to_pylist()
    assert {r["ds"].isoformat() for r in metrics} == {DAYS[1]} and {r["train_steps"] for r in metrics} == {TRAIN_STEPS}

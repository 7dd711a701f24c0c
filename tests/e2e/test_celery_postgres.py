"""The daily DAG on a distributed Airflow: the CeleryExecutor with two workers on a Redis broker, the
metadata DB on PostgreSQL (gem.pipeline.airflow.stack.local_airflow: every service started here, in
temporary folders on free loopback ports).

A small world with a one-day attribution window, so a day's examples are assembled by the next day's
run, once the conversions that arrive the day after their impressions are in:
  day 1      one run triggered through the REST API (its examples wait for day 2);
  days 2-4   `gem backfill` through the `gem` command, given the cluster's environment (its REST API,
             its scheduler: the command starts neither).
Checked: every run succeeded; the task instances (REST API, hostname) ran on both workers and only
there; day 1's run wrote no examples of day 1, and day 2's run attributed to a day-1 impression a
conversion that arrived and happened on day 2.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from pathlib import Path

import pyarrow.compute as pc
import pytest

from bench.backfill import gem_backfill
from gem.config import load_config
from gem.data.delta_log import read_table
from gem.days import day_range
from gem.lakehouse.tables import table_exists
from gem.pipeline.airflow.api import TaskRun, airflow_api
from gem.pipeline.airflow.orchestration import DAG_ID
from gem.pipeline.airflow.stack import trigger_day, unpause, wait_for_run
from gem.sources.small_world import START_DS
from schemas.events import BRONZE_AD_EVENTS
from schemas.examples import SILVER_TRAINING_EXAMPLES
from tests.celery_support import cluster_on, small_world

pytestmark = [pytest.mark.slow, pytest.mark.timeout(5400)]

DAYS = day_range(START_DS, "2026-01-04")
RUN_TIMEOUT_S = 1800


@dataclass(frozen=True)
class ClusterRuns:
    cfg_path: Path
    day_one_state: str
    day_one_examples: int  # rows of day 1 in silver.training_examples after day 1's run
    backfill_code: int
    backfill_output: str
    runs: dict[str, str]  # ds -> state of its newest run
    tasks: dict[str, list[TaskRun]]  # ds -> the task instances of its newest run
    workers: list[str]


def examples_of(cfg_path: Path, ds: str) -> int:
    path = SILVER_TRAINING_EXAMPLES.path(load_config(str(cfg_path)).lakehouse_uri)
    return read_table(path, where={"ds": ds}).num_rows if table_exists(path) else 0


@pytest.fixture(scope="module")
def cluster_runs(tmp_path_factory: pytest.TempPathFactory) -> ClusterRuns:
    root = tmp_path_factory.mktemp("celery")
    cfg_path = small_world(root / "world", attribution_window_days=1)
    with cluster_on(root, cfg_path) as running:
        env = running.airflow.environment()
        with airflow_api(env, root / "client-api-server.log") as api:
            unpause(api)
            day_one = wait_for_run(api, trigger_day(api, DAYS[0]), RUN_TIMEOUT_S)
            day_one_examples = examples_of(cfg_path, DAYS[0])
            done = gem_backfill(env, DAYS[1], DAYS[-1])
            newest = {ds: api.newest_run(DAG_ID, ds) for ds in DAYS}
            tasks = {ds: api.task_runs(DAG_ID, run.run_id) for ds, run in newest.items() if run is not None}
        return ClusterRuns(cfg_path, day_one.state, day_one_examples, done.returncode, done.stdout + done.stderr,
                           {ds: run.state for ds, run in newest.items() if run is not None}, tasks,
                           running.airflow.worker_names())


def test_the_day_and_the_backfill_succeed(cluster_runs: ClusterRuns) -> None:
    assert cluster_runs.day_one_state == "success"
    assert cluster_runs.backfill_code == 0, cluster_runs.backfill_output[-4000:]
    assert f"backfill {DAYS[1]}..{DAYS[-1]}: success" in cluster_runs.backfill_output
    assert cluster_runs.runs == dict.fromkeys(DAYS, "success")


def test_tasks_ran_on_both_workers_and_only_there(cluster_runs: ClusterRuns) -> None:
    ran = [t for tasks in cluster_runs.tasks.values() for t in tasks if t.state in ("success", "failed")]
    hosts = {t.hostname for t in ran}
    assert hosts == set(cluster_runs.workers), hosts
    per_day = {ds: sorted({t.hostname for t in tasks if t.hostname}) for ds, tasks in cluster_runs.tasks.items()}
    assert any(len(h) == 2 for h in per_day.values()), per_day  # both within one run too


def test_a_conversion_arriving_the_next_day_labels_the_impression_of_the_day_before(cluster_runs: ClusterRuns) -> None:
    """Day 1's examples wait for day 2's run; then a day-1 impression counts a conversion that
    happened and arrived on day 2, and no conversion of its user and ad arrived earlier."""
    assert cluster_runs.day_one_examples == 0
    lake = load_config(str(cluster_runs.cfg_path)).lakehouse_uri
    examples = read_table(SILVER_TRAINING_EXAMPLES.path(lake), where={"ds": DAYS[0]},
                          columns=["user_id", "ad_id", "attributed_conversions"]).to_pylist()
    assert examples, "day 2's run assembled no examples of day 1"
    events = read_table(BRONZE_AD_EVENTS.path(lake), where={"ds": DAYS[:2]},
                        columns=["event_type", "event_time", "user_id", "ad_id", "ds"])
    conversions = events.filter(pc.equal(events["event_type"], "conversion")).to_pylist()
    on_day_two = {(c["user_id"], c["ad_id"]) for c in conversions
                  if c["ds"].isoformat() == DAYS[1] and c["event_time"].date() == dt.date.fromisoformat(DAYS[1])}
    earlier = {(c["user_id"], c["ad_id"]) for c in conversions if c["ds"].isoformat() == DAYS[0]}
    late = [e for e in examples if e["attributed_conversions"] > 0
            and (e["user_id"], e["ad_id"]) in on_day_two - earlier]
    assert late, f"no day-1 example labelled by a day-2 conversion ({len(on_day_two)} day-2 conversions)"

"""Faults on the distributed Airflow (CeleryExecutor, two workers, Redis broker, PostgreSQL metadata
DB; gem.pipeline.airflow.stack.local_airflow), during a small world's two daily runs:

  day 1   the scheduler is restarted while ingest_events runs; later PostgreSQL is shut down while
          build_sequences runs, until its worker has given the task up (the task's calls to the API
          server fail): that try fails, its log naming the database error the API server answered;
          once the database is back, the scheduler, API server and DAG processor are restarted (as
          a supervisor would) and the run completes;
  day 2   the worker running pretraining is SIGKILLed with every process under it (a node lost)
          once pretraining saved its first checkpoint; later the worker running precompute is
          killed while precompute's Spark task waits at a hold point (gem.faults: GEM_HOLD_AT). Each
          killed task is retried on the other worker within two minutes (the scheduler's task
          heartbeat timeout is 30 s here), and right after each kill every unit of commit a reader
          sees (a table's day, a precompute shard of it) equals the clean run's and no completion
          record claims the killed stage's day; the killed worker is then started again.

The clean run: the same days through the bulk path into a lakehouse of their own. After the faults,
every table equals the clean run's (run ids, times, versions and paths aside: gem.lakehouse.compare's
NOT_COMPARED). Task retries: 2, five seconds apart.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import pytest

from drills.faults import differing_tables, last_checkpoint_step, recorded, table_units
from gem.config import REPO_ROOT, load_config
from gem.days import day_range
from gem.environment import HOLD_AT_ENV, HOLD_RELEASE_ENV, RETRIES_ENV, RETRY_DELAY_ENV
from gem.pipeline.airflow.api import AirflowApi, TaskRun, airflow_api
from gem.pipeline.airflow.orchestration import DAG_ID
from gem.pipeline.airflow.stack import (
    API_SERVER,
    DAG_PROCESSOR,
    SCHEDULER,
    AirflowCluster,
    TaskTry,
    processes_under,
    task_tries,
    trigger_day,
    unpause,
    wait_for_run,
)
from gem.sources.small_world import START_DS
from schemas.ops import COMPLETIONS
from tests.celery_support import cluster_on, small_world

pytestmark = [pytest.mark.slow, pytest.mark.timeout(7200)]

DAYS = day_range(START_DS, "2026-01-02")
# Pretraining long enough that a kill after its first checkpoint lands mid-training.
TRAIN = {"steps": 60, "checkpoint_every": 6}
HEARTBEAT_TIMEOUT_S = 30
RETRY_WITHIN_S = 120.0
HOLD = "precompute:shard=0:attempt=0"
RUN_TIMEOUT_S = 2400.0
WAIT_S = 1200.0
OUTAGE_S = 900.0
# What a Celery worker's log says when the supervisor of a task has ended its workload (Airflow's words).
WORKLOAD_DONE = "Workload finished"


@dataclass
class Kill:
    stage: str
    killed_host: str
    killed_at: float
    visible_differences: list[str]  # units of commit a reader saw right after the kill that differ from the clean run's
    recorded_after_kill: bool  # a completion record claimed (stage, day) right after the kill
    tries: list[TaskTry] = field(default_factory=list)  # every try of the killed task
    retry_started_s: float | None = None  # seconds from the kill to the start of the try on the other worker


@dataclass
class Drill:
    runs: dict[str, str] = field(default_factory=dict)  # ds -> final state of its run
    restarted_during: str | None = None  # the task running when the scheduler was restarted
    kills: list[Kill] = field(default_factory=list)
    outage_task: str | None = None
    outage_tries: list[TaskTry] = field(default_factory=list)
    outage_log: str = ""
    differing: list[str] = field(default_factory=list)
    logs: Path | None = None

    def summary(self) -> str:
        """What happened in each fault, for a person reading the run (`pytest -s`)."""
        def tries(ts: list[TaskTry]) -> str:
            return ", ".join(f"try {t.number} on {t.task.hostname}: {t.task.state}" for t in ts)
        lines = [f"runs: {self.runs}", f"scheduler restarted while {self.restarted_during} ran"]
        for k in self.kills:
            retry = "no retry" if k.retry_started_s is None else f"retry started {k.retry_started_s:.0f}s after the kill"
            lines.append(f"{k.stage}: worker {k.killed_host} SIGKILLed; {tries(k.tries)}; {retry}; visible right after "
                         f"the kill and not the clean run's: {k.visible_differences or 'nothing'}; a completion record "
                         f"of the killed stage: {k.recorded_after_kill}")
        lines.append(f"PostgreSQL down while {self.outage_task} ran: {tries(self.outage_tries)}")
        lines.append(f"tables not equal to the clean run's: {self.differing or 'none'}")
        return "\n".join(f"  {line}" for line in lines)


def wait_until(what: str, check: Callable[[], Any], timeout_s: float = WAIT_S, poll_s: float = 1.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(poll_s)
    pytest.fail(f"waited {timeout_s:.0f}s for {what}")


def running_task(api: AirflowApi, run_id: str, task_id: str | None = None) -> TaskRun | None:
    """A task of the run in state running (`task_id`, else any), with the host it runs on."""
    return next((t for t in api.task_runs(DAG_ID, run_id)
                 if t.state == "running" and t.hostname and task_id in (None, t.task_id)), None)


def under_worker(cluster: AirflowCluster, host: str, command: str) -> list[psutil.Process]:
    """The processes under a worker's tree whose command line holds `command`."""
    index = cluster.worker_names().index(host) + 1
    found = []
    for process in processes_under(cluster.processes[f"worker-{index}"]):
        try:
            if command in " ".join(process.cmdline()):
                found.append(process)
        except psutil.Error:
            continue
    return found


def not_clean(now: dict, clean: dict) -> list[str]:
    """The units of commit (drills.faults.table_units) a reader sees now that are not the clean run's.
    A day's completion records are one row per stage, each committed on its own: every record seen
    must be one of the clean run's; every other unit must equal the clean run's."""
    return [str(key) for key, rows in now.items()
            if (not set(rows) <= set(clean.get(key, ())) if key[0] == COMPLETIONS.name else rows != clean.get(key))]


def lost_node(cluster: AirflowCluster, api: AirflowApi, run_id: str, task: TaskRun, cfg_path: Path, clean: dict,
              ds: str, before_restart: Callable[[], None] = lambda: None) -> Kill:
    """SIGKILL the worker running `task`, look at what a reader sees, wait for the retry on the other
    worker, then start the killed worker again."""
    index = cluster.worker_names().index(task.hostname) + 1
    cluster.kill_worker(index)
    killed_at = time.time()
    now = table_units(Path(load_config(str(cfg_path)).lakehouse_uri))
    kill = Kill(task.task_id, task.hostname, killed_at, visible_differences=not_clean(now, clean),
                recorded_after_kill=recorded(cfg_path, task.task_id, ds))
    before_restart()

    def retried() -> list[TaskTry] | None:
        tries = task_tries(api, DAG_ID, run_id, task.task_id)
        later = [t for t in tries if t.task.hostname and t.task.hostname != task.hostname and t.task.start]
        return tries if later else None

    kill.tries = wait_until(f"{task.task_id} retried on another worker", retried, poll_s=2.0)
    first_other = min(t.task.start for t in kill.tries if t.task.hostname != task.hostname and t.task.start)
    kill.retry_started_s = first_other.timestamp() - killed_at
    cluster.restart(f"worker-{index}")
    return kill


@pytest.fixture(scope="module")
def drill(tmp_path_factory: pytest.TempPathFactory) -> Drill:
    root = tmp_path_factory.mktemp("celery-faults")
    clean_cfg = small_world(root / "clean", train=TRAIN)
    cfg_path = small_world(root / "drill", train=TRAIN)
    bulk = subprocess.run([sys.executable, "-m", "gem", "bulk", "--start", DAYS[0], "--end", DAYS[-1],
                           "--config", str(clean_cfg)], cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    assert bulk.returncode == 0, bulk.stdout[-3000:] + bulk.stderr[-3000:]
    clean = table_units(Path(load_config(str(clean_cfg)).lakehouse_uri))
    release = root / "release-hold"
    settings = {RETRIES_ENV: "2", RETRY_DELAY_ENV: "5",
                "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT_S),
                "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL": "5",
                HOLD_AT_ENV: HOLD, HOLD_RELEASE_ENV: str(release)}
    result = Drill()
    with cluster_on(root / "cluster", cfg_path, **settings) as running:
        cluster = running.airflow
        result.logs = cluster.logs
        with airflow_api(cluster.environment(), root / "client-api-server.log") as api:
            unpause(api)

            # Day 1: the scheduler restarted while a task runs, then PostgreSQL down while another
            # runs and back; the supervisor restarts Airflow's processes.
            run_id = trigger_day(api, DAYS[0])
            task = wait_until("ingest_events running", lambda: running_task(api, run_id, "ingest_events"))
            result.restarted_during = task.task_id
            cluster.restart(SCHEDULER)
            task = wait_until("build_sequences running", lambda: running_task(api, run_id, "build_sequences"))
            result.outage_task = task.task_id
            worker_log = cluster.logs / f"worker-{cluster.worker_names().index(task.hostname) + 1}.log"
            logged = worker_log.stat().st_size
            running.postgres.shut_down()
            # Down until the worker has given the task up (its one task slot's workload ended).
            wait_until("the worker to give the task up", lambda: WORKLOAD_DONE in worker_log.read_bytes()[logged:].decode(
                errors="replace"), timeout_s=OUTAGE_S)
            running.postgres.resume()
            cluster.restart(API_SERVER, SCHEDULER, DAG_PROCESSOR)
            result.runs[DAYS[0]] = wait_for_run(api, run_id, RUN_TIMEOUT_S).state
            result.outage_tries = task_tries(api, DAG_ID, run_id, task.task_id)
            failed = [t for t in result.outage_tries if t.task.state == "failed"] or result.outage_tries[:1]
            log = (Path(cluster.env["AIRFLOW_HOME"]) / "logs" / f"dag_id={DAG_ID}" / f"run_id={run_id}"
                   / f"task_id={task.task_id}" / f"attempt={failed[0].number}.log")
            result.outage_log = log.read_text(errors="replace") if log.exists() else f"(no {log})"

            # Day 2: lost nodes during pretraining and during precompute's Spark task.
            run_id = trigger_day(api, DAYS[1])
            task = wait_until("pretraining past its first checkpoint", lambda: (
                last_checkpoint_step(cfg_path, DAYS[1]) is not None and running_task(api, run_id, "pretrain")),
                poll_s=0.5)
            result.kills.append(lost_node(cluster, api, run_id, task, cfg_path, clean, DAYS[1]))
            task = wait_until("precompute's Spark task held", lambda: (
                (t := running_task(api, run_id, "precompute")) and under_worker(cluster, t.hostname, "pyspark.daemon") and t))
            time.sleep(5)  # the shard's Python worker reaches its hold point
            result.kills.append(lost_node(cluster, api, run_id, task, cfg_path, clean, DAYS[1],
                                          before_restart=release.touch))
            result.runs[DAYS[1]] = wait_for_run(api, run_id, RUN_TIMEOUT_S).state
            for kill in result.kills:  # every try, as they ended
                kill.tries = task_tries(api, DAG_ID, run_id, kill.stage)

    result.differing = differing_tables(table_units(Path(load_config(str(cfg_path)).lakehouse_uri)), clean)
    print("== the fault drills ==", result.summary(), sep="\n")
    return result


def test_every_run_completes(drill: Drill) -> None:
    assert drill.runs == dict.fromkeys(DAYS, "success"), drill.logs


def test_a_killed_worker_s_task_is_retried_on_the_other_within_two_minutes(drill: Drill) -> None:
    assert [k.stage for k in drill.kills] == ["pretrain", "precompute"]
    for kill in drill.kills:
        hosts = [t.task.hostname for t in kill.tries]
        assert hosts[0] == kill.killed_host and kill.tries[0].task.state == "failed", (kill.stage, kill.tries)
        assert kill.tries[-1].task.state == "success" and hosts[-1] != kill.killed_host, (kill.stage, kill.tries)
        assert kill.retry_started_s is not None and kill.retry_started_s < RETRY_WITHIN_S, (kill.stage, kill.retry_started_s)


def test_nothing_partial_is_visible_after_a_kill(drill: Drill) -> None:
    for kill in drill.kills:
        assert kill.visible_differences == [], (kill.stage, kill.visible_differences)
        assert not kill.recorded_after_kill, kill.stage


def test_a_database_outage_fails_the_running_task_with_a_clear_error_and_the_run_completes(drill: Drill) -> None:
    states = [t.task.state for t in drill.outage_tries]
    assert states[0] == "failed" and states[-1] == "success", drill.outage_tries
    assert "Database error" in drill.outage_log, drill.outage_log[-3000:]


def test_the_days_tables_equal_a_clean_run_s(drill: Drill) -> None:
    assert drill.differing == []

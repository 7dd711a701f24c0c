"""Solaris precompute on a standalone Spark cluster (a master and two workers from pyspark's
distribution, each on its own loopback address: gem.pipeline.services.SparkCluster), elastic the
way Spark is, and the tables the same as local mode's:

- dynamic allocation: the application starts with one executor and every shard task is held back
  (gem.faults.hold_point) until Spark has added a second one for the queued tasks; the tasks then
  run on both;
- speculation: the first attempt of shard 0 never finishes; Spark starts a copy on the other worker,
  which completes the day.

Slow tier: each test starts a Spark application whose executors import torch and load the model.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from gem.config import GemConfig, load_config
from gem.environment import HOLD_AT_ENV, HOLD_RELEASE_ENV
from gem.lakehouse.commit import StageContext
from gem.lakehouse.compare import NOT_COMPARED
from gem.pipeline.services import SparkCluster
from gem.precompute.run import run
from schemas.precompute import GOLD_PRECOMPUTE_STATS, PRECOMPUTE_TABLES
from tests.precompute_lakehouse import build_days, precompute_config, promote_model
from tests.support import PYTHON, REPO, finished_tasks, lakehouse_rows, spark_events, subprocess_env

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("spark")]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> SparkCluster:
    with SparkCluster(tmp_path_factory.mktemp("cluster-logs")) as started:
        yield started


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[GemConfig, str]:
    """Day 2 precomputed in local mode on the suite's session: (its config, the day)."""
    cfg = precompute_config(tmp_path_factory.mktemp("local"))
    _, days = build_days(cfg, 2)
    promote_model(cfg, days[1])
    run(StageContext(cfg), days[1])
    return cfg, days[1]


def _cluster_day(root: Path, master: str, events: Path, conf: dict[str, str]) -> tuple[GemConfig, Path, str]:
    """The reference's seeded days and model in root's lakehouse, a config on `master` writing its
    event log to `events`; -> (config, its YAML, the day to precompute)."""
    events.mkdir(parents=True)
    base = precompute_config(root)
    cfg = load_config(overrides={**base.to_dict(), "spark": {
        "master": master, "shuffle_partitions": 2, "driver_memory": "1g",
        "conf": {"spark.driver.host": "127.0.0.1", "spark.executor.memory": "512m", "spark.executor.cores": "1",
                 "spark.eventLog.enabled": "true", "spark.eventLog.dir": events.as_uri(),
                 "spark.eventLog.compress": "false", **conf}}}, environ={})
    _, days = build_days(cfg, 2)
    promote_model(cfg, days[1])
    path = root / "gem.yaml"
    path.write_text(yaml.safe_dump(cfg.to_dict()))
    return cfg, path, days[1]


def _precompute(config: Path, ds: str) -> subprocess.Popen[str]:
    return subprocess.Popen([PYTHON, "-m", "jobs.precompute", "--ds", ds, "--config", str(config)], cwd=REPO,
                            env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _finish(job: subprocess.Popen[str], timeout_s: float = 900) -> str:
    out, _ = job.communicate(timeout=timeout_s)
    assert job.returncode == 0, out[-4000:]
    return out


def _assert_same_tables(reference: GemConfig, cfg: GemConfig) -> None:
    for schema in (*PRECOMPUTE_TABLES, GOLD_PRECOMPUTE_STATS):
        rows = lakehouse_rows(reference, schema.name, NOT_COMPARED)
        assert rows, schema.name
        assert lakehouse_rows(cfg, schema.name, NOT_COMPARED) == rows, schema.name


def _executors_added(events: Path) -> list[dict[str, Any]]:
    return [e for e in spark_events(events, live=True) if e.get("Event") == "SparkListenerExecutorAdded"]


def test_dynamic_allocation_adds_an_executor_for_the_queued_shards(
        cluster: SparkCluster, reference: tuple[GemConfig, str], tmp_path: Path) -> None:
    release = tmp_path / "release"
    cfg, config, ds = _cluster_day(tmp_path / "lake", cluster.master_url, tmp_path / "events", {
        "spark.dynamicAllocation.enabled": "true",
        # No external shuffle service on these workers: executors are released by shuffle tracking.
        "spark.dynamicAllocation.shuffleTracking.enabled": "true",
        "spark.dynamicAllocation.initialExecutors": "1", "spark.dynamicAllocation.minExecutors": "1",
        "spark.dynamicAllocation.maxExecutors": "2", "spark.dynamicAllocation.schedulerBacklogTimeout": "1s",
        f"spark.executorEnv.{HOLD_AT_ENV}": "precompute:*", f"spark.executorEnv.{HOLD_RELEASE_ENV}": str(release),
    })
    assert ds == reference[1]
    job = _precompute(config, ds)
    try:
        deadline = time.monotonic() + 600
        while len(_executors_added(tmp_path / "events")) < 2:
            assert job.poll() is None, job.communicate()[0][-4000:]
            assert time.monotonic() < deadline, "Spark added no second executor"
            time.sleep(1)
        assert not finished_tasks(tmp_path / "events", live=True)  # every task waited for it
    finally:
        release.touch()
    _finish(job)
    added = _executors_added(tmp_path / "events")
    starts = [e["Submission Time"] for e in spark_events(tmp_path / "events")
              if e.get("Event") == "SparkListenerJobStart"]
    assert len(added) == 2 and added[1]["Timestamp"] > min(starts)  # the second joined during the run
    tasks = finished_tasks(tmp_path / "events")
    assert {t["Executor ID"] for t in tasks if t["Reason"] == "Success"} == {e["Executor ID"] for e in added}
    _assert_same_tables(reference[0], cfg)


def test_speculation_reruns_a_straggling_shard_elsewhere(
        cluster: SparkCluster, reference: tuple[GemConfig, str], tmp_path: Path) -> None:
    cfg, config, ds = _cluster_day(tmp_path / "lake", cluster.master_url, tmp_path / "events", {
        "spark.speculation": "true", "spark.speculation.interval": "200ms", "spark.speculation.quantile": "0.5",
        "spark.speculation.multiplier": "2", "spark.speculation.minTaskRuntime": "1s",
        # The first attempt of shard 0 waits for a release that never comes: a straggler.
        f"spark.executorEnv.{HOLD_AT_ENV}": "precompute:shard=0:attempt=0",
    })
    _finish(_precompute(config, ds))
    shard_0 = [t for t in finished_tasks(tmp_path / "events") if t["Index"] == 0]
    winners = [t for t in shard_0 if t["Reason"] == "Success"]
    assert len(winners) == 1 and winners[0]["Speculative"] and winners[0]["Attempt"] >= 1, shard_0
    started = [e["Task Info"] for e in spark_events(tmp_path / "events") if e.get("Event") == "SparkListenerTaskStart"]
    straggler = [t for t in started if t["Index"] == 0 and t["Attempt"] == 0]
    assert straggler and straggler[0]["Host"] != winners[0]["Host"], (straggler, winners)  # the copy ran elsewhere
    _assert_same_tables(reference[0], cfg)

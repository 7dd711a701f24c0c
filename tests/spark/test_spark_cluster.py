"""The Spark stages run unchanged on a Spark cluster: two days through every Spark stage by `gem bulk`
in its own process, its session on a cluster master, against the same days on the suite's local
session; the work ran in at least two executor processes other than the driver (Spark's event log
names the executor of every task), and every table's rows and every completion record's counts
agree.

Quick tier: `local-cluster[2,1,1024]` (Spark's own test cluster: a master and two executor JVMs
started by the driver). Slow tier: one stage submitted with pyspark's spark-submit; the standalone
cluster of the cluster demo (gem.pipeline.services: a master and two workers from pyspark's
distribution, each on its own loopback address), and a worker killed mid-stage: the stage
completes on the survivor and leaves no partial data."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

import pytest
import yaml

from gem.config import load_config
from gem.lakehouse.commit import StageContext
from gem.lakehouse.spark import delta_jars
from gem.pipeline.bulk import run_range
from gem.pipeline.services import SparkCluster, spark_home
from schemas import TABLES
from tests.support import C1_JVM_CONF, PYTHON, REPO, finished_tasks, lakehouse_rows, subprocess_env

DAYS = ("2026-01-01", "2026-01-02")
LAST_SPARK_STAGE = "validate_examples"
RECORD_COUNTS = ("rows_in", "rows_written", "rows_quarantined", "quarantined_by_reason")


def _config(root: Path, master: str, event_log: Path | None = None, **conf: str) -> Path:
    """A small two-day world in its own lakehouse under root, its Spark session on `master`."""
    spark_conf = dict(C1_JVM_CONF)
    if event_log is not None:
        event_log.mkdir(parents=True, exist_ok=True)
        spark_conf.update({"spark.eventLog.enabled": "true", "spark.eventLog.dir": event_log.as_uri(),
                           "spark.eventLog.compress": "false"})
    spark_conf.update(conf)
    path = root / "gem.yaml"
    root.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({
        "lakehouse_uri": str(root / "lakehouse"), "start_ds": DAYS[0], "attribution_window_days": 0,
        "spark": {"master": master, "shuffle_partitions": 4, "driver_memory": "1g", "conf": spark_conf},
        "generator": {"users": 300, "ads": 60, "advertisers": 12, "events_per_day": 3000, "chunk_impressions": 1500},
    }))
    return path


def _bulk(config: Path) -> subprocess.Popen[str]:
    cmd = [PYTHON, "-m", "gem.pipeline.command", "bulk", "--start", DAYS[0], "--end", DAYS[-1],
           "--through-stage", LAST_SPARK_STAGE, "--config", str(config)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=subprocess_env())


def _executors_that_ran_tasks(event_log: Path, live: bool = False) -> set[str]:
    return {task["Executor ID"] for task in finished_tasks(event_log, live)}


def _local_reference(spark, root: Path):
    cfg = load_config(str(_config(root, "local[2]")))
    runs = list(run_range(cfg, DAYS[0], DAYS[-1], LAST_SPARK_STAGE, ctx=StageContext(cfg, spark)))
    assert {r.state for r in runs} == {"success"}, runs
    return cfg


def _assert_same_lakehouse(reference, other, filled: int = 8) -> None:
    """Every table's rows equal; at least `filled` of them hold rows."""
    compared = 0
    for name in TABLES:
        rows = lakehouse_rows(reference, name)
        assert lakehouse_rows(other, name) == rows, name
        compared += bool(rows)
    assert compared >= filled


def _finish(process: subprocess.Popen[str], timeout_s: float = 1200) -> str:
    out, _ = process.communicate(timeout=timeout_s)
    assert process.returncode == 0, out[-4000:]
    return out


def test_the_stages_on_a_local_cluster_write_what_local_mode_writes(spark, tmp_path: Path):
    events = tmp_path / "events"
    cluster_cfg = _config(tmp_path / "cluster", "local-cluster[2,1,1024]", events,
                          **{"spark.executor.memory": "512m"})
    _finish(_bulk(cluster_cfg))
    executors = _executors_that_ran_tasks(events)
    assert len(executors - {"driver"}) >= 2, executors
    reference = _local_reference(spark, tmp_path / "local")
    _assert_same_lakehouse(reference, load_config(str(cluster_cfg)))


@pytest.mark.slow
def test_a_stage_under_spark_submit_writes_what_the_session_factory_writes(spark, tmp_path: Path):
    """ingest_events of one day submitted with pyspark's own spark-submit to local-cluster[2,1,1024]
    (the cluster's settings from infra/spark/spark-defaults.conf, the Delta jars shipped with --jars,
    the project's code by the session factory) writes the rows the in-process session writes."""
    events = tmp_path / "events"
    submitted = load_config(str(_config(tmp_path / "submitted", "local[2]")))
    for cfg in (submitted, load_config(str(_config(tmp_path / "local", "local[2]")))):
        runs = list(run_range(cfg, DAYS[0], DAYS[0], "generate_events"))
        assert {r.state for r in runs} == {"success"}, runs
    reference = load_config(str(tmp_path / "local" / "gem.yaml"))
    assert {r.state for r in run_range(reference, DAYS[0], DAYS[0], "ingest_events",
                                       ctx=StageContext(reference, spark))} == {"success"}
    # The repository's cluster settings, but the jars fetched at set-up instead of spark.jars.packages.
    settings = [line.split(None, 1) for line in (REPO / "infra/spark/spark-defaults.conf").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    conf = [arg for key, value in settings if key != "spark.jars.packages" for arg in ("--conf", f"{key}={value}")]
    events.mkdir()
    submit = [str(spark_home() / "bin" / "spark-submit"), "--master", "local-cluster[2,1,1024]",
              "--conf", "spark.executor.memory=512m", "--conf", "spark.eventLog.enabled=true",
              "--conf", f"spark.eventLog.dir={events.as_uri()}", "--conf", "spark.eventLog.compress=false",
              "--conf", f"spark.pyspark.python={PYTHON}", *conf,
              "--jars", ",".join(delta_jars(submitted)),
              str(REPO / "jobs" / "ingest_events.py"), "--ds", DAYS[0], "--config", str(tmp_path / "submitted" / "gem.yaml")]
    job = subprocess.run(submit, check=False, capture_output=True, text=True, timeout=600, env=subprocess_env())
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    assert len(_executors_that_ran_tasks(events) - {"driver"}) >= 2
    _assert_same_lakehouse(reference, submitted, filled=2)


@pytest.mark.slow
def test_the_stages_on_a_standalone_cluster_survive_a_lost_worker(spark, tmp_path: Path):
    events = tmp_path / "events"
    with SparkCluster(tmp_path / "cluster-logs") as cluster:
        config = _config(tmp_path / "cluster", cluster.master_url, events,
                         **{"spark.executor.memory": "512m", "spark.executor.cores": "1",
                            "spark.driver.host": "127.0.0.1"})
        process = _bulk(config)
        # Kill worker 2 once both executors have finished tasks: the stages still to run lose it
        # and run on worker 1.
        def kill_when_busy() -> None:
            deadline = time.monotonic() + 900
            while time.monotonic() < deadline and process.poll() is None:
                if len(_executors_that_ran_tasks(events, live=True) - {"driver"}) >= 2:
                    cluster.kill_worker(1)
                    return
                time.sleep(2)
        killer = threading.Thread(target=kill_when_busy)
        killer.start()
        _finish(process)
        killer.join()
        assert cluster.alive_workers() == 1
    executors = _executors_that_ran_tasks(events)
    assert len(executors - {"driver"}) >= 2, executors
    reference = _local_reference(spark, tmp_path / "local")
    _assert_same_lakehouse(reference, load_config(str(config)))

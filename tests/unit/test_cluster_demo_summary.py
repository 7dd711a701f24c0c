"""The cluster demo's summary of where its Airflow tasks ran (gem.pipeline.cluster_demo.tasks_by_worker):
one line per task with the worker its task instance recorded, in the order the tasks started, and
how many tasks each worker ran; and the config it runs (cluster_config, with_class_archives)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import yaml

from gem.config import load_config
from gem.lakehouse.spark import C1_OPTIONS, EXECUTOR_JAVA_OPTIONS, JAVA_OPTIONS
from gem.pipeline.airflow.api import TaskRun
from gem.pipeline.airflow.orchestration import stage_nodes
from gem.pipeline.cluster_demo import (
    TRAINING_NODES,
    cluster_config,
    tasks_by_worker,
    tasks_per_worker,
    with_class_archives,
)
from gem.pipeline.demo import DEFAULT_CONFIG

T0 = dt.datetime(2026, 1, 5, tzinfo=dt.UTC)


def task(task_id: str, minute: int | None, host: str | None, state: str = "success") -> TaskRun:
    start = None if minute is None else T0 + dt.timedelta(minutes=minute)
    return TaskRun(task_id, state, start, start, host)


def test_each_task_is_listed_with_its_worker_in_start_order() -> None:
    runs = {"2026-01-04": [task("ingest_events", 2, "gem-worker-2"), task("generate_events", 0, "gem-worker-1"),
                           task("distill", None, None, "upstream_failed")]}
    lines = tasks_by_worker(runs).splitlines()
    assert [line.split() for line in lines[:3]] == [
        ["2026-01-04", "generate_events", "success", "gem-worker-1"],
        ["2026-01-04", "ingest_events", "success", "gem-worker-2"],
        ["2026-01-04", "distill", "upstream_failed", "no", "worker"],
    ]
    assert lines[3].strip() == "tasks per worker: gem-worker-1 1, gem-worker-2 1"


def test_tasks_per_worker_counts_over_every_run_and_says_when_none_reached_a_worker() -> None:
    tasks = [task("a", 0, "gem-worker-1"), task("b", 1, "gem-worker-1"), task("c", 2, "gem-worker-2")]
    assert tasks_per_worker(tasks) == "gem-worker-1 2, gem-worker-2 1"
    assert tasks_per_worker([task("a", None, None, "upstream_failed")]) == "none ran on a worker"


def test_the_cluster_config_trains_on_two_torchrun_nodes_and_keeps_the_demos_world() -> None:
    """cluster_config: the demo's config on the topology validates, its model tasks launch under
    torchrun with pretraining on two loopback nodes, and the demo's world and volumes are unchanged."""
    demo = yaml.safe_load(DEFAULT_CONFIG.read_text())
    data = cluster_config(demo, "bucket", "spark://127.0.0.1:7077")
    cfg = load_config(overrides=data, environ={})
    assert cfg.launcher.kind == "torchrun" and cfg.launcher.local_nodes == TRAINING_NODES
    assert stage_nodes("pretrain", cfg.launcher) == TRAINING_NODES and stage_nodes("distill", cfg.launcher) == ()
    assert cfg.lakehouse_uri == "s3://bucket/lakehouse" and cfg.spark.master == "spark://127.0.0.1:7077"
    assert {k: data[k] for k in ("generator", "train", "student_train", "demo")} == \
        {k: demo[k] for k in ("generator", "train", "student_train", "demo")}


def test_the_cluster_config_with_class_archives_keeps_its_jvm_options_and_adds_the_archives() -> None:
    """with_class_archives: the driver's and the executors' options gain their own archive, and keep
    what cluster_config set (C1-only JIT); nothing else changes."""
    data = cluster_config(yaml.safe_load(DEFAULT_CONFIG.read_text()), "bucket", "spark://127.0.0.1:7077")
    shared = with_class_archives(data, Path("/a/driver.jsa"), Path("/a/executor.jsa"))
    conf = load_config(overrides=shared, environ={}).spark.conf
    assert conf[JAVA_OPTIONS] == f"{C1_OPTIONS} -XX:SharedArchiveFile=/a/driver.jsa"
    assert conf[EXECUTOR_JAVA_OPTIONS] == f"{C1_OPTIONS} -XX:SharedArchiveFile=/a/executor.jsa"
    assert {k: v for k, v in shared.items() if k != "spark"} == {k: v for k, v in data.items() if k != "spark"}
    assert data["spark"]["conf"][JAVA_OPTIONS] == C1_OPTIONS  # the input is left as it was

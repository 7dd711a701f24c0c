"""Solaris precompute on Spark executors: one task per shard, the pinned model loaded once per
executor Python worker.

    reports = run_shards(spark, plan)   # on the driver: one report row per shard

The driver makes a DataFrame of the shard numbers, one per partition, and maps it with
`mapInArrow`. Each task computes its shard's rows of the four tables with the plan's model
(gem.precompute.shard_work) and commits them itself through `deltalake`, as one part of the run (a
Delta transaction id per table and shard, StageCommit.replace_arrow(part=...)); what comes back to
the driver is one small report row per shard. Only the reports cross the network to the driver,
never the rows.

Elastic, retried and speculative the way Spark is: dynamic allocation adds and removes executors
while the tasks wait in the queue; a failed task reruns (spark.task.maxFailures); with
spark.speculation a copy of a slow task starts on another host. A shard's rows depend only on the
shard and the plan, so a rerun or a copy replaces the same rows with the same values, and the
driver adopts each part's last commit of the run (StageCommit.adopt_parts). A task killed before its
commits leaves the shard's previous rows.

PySpark keeps a Python worker for the next task (spark.python.worker.reuse, on by default), so the
model and the day's small indexes (gem.precompute.inputs.DayInputs) are loaded by the first task of
a run a worker takes and kept for the others (_LOADED); each report says whether its task loaded them.

With precompute.gpus_per_task > 0 the stage asks Spark's scheduler for that share of a GPU per
task (a task resource profile; the executors must offer `gpu` resources) and each task scores on
the GPU it was given; without, on the CPU.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import torch
from pyspark import TaskContext
from pyspark.resource import ResourceProfile, ResourceProfileBuilder, TaskResourceRequests
from pyspark.sql.pandas.types import from_arrow_schema

from gem import faults
from gem.lakehouse.commit import StageCommit
from gem.precompute.inputs import DayInputs
from gem.precompute.model import PrecomputeModel
from gem.precompute.plan import STAGE, DayPlan
from gem.precompute.shard_work import ShardWork, do_shard

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# The standard AWS variables an executor needs to reach an object-store lakehouse. A worker host
# usually has its own (an instance role, its environment); where it has none, the driver's are
# handed over with the task (gem.storage reads them from the environment).
HANDED_ENVIRONMENT = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_REGION",
                      "AWS_DEFAULT_REGION", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ALLOW_HTTP")

REPORT_SCHEMA = pa.schema([
    pa.field("shard", pa.int32()),
    pa.field("attempt", pa.int32()),  # Spark's attempt number of the task (0: the first)
    pa.field("worker", pa.string()),  # host:pid of the executor's Python worker
    pa.field("device", pa.string()),
    pa.field("loaded_model", pa.bool_()),  # this task loaded the model (the first of its worker's)
    pa.field("rows", pa.map_(pa.string(), pa.int64())),  # table -> rows committed
    pa.field("seconds", pa.map_(pa.string(), pa.float64())),  # phase -> seconds
    pa.field("started", pa.float64()),  # epoch seconds
    pa.field("finished", pa.float64()),
])


@dataclass
class _Loaded:
    work: ShardWork
    commit: StageCommit


# run id and device -> what a worker loaded for that run; one entry, the run it served last.
_LOADED: dict[tuple[str, str], _Loaded] = {}


def _load(plan: DayPlan, device: torch.device) -> tuple[_Loaded, bool]:
    """This worker's model and inputs for the plan's run; -> (them, whether this call loaded them)."""
    key = (plan.run_id, str(device))
    if key in _LOADED:
        return _LOADED[key], False
    _LOADED.clear()  # the previous run's model and indexes go before this run's load
    cfg = plan.cfg
    loaded = _Loaded(ShardWork(plan, DayInputs(plan), PrecomputeModel.load(cfg, plan.model, device)),
                     StageCommit.join(cfg, STAGE, plan.ds, plan.run_id))
    _LOADED[key] = loaded
    return loaded, True


def task_device(context: TaskContext | None) -> torch.device:
    """The GPU Spark's scheduler gave this task, else the CPU."""
    gpus = context.resources().get("gpu") if context is not None else None
    if gpus is not None and gpus.addresses:
        return torch.device("cuda", int(gpus.addresses[0]))
    return torch.device("cpu")


def shard_report(plan: DayPlan, shard: int, context: TaskContext | None) -> pa.RecordBatch:
    """Compute and commit one shard (a task's work); -> its report row (REPORT_SCHEMA)."""
    attempt = context.attemptNumber() if context is not None else 0
    point = f"{STAGE}:shard={shard}:attempt={attempt}"  # gem.faults' name of this task's points
    faults.hold_point(point)
    started = time.time()
    device = task_device(context)
    loaded, loaded_now = _load(plan, device)
    rows, seconds = do_shard(loaded.work, loaded.commit, shard, crash_prefix=point)
    report = {"shard": shard, "attempt": attempt, "worker": f"{socket.gethostname()}:{os.getpid()}",
              "device": str(device), "loaded_model": loaded_now, "rows": list(rows.items()),
              "seconds": list(seconds.items()), "started": started, "finished": time.time()}
    return pa.RecordBatch.from_pylist([report], REPORT_SCHEMA)


def shard_tasks(plan: DayPlan, environment: dict[str, str]
                ) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The function mapInArrow runs in each task: its partition's shard numbers (column `id`) ->
    their reports. `environment`: variables set in the worker where it has none of its own."""

    def run_partition(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for name, value in environment.items():
            os.environ.setdefault(name, value)
        context = TaskContext.get()
        threads = torch.get_num_threads()
        torch.set_num_threads(plan.cfg.precompute.threads_per_task)
        try:
            for batch in batches:
                for shard in batch.column("id").to_pylist():
                    yield shard_report(plan, int(shard), context)
        finally:
            torch.set_num_threads(threads)

    return run_partition


def gpu_profile(gpus_per_task: float) -> ResourceProfile | None:
    """The task resource profile asking for `gpus_per_task` GPUs per task; None for none."""
    if gpus_per_task <= 0:
        return None
    return ResourceProfileBuilder().require(TaskResourceRequests().resource("gpu", gpus_per_task)).build


def run_shards(spark: SparkSession, plan: DayPlan) -> list[dict[str, Any]]:
    """Run the plan's shards as Spark tasks, one per shard (module docstring); -> each shard's
    report as a dict (REPORT_SCHEMA's fields), by shard."""
    shards = spark.range(0, plan.shards, 1, numPartitions=plan.shards)  # shard s alone in partition s
    handed = {name: os.environ[name] for name in HANDED_ENVIRONMENT if os.environ.get(name)}
    reports = shards.mapInArrow(shard_tasks(plan, handed), from_arrow_schema(REPORT_SCHEMA),
                                profile=gpu_profile(plan.cfg.precompute.gpus_per_task))
    spark.sparkContext.setJobDescription(f"{STAGE} ds={plan.ds}: {plan.shards} shards")
    try:
        rows = [row.asDict() for row in reports.collect()]
    finally:
        spark.sparkContext.setJobDescription(None)
    for row in rows:
        row["rows"], row["seconds"] = dict(row["rows"]), dict(row["seconds"])
    return sorted(rows, key=lambda r: r["shard"])

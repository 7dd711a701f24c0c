"""The daily DAG, built from the stage registry: one task per stage, plus the landing sensor.

dags/gem_daily.py is `daily_dag()`; a test can build the same DAG under another id, start date and
catchup (the scheduler-driven test does). Everything a task does comes from its registry
declaration (gem.lakehouse.stages) through gem.pipeline.airflow.orchestration:

- a PythonOperator per stage running the stage's entry point for the run's day in the task's
  process (gem.pipeline.airflow.orchestration.run_stage_task: what `python -m jobs.<module>` runs, with the Spark
  session of the task's process); "nothing ready yet" skips it where the stage may skip;
- for pretrain, precompute and distill (orchestration.LAUNCHED_STAGES), the launcher the config
  names (gem.config.LauncherConfig, read at parse time: orchestration.parse_config): in the task's
  process (the default, as above), in torchrun processes on the worker's host
  (orchestration.run_stage_torchrun, the same task arguments), or as a Kubernetes cluster job
  submitted by the cncf-kubernetes provider's operators (gem.deploy.operators, imported only then);
- the Airflow Assets of the tables the stage writes as its outlets;
- depends_on_past where the stage carries state from its previous day;
- one sensor (reschedule mode) before the stages that read landing partitions, waiting for the
  day's `_SUCCESS` markers: written by generate_events under `source: synthetic`, by an export or
  the MovieLens import under `source: landing` (generate_events then skips, and the sensor runs
  anyway: trigger rule none_failed);
- a failure callback recording which task failed and why.

Imported by the DAG processor on every parse: Airflow and stdlib only (no pyspark, torch, pandas);
gem.config only when the environment names a config, the Kubernetes provider only for cluster jobs.
"""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING, Any

from airflow.providers.standard.operators.python import PythonOperator
from airflow.providers.standard.sensors.python import PythonSensor
from airflow.sdk import DAG, BaseOperator

from gem.lakehouse import stages
from gem.pipeline.airflow.orchestration import (
    DAG_ID,
    DAY_EXPR,
    FROM_STAGE_EXPR,
    LANDING_SENSOR,
    daily_timetable,
    default_args,
    depends_on_past,
    landing_ready,
    landing_sensor_settings,
    launch_kind,
    parse_config,
    partition_ds,
    run_stage_task,
    run_stage_torchrun,
    stage_assets,
    start_date,
)

if TYPE_CHECKING:
    from gem.config import GemConfig


def task_upstream() -> dict[str, set[str]]:
    """task id -> the task ids it waits for within a run: the registry's graph
    (gem.lakehouse.stages.upstream), with the landing sensor between the stages that read landing
    partitions and the producers they are ordered `after` (generate_events)."""
    graph = {s.name: set(stages.upstream(s.name)) for s in stages.STAGES}
    readers = [s for s in stages.STAGES if s.reads_landing]
    if readers:
        graph[LANDING_SENSOR] = set()
        for s in readers:
            graph[LANDING_SENSOR] |= graph[s.name] & set(s.after)
            graph[s.name] = (graph[s.name] - set(s.after)) | {LANDING_SENSOR}
    return graph


def stage_task(stage: stages.Stage, cfg: GemConfig | None) -> BaseOperator:
    """A stage's task, launched as `launch_kind` says: a PythonOperator running the stage in the
    task's process (run_stage_task) or under torchrun (run_stage_torchrun), both with the same
    arguments, or the operator submitting its cluster job."""
    task_args: dict[str, Any] = {
        "task_id": stage.name,
        "doc_md": stage.doc,
        "outlets": stage_assets(stage),
        "depends_on_past": depends_on_past(stage),
        "do_xcom_push": False,  # the summary line is in the log, not a result
        **({"pool": stage.pool} if stage.pool else {}),
    }
    kind = launch_kind(stage.name, cfg)
    if kind == "cluster_job" and cfg is not None:
        from gem.deploy.operators import cluster_job_operator  # noqa: PLC0415 - the provider loads only for cluster jobs

        return cluster_job_operator(stage, cfg.launcher, cfg.spark, DAY_EXPR, FROM_STAGE_EXPR, **task_args)
    return PythonOperator(
        python_callable=run_stage_torchrun if kind == "torchrun" else run_stage_task,
        op_kwargs={"stage_name": stage.name, "run_day": DAY_EXPR, "from_stage": FROM_STAGE_EXPR},
        **task_args,
    )


def daily_dag(dag_id: str = DAG_ID, start: dt.datetime | None = None, catchup: bool = False,
              doc_md: str | None = None, config: GemConfig | None = None) -> DAG:
    """The daily pipeline DAG (see the module docstring). `start`/`catchup`: the production DAG
    starts at start_date() without catchup (backfills go through `airflow backfill create`).
    `config`: whose `launcher` launches the model tasks; None reads the one the environment names
    (orchestration.parse_config), the in-process default when it names none."""
    cfg = config if config is not None else parse_config()
    with DAG(
        dag_id=dag_id,
        description="Daily ads data and model: landing -> bronze -> silver -> examples -> mixture -> pretraining "
                    "-> precompute.",
        schedule=daily_timetable(),
        start_date=start or start_date(),
        catchup=catchup,
        max_active_runs=1,  # stages keep day-over-day state; days run in order
        default_args=default_args(),
        user_defined_macros={"partition_ds": partition_ds},
        tags=["gem", "daily"],
        doc_md=doc_md,
    ) as dag:
        tasks = {stage.name: stage_task(stage, cfg) for stage in stages.STAGES}
        graph = task_upstream()
        if LANDING_SENSOR in graph:
            tasks[LANDING_SENSOR] = PythonSensor(
                task_id=LANDING_SENSOR,
                python_callable=landing_ready,
                op_kwargs={"ds": DAY_EXPR},
                mode="reschedule",
                # Under `source: landing` generate_events is skipped; the sensor still waits.
                trigger_rule="none_failed",
                doc_md="waits for the `_SUCCESS` markers of the landing partitions the run reads",
                **landing_sensor_settings(),
            )
        for name, upstream in graph.items():
            for producer in sorted(upstream):
                tasks[producer] >> tasks[name]
    return dag

"""The daily DAG, built from the stage registry: one task per stage, plus the landing sensor.

dags/gem_daily.py is `daily_dag()`; a test can build the same DAG under another id, start date and
catchup (the scheduler-driven test does). Everything a task does comes from its registry
declaration (gem.lakehouse.stages) through gem.pipeline.airflow.orchestration:

- a PythonOperator per stage running the stage's entry point for the run's day in the task's
  process (gem.pipeline.airflow.orchestration.run_stage_task: what `python -m jobs.<module>` runs, with the Spark
  session of the task's process); "nothing ready yet" skips it where the stage may skip;
- the Airflow Assets of the tables the stage writes as its outlets;
- depends_on_past where the stage carries state from its previous day;
- one sensor (reschedule mode) before the stages that read landing partitions, waiting for the
  day's `_SUCCESS` markers: written by generate_events under `source: synthetic`, by an export or
  the MovieLens import under `source: landing` (generate_events then skips, and the sensor runs
  anyway: trigger rule none_failed);
- a failure callback recording which task failed and why.

Imported by the DAG processor on every parse: Airflow and stdlib only (no pyspark, torch, pandas).
"""

from __future__ import annotations

import datetime as dt

from airflow.providers.standard.operators.python import PythonOperator
from airflow.providers.standard.sensors.python import PythonSensor
from airflow.sdk import DAG

from gem.lakehouse import stages
from gem.pipeline.airflow.orchestration import (
    DAG_ID,
    FROM_STAGE_CONF,
    LANDING_SENSOR,
    daily_timetable,
    default_args,
    depends_on_past,
    landing_ready,
    landing_sensor_settings,
    partition_ds,
    run_stage_task,
    stage_assets,
    start_date,
)

DAY_EXPR = "{{ partition_ds(data_interval_start) }}"
# The stage the run starts from, from its conf (gem backfill --from-stage); "" for every other run.
FROM_STAGE_EXPR = f"{{{{ (dag_run.conf or {{}}).get('{FROM_STAGE_CONF}', '') }}}}"


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


def daily_dag(dag_id: str = DAG_ID, start: dt.datetime | None = None, catchup: bool = False,
              doc_md: str | None = None) -> DAG:
    """The daily pipeline DAG (see the module docstring). `start`/`catchup`: the production DAG
    starts at start_date() without catchup (backfills go through `airflow backfill create`)."""
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
        tasks = {
            stage.name: PythonOperator(
                task_id=stage.name,
                python_callable=run_stage_task,
                op_kwargs={"stage_name": stage.name, "run_day": DAY_EXPR, "from_stage": FROM_STAGE_EXPR},
                do_xcom_push=False,  # the summary line is in the log, not a result
                doc_md=stage.doc,
                outlets=stage_assets(stage),
                depends_on_past=depends_on_past(stage),
                **({"pool": stage.pool} if stage.pool else {}),
            )
            for stage in stages.STAGES
        }
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

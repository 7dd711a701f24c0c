"""The weekly upkeep DAG: quarantine retention, OPTIMIZE and VACUUM of every table (gem.lakehouse.upkeep).

dags/gem_upkeep.py is `upkeep_dag()`. One task; its day is the UTC date its weekly data interval
closes (the retention counts back from there). It runs at 06:00 UTC on Sundays, hours after the
daily run of the day before has normally finished; a commit that still races a stage's fails and
the task retries. While a backfill runs, the task waits for it (rescheduled, like the daily tasks).

Imported by the DAG processor on every parse: Airflow, stdlib and Spark-free gem modules only.
"""

from __future__ import annotations

from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG, CronDataIntervalTimetable

from gem.lakehouse.backfill_hold import BackfillInProgressError
from gem.lakehouse.upkeep import UPKEEP_CRON, run_task
from gem.pipeline.airflow.orchestration import SCHEDULE_TZ, backfill_reschedule, default_args, partition_ds, start_date

UPKEEP_DAG_ID = "gem_upkeep"
UPKEEP_DAY_EXPR = "{{ partition_ds(data_interval_end) }}"


def run_upkeep(ds: str) -> str:
    """The task: upkeep of ds; rescheduled, not failed, while a backfill runs (gem.lakehouse.upkeep)."""
    try:
        return run_task(ds)
    except BackfillInProgressError as waiting:
        raise backfill_reschedule(waiting) from waiting


def upkeep_dag(doc_md: str | None = None) -> DAG:
    with DAG(
        dag_id=UPKEEP_DAG_ID,
        description="Weekly lakehouse upkeep: quarantine retention, OPTIMIZE, VACUUM.",
        schedule=CronDataIntervalTimetable(UPKEEP_CRON, timezone=SCHEDULE_TZ),
        start_date=start_date(),
        catchup=False,
        max_active_runs=1,
        default_args=default_args(),
        user_defined_macros={"partition_ds": partition_ds},
        tags=["gem", "upkeep"],
        doc_md=doc_md,
    ) as dag:
        PythonOperator(task_id="upkeep", python_callable=run_upkeep, op_kwargs={"ds": UPKEEP_DAY_EXPR},
                       do_xcom_push=False, doc_md="quarantine retention, then OPTIMIZE and VACUUM of every table")
    return dag

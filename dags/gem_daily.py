"""gem_daily: one day of events, landing -> bronze -> validated -> user sequences, for ds = the interval start day.

Thin on purpose: every task is a `python -m jobs.<name> --ds <ds>` subprocess (so Spark never
runs inside the Airflow worker), and the dates, schedule and commands come from
gem.orchestration. The jobs read their config from $GEM_CONFIG in the worker's environment.

Manual run for ds=D: `airflow dags test gem_daily D+1` (see gem/orchestration.py).
"""

from __future__ import annotations

from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import DAG

from gem.orchestration import (
    REPO_ROOT,
    daily_timetable,
    default_args,
    job_command,
    job_env,
    partition_ds,
    start_date,
)

JOBS = ("generate_events", "ingest_events", "validate_events", "build_sequences")

with DAG(
    dag_id="gem_daily",
    description="Daily ad events: generate landing files, ingest to bronze Delta, validate.",
    schedule=daily_timetable(),
    start_date=start_date(),
    catchup=False,  # backfills go through `airflow backfill create`
    max_active_runs=1,  # stages keep day-over-day state; days run in order
    default_args=default_args(),
    user_defined_macros={"partition_ds": partition_ds},
    tags=["gem", "daily"],
    doc_md=__doc__,
) as dag:
    previous = None
    for job in JOBS:
        task = BashOperator(
            task_id=job,
            bash_command=job_command(job),
            cwd=str(REPO_ROOT),
            env=job_env(),
            append_env=True,  # inherit GEM_CONFIG, GEM__*, PATH, JAVA_HOME from the worker
            skip_on_exit_code=None,  # any non-zero exit is a failure (99 would otherwise mean "skipped")
            do_xcom_push=False,  # the last log line is not a result
        )
        if previous is not None:
            previous >> task
        previous = task

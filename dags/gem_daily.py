"""gem_daily: one day of ads data, landing -> bronze -> silver -> training examples -> mixture -> pretraining
-> precompute.

Thin on purpose: the tasks and their order come from the stage registry (gem.lakehouse.stages), the dates,
schedule and commands from gem.orchestration. Every task is a `python -m jobs.<name> --ds <ds>` (or
`--ready-on <ds>`) subprocess, so Spark never runs inside the Airflow worker. The jobs read their
config from $GEM_CONFIG in the worker's environment.

Manual run for ds=D: `airflow dags test gem_daily D+1` (see gem/orchestration.py).
"""

from __future__ import annotations

from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import DAG

from gem.lakehouse import stages
from gem.orchestration import (
    REPO_ROOT,
    daily_timetable,
    default_args,
    job_env,
    partition_ds,
    skip_on_exit_code,
    stage_command,
    start_date,
)

with DAG(
    dag_id="gem_daily",
    description="Daily ads data and model: landing -> bronze -> silver -> examples -> mixture -> pretraining "
                "-> precompute.",
    schedule=daily_timetable(),
    start_date=start_date(),
    catchup=False,  # backfills go through `airflow backfill create`
    max_active_runs=1,  # stages keep day-over-day state; days run in order
    default_args=default_args(),
    user_defined_macros={"partition_ds": partition_ds},
    tags=["gem", "daily"],
    doc_md=__doc__,
) as dag:
    # One task per registry stage; its upstream tasks are the producers of the records it needs.
    tasks = {
        stage.name: BashOperator(
            task_id=stage.name,
            bash_command=stage_command(stage),
            cwd=str(REPO_ROOT),
            env=job_env(),
            append_env=True,  # inherit GEM_CONFIG, GEM__*, PATH, JAVA_HOME from the worker
            # Only a stage that declares it skips on 99 ("nothing ready yet"); any other non-zero fails.
            skip_on_exit_code=skip_on_exit_code(stage),
            do_xcom_push=False,  # the last log line is not a result
            doc_md=stage.doc,
            **({"pool": stage.pool} if stage.pool else {}),
        )
        for stage in stages.STAGES
    }
    for name, task in tasks.items():
        for producer in sorted(stages.upstream(name)):
            tasks[producer] >> task

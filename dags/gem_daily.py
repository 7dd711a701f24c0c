"""gem_daily: one day of ads data, landing -> bronze -> silver -> training examples -> mixture -> pretraining.

Thin on purpose: every task is a `python -m jobs.<name> --ds <ds>` (or `--ready-on <ds>`) subprocess (so Spark never
runs inside the Airflow worker), and the dates, schedule and commands come from
gem.orchestration. The jobs read their config from $GEM_CONFIG in the worker's environment.

Manual run for ds=D: `airflow dags test gem_daily D+1` (see gem/orchestration.py).
"""

from __future__ import annotations

from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import DAG

from gem.orchestration import (
    GPU_POOL,
    REPO_ROOT,
    JobTask,
    daily_timetable,
    default_args,
    job_env,
    partition_ds,
    start_date,
)

# task -> the job it runs and the tasks it waits for. Sequences and features both read validated
# bronze and run side by side; examples are assembled for the day whose attribution window closes
# on this run's day (--ready-on), from validated silver.
TASKS: dict[str, JobTask] = {
    "generate_events": JobTask("generate_events"),
    "ingest_events": JobTask("ingest_events", upstream=("generate_events",)),
    "validate_events": JobTask("validate_events", upstream=("ingest_events",)),
    "build_sequences": JobTask("build_sequences", upstream=("validate_events",)),
    "build_features": JobTask("build_features", upstream=("validate_events",)),
    "validate_silver": JobTask("validate_silver", upstream=("build_sequences", "build_features")),
    "assemble_examples": JobTask("assemble_examples", upstream=("validate_silver",), ready_on=True),
    "validate_examples": JobTask(
        "validate_silver", upstream=("assemble_examples",), extra_args="--examples", ready_on=True
    ),
    # The training mixture over the closed example days; skipped until a held-out day has a training day before it.
    "mix": JobTask("mix", upstream=("validate_examples",), skippable=True),
    # Continued pretraining on that mixture (warm start from the last promoted model), in the GPU
    # pool; skipped with the mix.
    "pretrain": JobTask("pretrain", upstream=("mix",), skippable=True, pool=GPU_POOL),
}

with DAG(
    dag_id="gem_daily",
    description="Daily ads data and model: landing -> bronze -> silver -> examples -> mixture -> pretraining.",
    schedule=daily_timetable(),
    start_date=start_date(),
    catchup=False,  # backfills go through `airflow backfill create`
    max_active_runs=1,  # stages keep day-over-day state; days run in order
    default_args=default_args(),
    user_defined_macros={"partition_ds": partition_ds},
    tags=["gem", "daily"],
    doc_md=__doc__,
) as dag:
    tasks = {}
    for task_id, job in TASKS.items():
        tasks[task_id] = BashOperator(
            task_id=task_id,
            bash_command=job.command,
            cwd=str(REPO_ROOT),
            env=job_env(),
            append_env=True,  # inherit GEM_CONFIG, GEM__*, PATH, JAVA_HOME from the worker
            # Only a --ready-on job's 99 ("nothing ready yet") means skipped; any other non-zero fails.
            skip_on_exit_code=job.skip_on_exit_code,
            do_xcom_push=False,  # the last log line is not a result
            **({"pool": job.pool} if job.pool else {}),
        )
        for name in job.upstream:
            tasks[name] >> tasks[task_id]

"""gem_daily: one day of events, landing -> bronze -> validated -> sequences + features, for ds = the interval start day.

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

# job -> the jobs it waits for. Sequences and features both read validated bronze; neither needs
# the other, so they run side by side.
UPSTREAM: dict[str, tuple[str, ...]] = {
    "generate_events": (),
    "ingest_events": ("generate_events",),
    "validate_events": ("ingest_events",),
    "build_sequences": ("validate_events",),
    "build_features": ("validate_events",),
}

with DAG(
    dag_id="gem_daily",
    description="Daily ad events: landing -> bronze Delta -> validated -> user sequences and features.",
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
    for job, upstream in UPSTREAM.items():
        tasks[job] = BashOperator(
            task_id=job,
            bash_command=job_command(job),
            cwd=str(REPO_ROOT),
            env=job_env(),
            append_env=True,  # inherit GEM_CONFIG, GEM__*, PATH, JAVA_HOME from the worker
            skip_on_exit_code=None,  # any non-zero exit is a failure (99 would otherwise mean "skipped")
            do_xcom_push=False,  # the last log line is not a result
        )
        for name in upstream:
            tasks[name] >> tasks[job]

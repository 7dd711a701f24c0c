"""gem_daily: one day of ads data, landing -> bronze -> silver -> training examples -> mixture -> pretraining
-> precompute.

Thin on purpose: the Airflow DAG is built by gem.pipeline.airflow.daily_dag from the stage registry
(gem.lakehouse.stages); the dates, schedule and commands come from gem.pipeline.airflow.orchestration. Every task runs
its stage's entry point (what `python -m jobs.<name> --ds <ds>` runs) in the task's process
(gem.pipeline.airflow.orchestration.run_stage_task), reading the config from $GEM_CONFIG in the worker's environment.

Manual run for ds=D: `airflow dags test gem_daily D+1` (see gem/pipeline/airflow/orchestration.py).
"""

from __future__ import annotations

from gem.pipeline.airflow.daily_dag import daily_dag

dag = daily_dag(doc_md=__doc__)

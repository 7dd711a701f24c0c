"""gem_upkeep: weekly lakehouse upkeep (quarantine retention, OPTIMIZE, VACUUM).

Thin on purpose: built by gem.pipeline.airflow.upkeep_dag; the work is gem.lakehouse.upkeep, in the task's process
(deltalake, no Spark). Manual run: `airflow dags test gem_upkeep`.
"""

from __future__ import annotations

from gem.pipeline.airflow.upkeep_dag import upkeep_dag

dag = upkeep_dag(doc_md=__doc__)

#!/usr/bin/env bash
# Create or upgrade the Airflow metadata DB of $AIRFLOW_HOME; safe to rerun (migrate is a no-op
# on an up-to-date DB). Usage: infra/airflow/init_db.sh   (uses the repo's .venv if present)
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=infra/airflow/airflow_env.sh
. "$here/airflow_env.sh"
airflow_bin="${AIRFLOW_BIN:-$GEM_REPO/.venv/bin/airflow}"
[ -x "$airflow_bin" ] || airflow_bin="airflow"
"$airflow_bin" db migrate
# The pool GPU jobs queue in (gem.lakehouse.stages.GPU_POOL / gem.pipeline.airflow.orchestration.GPU_POOL_SLOTS); `pools set` overwrites,
# so a rerun is a no-op.
"$airflow_bin" pools set gpu 1 "GPU slots for foundation-model pretraining" >/dev/null

"""The `GEM_*` environment variables that are not settings, in one place, each with why.

Settings live in gem.config (YAML and `GEM__SECTION__FIELD` variables). The variables below are
read where no config is loaded, or they steer a process rather than the pipeline:

    GEM_CONFIG              the YAML file `load_config` reads when no --config is given: it chooses
                            the config, so it cannot be part of it.
    GEM_DAG_START_DS        the DAG's start date. The DAG processor parses the DAG file without
                            loading a config; `gem run` sets it from the config's start_ds.
    GEM_TASK_RETRIES        Airflow retries per task, and the seconds between them. Read when the
    GEM_TASK_RETRY_DELAY_S  DAG is parsed; tests and the demo fail fast with them.
    GEM_LANDING_POKE_S      how often the landing sensor pokes, and when it gives up. Read when the
    GEM_LANDING_TIMEOUT_S   DAG is parsed.
    GEM_BACKFILL_POKE_S     how often a task held by a running backfill is rescheduled. Read when the
                            DAG is parsed.
    GEM_CRASH_AT            a named crash point at which the fault drill kills a job (gem.faults); a
                            drill's instruction to one process, never a setting.
    GEM_HOLD_AT             a glob of named hold points (gem.faults.hold_point) at which a process
    GEM_HOLD_RELEASE        waits until the file GEM_HOLD_RELEASE exists: a test's way to hold
                            Spark tasks back (a straggler, a run waiting for an executor to join);
                            passed to executors as spark.executorEnv.*, never a setting.
    GEM_CODE_VERSION        the code version recorded with metrics and benchmark results where the
                            checkout has no git history (a copied tree on a device machine).

The shell environment of infra/airflow/airflow_env.sh also reads GEM_REPO (the checkout to serve
the DAGs from) and GEM_AIRFLOW_HOST, GEM_AIRFLOW_PORT, GEM_AIRFLOW_USERS (the local API server's
address and users): Airflow's own settings, exported before Python starts. When it sets the
embedded SQLite DB (no AIRFLOW__DATABASE__SQL_ALCHEMY_CONN given), it records that URL in
GEM_AIRFLOW_DEFAULT_DB, so a later sourcing for another AIRFLOW_HOME moves it along.

Airflow's API server (gem.pipeline.airflow.api), where to reach it and as whom; credentials are
never settings, and without GEM_AIRFLOW_API_URL `gem` starts a server of its own:
    GEM_AIRFLOW_API_URL       the API server's base URL (e.g. a deployment's).
    GEM_AIRFLOW_API_USER      the user to log in as (default admin).
    GEM_AIRFLOW_API_PASSWORD  its password (default: the one Airflow generated into $AIRFLOW_HOME).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

CONFIG_FILE_ENV = "GEM_CONFIG"
DAG_START_ENV = "GEM_DAG_START_DS"
RETRIES_ENV = "GEM_TASK_RETRIES"
RETRY_DELAY_ENV = "GEM_TASK_RETRY_DELAY_S"
LANDING_POKE_ENV = "GEM_LANDING_POKE_S"
LANDING_TIMEOUT_ENV = "GEM_LANDING_TIMEOUT_S"
BACKFILL_POKE_ENV = "GEM_BACKFILL_POKE_S"
CRASH_AT_ENV = "GEM_CRASH_AT"
HOLD_AT_ENV = "GEM_HOLD_AT"
HOLD_RELEASE_ENV = "GEM_HOLD_RELEASE"
CODE_VERSION_ENV = "GEM_CODE_VERSION"
DEFAULT_DB_ENV = "GEM_AIRFLOW_DEFAULT_DB"
API_URL_ENV = "GEM_AIRFLOW_API_URL"
API_USER_ENV = "GEM_AIRFLOW_API_USER"
API_PASSWORD_ENV = "GEM_AIRFLOW_API_PASSWORD"


def code_version() -> str:
    """The commit the running code comes from: git's HEAD, else $GEM_CODE_VERSION for a copy of the
    tree without its git folder (a container image, a device machine), else "unknown"."""
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).resolve().parents[1],
                             capture_output=True, text=True, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return os.environ.get(CODE_VERSION_ENV, "unknown")

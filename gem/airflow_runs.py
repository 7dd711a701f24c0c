"""Running the daily DAG through Airflow from Python: its environment, its metadata DB, one day.

`make demo` (gem.demo) and the `gem` command (gem.command) go through here. Airflow itself runs as
a subprocess with infra/airflow/airflow_env.sh sourced ($AIRFLOW_HOME, the SQLite DB, dags/), and
the jobs its tasks launch find the pipeline's config through $GEM_CONFIG.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from gem.config import REPO_ROOT, GemConfig
from gem.orchestration import DAG_ID, DAG_START_ENV, manual_logical_date


def airflow_home() -> Path:
    """Where infra/airflow/airflow_env.sh puts Airflow's files: $AIRFLOW_HOME, else <repo>/.airflow."""
    return Path(os.environ.get("AIRFLOW_HOME") or REPO_ROOT / ".airflow")


def airflow_env(cfg: GemConfig, cfg_path: str | os.PathLike[str] | None) -> dict[str, str]:
    """This process's environment for Airflow and its tasks: $GEM_CONFIG (absolute, when a config
    file is given), the DAG's start date at the config's start_ds (a history before the default one
    gets task instances), and this interpreter's bin/ first on PATH (the `airflow` it installed)."""
    env = dict(os.environ)
    if cfg_path is not None:
        env["GEM_CONFIG"] = str(Path(cfg_path).resolve())
    env[DAG_START_ENV] = cfg.start_ds
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '')}"
    return env


def airflow(cmd: str, env: dict[str, str], capture: bool = False, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run a shell command with infra/airflow/airflow_env.sh sourced, from the repo root."""
    script = f". infra/airflow/airflow_env.sh && {cmd}"
    return subprocess.run(["bash", "-c", script], cwd=REPO_ROOT, env=env, check=check, text=True,
                          capture_output=capture)


def init_db(env: dict[str, str]) -> None:
    """Create or upgrade the metadata DB and the gpu pool (infra/airflow/init_db.sh; idempotent)."""
    airflow("bash infra/airflow/init_db.sh >/dev/null", env)


def run_day(ds: str, env: dict[str, str], dag_id: str = DAG_ID) -> bool:
    """One DAG run processing ds (`airflow dags test DAG ds+1`; gem/orchestration.py says why +1);
    True when the run succeeded. Its log goes to this process's stdout and stderr."""
    return airflow(f"airflow dags test {dag_id} {manual_logical_date(ds)}", env, check=False).returncode == 0


def failed_runs(env: dict[str, str], dag_id: str = DAG_ID) -> list[dict[str, Any]]:
    """The DAG's failed runs, from Airflow's metadata DB (`airflow dags list-runs --state failed`)."""
    out = airflow(f"airflow dags list-runs {dag_id} --state failed -o json", env, capture=True, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"`airflow dags list-runs {dag_id}` failed (exit {out.returncode}): {out.stderr[-2000:]}")
    # The JSON list is the last line that parses; Airflow logs warnings to stdout before it.
    for line in reversed(out.stdout.splitlines()):
        if line.startswith("["):
            try:
                return json.loads(line)
            except json.JSONDecodeError:
                continue
    return []

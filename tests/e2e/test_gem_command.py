"""`gem run` and `gem status` against real Airflow, on a day whose landing data never arrives.

With `source: landing` and no landing partition, `gem run --ds D` runs gem_daily through Airflow
(`airflow dags test`): generate_events skips, the landing sensor times out (its timeout shortened
to a second), and the run fails; the DAG's failure callback records the task and its error, and
`gem status` lists the failed run with them. `gem run` prints a line per task and where the log
is. No Spark job starts, so the test stays short.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from gem.pipeline.airflow.orchestration import LANDING_POKE_ENV, LANDING_TIMEOUT_ENV, REPO_ROOT, read_task_failures
from tests.support import PYTHON, airflow_test_env

# Not marked slow: the one real Airflow run in `make test`'s default tier (it starts no Spark job).

DS = "2026-01-01"


def _gem(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "gem", *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=600, check=False)


def test_a_failed_run_is_recorded_and_listed_by_status(tmp_path: Path) -> None:
    cfg_file = tmp_path / "gem.yaml"
    cfg_file.write_text(yaml.safe_dump({"lakehouse_uri": str(tmp_path / "lakehouse"), "source": "landing",
                                        "start_ds": DS}))
    home = tmp_path / "airflow_home"
    env = airflow_test_env(home, cfg_file, **{
        LANDING_POKE_ENV: "1", LANDING_TIMEOUT_ENV: "1",
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(REPO_ROOT),
    })

    run = _gem(["run", "--ds", DS, "--config", str(cfg_file)], env)
    assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
    assert f"gem_daily ds={DS}: failed" in run.stdout
    # One line per finished task (day, task, state, seconds); Airflow's log in the file it names.
    tasks = {parts[1]: parts[2] for parts in (line.split() for line in run.stdout.splitlines())
             if len(parts) == 4 and parts[0] == DS and parts[3].endswith("s")}
    assert tasks["generate_events"] == "skipped" and tasks["wait_for_landing"] == "failed", run.stdout
    assert tasks["ingest_events"] == "upstream_failed", run.stdout
    log = Path(run.stdout.split("log: ", 1)[1].split("\n", 1)[0])
    assert log == home / "runs" / f"gem_daily-{DS}.log"
    assert f"waiting for {tmp_path / 'lakehouse' / '_landing' / f'ds={DS}' / '_SUCCESS'}" in log.read_text()

    (failure,) = read_task_failures(home)
    assert (failure["dag_id"], failure["task_id"], failure["ds"], failure["try_number"]) == (
        "gem_daily", "wait_for_landing", DS, 1)
    assert failure["error"].startswith("AirflowSensorTimeout"), failure
    assert failure["log_url"].endswith("/tasks/wait_for_landing?try_number=1"), failure

    status = _gem(["status", "--end", DS, "--config", str(cfg_file)], env)
    assert status.returncode == 0, status.stderr[-3000:]
    assert "Airflow: 1 failed run(s) of gem_daily:" in status.stdout, status.stdout
    assert f"run {failure['run_id']} (logical date 2026-01-02, ds={DS})" in status.stdout
    assert f"wait_for_landing (try 1): {failure['error']}\n      log: {failure['log_url']}" in status.stdout
    assert "ingest_events      missing" in status.stdout  # nothing was ingested

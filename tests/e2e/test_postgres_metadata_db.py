"""`gem run` and `gem status` with Airflow's metadata DB on Postgres (AIRFLOW__DATABASE__SQL_ALCHEMY_CONN),
as on SQLite (tests/e2e/test_gem_command.py): the day whose landing data never arrives fails, `gem run`
prints its task lines and `gem status` lists the failed run, both through Airflow's API (the server
gem starts), with no SQLite file anywhere and the run in Postgres.

Postgres is Debian's, started in a temporary folder on a free loopback port
(gem.pipeline.services.PostgresServer). Slow: `airflow db migrate` on an empty Postgres.
"""

from __future__ import annotations

import os
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import psycopg2
import pytest
import yaml

from gem.pipeline.airflow.orchestration import LANDING_POKE_ENV, LANDING_TIMEOUT_ENV, REPO_ROOT, read_task_failures
from gem.pipeline.services import PostgresServer
from tests.support import PYTHON, airflow_test_env

pytestmark = pytest.mark.slow

DS = "2026-01-01"


def _gem(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "gem", *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=900, check=False)


def test_run_and_status_go_through_the_api_on_a_postgres_metadata_db(tmp_path: Path) -> None:
    cfg_file = tmp_path / "gem.yaml"
    cfg_file.write_text(yaml.safe_dump({"lakehouse_uri": str(tmp_path / "lakehouse"), "source": "landing",
                                        "start_ds": DS}))
    home = tmp_path / "airflow_home"
    with PostgresServer(tmp_path / "postgres") as postgres:
        env = airflow_test_env(home, cfg_file, **{
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": postgres.url, LANDING_POKE_ENV: "1", LANDING_TIMEOUT_ENV: "1",
            "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}", "PYTHONPATH": str(REPO_ROOT),
        })
        run = _gem(["run", "--ds", DS, "--config", str(cfg_file)], env)
        assert run.returncode == 1, run.stdout[-3000:] + run.stderr[-3000:]
        tasks = {parts[1]: parts[2] for parts in (line.split() for line in run.stdout.splitlines())
                 if len(parts) == 4 and parts[0] == DS and parts[3].endswith("s")}
        assert tasks["wait_for_landing"] == "failed" and tasks["ingest_events"] == "upstream_failed", run.stdout

        status = _gem(["status", "--end", DS, "--config", str(cfg_file)], env)
        assert status.returncode == 0, status.stdout[-3000:] + status.stderr[-3000:]
        (failure,) = read_task_failures(home)
        assert "Airflow: 1 failed run(s) of gem_daily:" in status.stdout, status.stdout
        assert f"run {failure['run_id']} (logical date 2026-01-02, ds={DS})" in status.stdout
        assert f"wait_for_landing (try 1): {failure['error']}" in status.stdout

        with closing(psycopg2.connect(host=postgres.host, port=postgres.port, user=postgres.user,
                                      dbname=postgres.database)) as conn, conn.cursor() as cur:
            cur.execute("SELECT run_id, state FROM dag_run WHERE dag_id = 'gem_daily'")
            assert cur.fetchall() == [(failure["run_id"], "failed")]
    assert not list(tmp_path.rglob("*.db")), "a SQLite DB was written beside Postgres"

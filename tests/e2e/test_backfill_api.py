"""`gem backfill` drives Airflow's backfill through the REST API, on days whose landing data never
arrives (no Spark job starts): the API server gem starts serves the scheduler stack it starts too, the
DAG is unpaused for the backfill and paused again, each day's run is a backfill run whose task lines
and final state are printed, and a backfill Airflow refuses is reported with Airflow's reason.
Slow: a scheduler and a DAG processor run the two days one after the other.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from gem.pipeline.airflow.orchestration import LANDING_POKE_ENV, LANDING_TIMEOUT_ENV, REPO_ROOT
from tests.support import PYTHON, airflow_test_env

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

DAYS = ("2026-01-01", "2026-01-02")


def _gem(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PYTHON, "-m", "gem", *args], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=1500, check=False)


def test_a_backfill_runs_each_day_as_a_backfill_run_through_the_api(tmp_path: Path) -> None:
    cfg_file = tmp_path / "gem.yaml"
    cfg_file.write_text(yaml.safe_dump({"lakehouse_uri": str(tmp_path / "lakehouse"), "source": "landing",
                                        "start_ds": DAYS[0]}))
    home = tmp_path / "airflow_home"
    env = airflow_test_env(home, cfg_file, **{
        LANDING_POKE_ENV: "1", LANDING_TIMEOUT_ENV: "1", "PYTHONPATH": str(REPO_ROOT),
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
    })
    args = ["backfill", "--start", DAYS[0], "--end", DAYS[1], "--config", str(cfg_file)]
    first = _gem(args, env)
    assert first.returncode == 1, first.stdout[-4000:] + first.stderr[-4000:]  # the landing data never came
    for ds in DAYS:
        assert f"  {ds}  wait_for_landing" in first.stdout and f"  {ds}  run failed" in first.stdout, first.stdout
    with sqlite3.connect(home / "airflow.db") as conn:
        runs = conn.execute("SELECT substr(logical_date, 1, 10), run_type, state FROM dag_run "
                            "WHERE dag_id = 'gem_daily' ORDER BY logical_date").fetchall()
        paused = conn.execute("SELECT is_paused FROM dag WHERE dag_id = 'gem_daily'").fetchall()
    assert runs == [(ds, "backfill", "failed") for ds in DAYS]
    assert paused == [(1,)]  # a new DAG starts paused; paused again after the backfill
    assert (home / "runs" / f"backfill-{DAYS[0]}..{DAYS[1]}" / "scheduler.log").is_file()
    # One API server for gem's queries and the task processes' execution API: the one gem started.
    assert "path=/execution/" in (home / "runs" / f"backfill-{DAYS[0]}..{DAYS[1]}" / "api-server.log").read_text()

    # Airflow refuses `none` for a DAG with depends_on_past tasks: gem says so, and the DAG is paused again.
    again = _gem([*args, "--reprocess", "none"], env)
    assert again.returncode == 1 and "gem backfill: Airflow refused the backfill of gem_daily" in again.stderr \
        and "depends_on_past" in again.stderr, again.stdout[-4000:] + again.stderr[-4000:]
    with sqlite3.connect(home / "airflow.db") as conn:
        assert conn.execute("SELECT is_paused FROM dag WHERE dag_id = 'gem_daily'").fetchall() == [(1,)]

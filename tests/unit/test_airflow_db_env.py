"""Which metadata DB Airflow runs on: infra/airflow/airflow_env.sh keeps a configured one and sets the
embedded SQLite file only when none is configured, and gem.pipeline.airflow.api.embedded_db agrees
(gem then starts its own API server on that file, and only when it exists)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from gem.pipeline.airflow.api import embedded_db
from tests.support import REPO

CONN = "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"
POSTGRES = "postgresql+psycopg2://gem@127.0.0.1:5999/airflow"


def _sourced(env: dict[str, str]) -> dict[str, str]:
    """The environment infra/airflow/airflow_env.sh exports, sourced in a shell with `env`."""
    out = subprocess.run(["bash", "-c", ". infra/airflow/airflow_env.sh && env -0"], cwd=REPO, check=True,
                         capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", **env})
    return dict(item.split("=", 1) for item in out.stdout.split("\0") if "=" in item)


def test_without_a_configured_db_each_home_gets_its_own_sqlite_file(tmp_path: Path) -> None:
    first = _sourced({"AIRFLOW_HOME": str(tmp_path / "a")})
    assert first[CONN] == f"sqlite:///{tmp_path / 'a' / 'airflow.db'}"
    assert embedded_db({"AIRFLOW_HOME": str(tmp_path / "a")}) == embedded_db(first) == tmp_path / "a" / "airflow.db"
    # A shell that sourced it for one home and moves to another: the default moves along.
    second = _sourced({k: v for k, v in first.items() if k != "PATH"} | {"AIRFLOW_HOME": str(tmp_path / "b")})
    assert second[CONN] == f"sqlite:///{tmp_path / 'b' / 'airflow.db'}"
    assert embedded_db(second) == tmp_path / "b" / "airflow.db"


def test_a_configured_db_is_kept_and_is_not_the_embedded_one(tmp_path: Path) -> None:
    home = str(tmp_path / "home")
    assert _sourced({"AIRFLOW_HOME": home, CONN: POSTGRES})[CONN] == POSTGRES
    assert embedded_db({"AIRFLOW_HOME": home, CONN: POSTGRES}) is None
    by_command = _sourced({"AIRFLOW_HOME": home, f"{CONN}_CMD": "cat /run/secrets/airflow-db"})
    assert CONN not in by_command and embedded_db(by_command) is None
    # A configured API server: gem asks it, whatever DB this machine's home would have.
    assert embedded_db({"AIRFLOW_HOME": home, "GEM_AIRFLOW_API_URL": "http://airflow:8080"}) is None

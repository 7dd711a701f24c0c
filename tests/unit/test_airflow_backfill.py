"""What `gem backfill` reads from Airflow's metadata DB before and while it runs (gem.pipeline.airflow.backfill,
gem.pipeline.airflow.scheduler), on a SQLite DB holding just those tables. The backfill itself runs for real
in tests/e2e/test_backfill.py."""

from __future__ import annotations

import datetime as dt
import sqlite3
from pathlib import Path

from gem.pipeline.airflow.backfill import conflicting_manual_runs, later_days
from gem.pipeline.airflow.orchestration import manual_logical_date
from gem.pipeline.airflow.scheduler import dag_parsed, scheduler_alive

NOW = dt.datetime(2026, 1, 10, 12, 0, tzinfo=dt.UTC)


def _db(tmp_path: Path) -> Path:
    db = tmp_path / "airflow.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE dag_run (dag_id TEXT, run_id TEXT, logical_date TEXT, data_interval_start TEXT)")
        conn.execute("CREATE TABLE job (job_type TEXT, state TEXT, latest_heartbeat TEXT)")
        conn.execute("CREATE TABLE serialized_dag (dag_id TEXT)")
    return db


def test_a_midnight_manual_run_of_the_day_before_is_a_conflict_and_todays_manual_runs_are_not(tmp_path: Path) -> None:
    db = _db(tmp_path)
    sqlite_time = manual_logical_date("2026-01-02").replace("T", " ")[:19] + ".000000"  # as Airflow stores it
    with sqlite3.connect(db) as conn:
        conn.executemany("INSERT INTO dag_run VALUES ('gem_daily', ?, ?, ?)", [
            ("manual__old", "2026-01-03 00:00:00.000000", "2026-01-02 00:00:00.000000"),  # older dating: ds+1 midnight
            ("manual__new", sqlite_time, "2026-01-02 00:00:00.000000"),  # one second after the day closed
            ("backfill__x", "2026-01-04 00:00:00.000000", "2026-01-04 00:00:00.000000"),  # its own day
        ])
    assert conflicting_manual_runs(db, "2026-01-01", "2026-01-05") == [
        "manual__old (logical date 2026-01-03 00:00:00, processed ds=2026-01-02)"]
    assert conflicting_manual_runs(db, "2026-01-04", "2026-01-05") == []
    assert conflicting_manual_runs(tmp_path / "none.db", "2026-01-01", "2026-01-05") == []


def test_only_a_recent_heartbeat_counts_as_a_running_scheduler(tmp_path: Path) -> None:
    db = _db(tmp_path)
    assert not scheduler_alive(db, NOW)
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO job VALUES ('SchedulerJob', 'running', '2026-01-10 11:50:00.000000')")  # 10 min old
        conn.execute("INSERT INTO job VALUES ('SchedulerJob', 'failed', '2026-01-10 11:59:59.000000')")
    assert not scheduler_alive(db, NOW)
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO job VALUES ('SchedulerJob', 'running', '2026-01-10 11:59:40.000000')")
    assert scheduler_alive(db, NOW)
    assert not scheduler_alive(tmp_path / "none.db", NOW)


def test_dag_parsed_reads_the_serialized_dags(tmp_path: Path) -> None:
    db = _db(tmp_path)
    assert not dag_parsed(db, "gem_daily")
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO serialized_dag VALUES ('gem_daily')")
    assert dag_parsed(db, "gem_daily") and not dag_parsed(db, "other")


def test_later_days_run_from_the_day_after_the_range_to_the_newest_record() -> None:
    assert later_days("2026-01-03", "2026-01-05") == ["2026-01-04", "2026-01-05"]
    assert later_days("2026-01-03", "2026-01-03") == [] and later_days("2026-01-03", None) == []

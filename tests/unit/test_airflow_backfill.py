"""What `gem backfill` decides from the runs Airflow's API lists before it starts (gem.pipeline.airflow.backfill),
on runs made up here. The API's queries run against a real server in tests/e2e/test_airflow_api.py; the
backfill itself runs for real in tests/e2e/test_backfill.py."""

from __future__ import annotations

import datetime as dt

from gem.pipeline.airflow.api import Run, midnight
from gem.pipeline.airflow.backfill import conflicting_manual_runs, later_days, not_run_reason
from gem.pipeline.airflow.orchestration import manual_logical_date


def _run(run_id: str, logical: dt.datetime, ds: str, state: str = "success") -> Run:
    return Run("gem_daily", run_id, ds, logical, logical, run_id.split("__")[0], state)


def test_a_midnight_manual_run_of_the_day_before_is_a_conflict_and_todays_manual_runs_are_not() -> None:
    runs = [
        _run("manual__old", midnight("2026-01-03"), "2026-01-02"),  # older dating: ds+1 midnight
        _run("manual__new", dt.datetime.fromisoformat(manual_logical_date("2026-01-02")), "2026-01-02"),  # 1 s after
        _run("backfill__x", midnight("2026-01-04"), "2026-01-04"),  # its own day
    ]
    assert conflicting_manual_runs(runs, "2026-01-01", "2026-01-05") == [
        "manual__old (logical date 2026-01-03 00:00:00, processed ds=2026-01-02)"]
    assert conflicting_manual_runs(runs, "2026-01-04", "2026-01-05") == []
    assert conflicting_manual_runs([], "2026-01-01", "2026-01-05") == []


def test_a_day_the_backfill_leaves_out_says_why() -> None:
    assert not_run_reason(_run("backfill__a", midnight("2026-01-02"), "2026-01-02", "running")) == \
        "in flight (run backfill__a, running)"
    assert not_run_reason(_run("backfill__b", midnight("2026-01-02"), "2026-01-02")) == \
        "already exists (run backfill__b, success)"


def test_later_days_run_from_the_day_after_the_range_to_the_newest_record() -> None:
    assert later_days("2026-01-03", "2026-01-05") == ["2026-01-04", "2026-01-05"]
    assert later_days("2026-01-03", "2026-01-03") == [] and later_days("2026-01-03", None) == []

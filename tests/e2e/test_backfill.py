"""`gem backfill` goes through Airflow's own backfill and writes what daily runs write.

Three days of a small world (bench.backfill's), twice, each into its own lakehouse and Airflow home:
- daily: one `airflow dags test` run per day, in order (what `gem run` does);
- backfill: `gem backfill --start D1 --end D3` on a fresh home: `airflow backfill create`, run by the
  API server, DAG processor and LocalExecutor scheduler the command starts for it.
Every table then holds the same rows (run ids, times, Delta versions and file locations aside), the
backfill's three runs are backfill runs that ran one at a time in date order, and a second
`gem backfill --from-stage build_features` of day 2 reruns that stage onwards only and lists the
day-3 records that now rest on changed rows (not those that read rows rewritten unchanged). Day 2 pretrains on day 1 and day 3 warm-starts, so
training, precompute and distillation are compared too. `python -m bench.backfill` does the same
for 7 days.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import pytest

from bench.backfill import airflow_env, daily_runs, differing_tables, gem_backfill, world_config
from gem.config import load_config
from gem.lakehouse.completions import completion
from tests.support import query_db

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

DAYS = ["2026-01-01", "2026-01-02", "2026-01-03"]


@dataclass(frozen=True)
class Runs:
    daily: Path
    backfill: Path
    backfill_home: Path
    backfill_env: dict[str, str]
    output: str


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Runs:
    tmp = tmp_path_factory.mktemp("backfill")
    daily, backfill = world_config(tmp / "daily"), world_config(tmp / "backfill")
    daily_runs(airflow_env(tmp / "daily" / "airflow_home", daily), DAYS)
    home = tmp / "backfill" / "airflow_home"
    env = airflow_env(home, backfill)
    done = gem_backfill(env, DAYS[0], DAYS[-1])
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return Runs(daily, backfill, home, env, done.stdout)


def test_backfill_ran_each_day_as_a_backfill_run_one_at_a_time_in_order(runs: Runs) -> None:
    rows = query_db(runs.backfill_home / "airflow.db",
                    "SELECT substr(data_interval_start, 1, 10), run_type, state, start_date, end_date FROM dag_run "
                    "WHERE dag_id = 'gem_daily' ORDER BY start_date")
    assert [(ds, run_type, state) for ds, run_type, state, *_ in rows] == [(ds, "backfill", "success") for ds in DAYS]
    for (*_, end), (*_, next_start, _) in pairwise(rows):
        assert end <= next_start  # never two days at once
    for ds in DAYS:
        assert f"  {ds}  run success" in runs.output
        assert f"  {ds}  ingest_events" in runs.output  # the task lines, as they finished
    assert f"backfill {DAYS[0]}..{DAYS[-1]}: success" in runs.output


def test_every_table_equals_the_daily_runs(runs: Runs) -> None:
    differ, filled = differing_tables(runs.daily, runs.backfill)
    assert differ == []
    assert filled >= 15  # bronze, silver, examples, mixture, metrics, the precompute tables, completions


def test_from_stage_reruns_that_stage_on_and_lists_the_later_days_it_made_stale(runs: Runs) -> None:
    cfg = load_config(str(runs.backfill))
    before = {stage: completion(cfg, stage, DAYS[1])["run_id"] for stage in ("build_sequences", "build_features")}
    done = gem_backfill(runs.backfill_env, DAYS[1], DAYS[1], "--from-stage", "build_features")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    after = {stage: completion(cfg, stage, DAYS[1])["run_id"] for stage in before}
    assert after["build_sequences"] == before["build_sequences"]  # before the start: not rerun
    assert after["build_features"] != before["build_features"]
    (run_id,) = query_db(runs.backfill_home / "airflow.db", "SELECT run_id FROM dag_run WHERE dag_id = 'gem_daily' "
                         "AND substr(data_interval_start, 1, 10) = ?", DAYS[1])[0]
    folder = runs.backfill_home / "logs" / "dag_id=gem_daily" / f"run_id={run_id}" / "task_id=build_sequences"
    logs = [p.read_text() for p in folder.glob("attempt=*.log")]
    assert any("build_sequences: not rerun (this run starts at build_features)" in text for text in logs), logs
    # Day 2's features, examples and their validations were rewritten with the same rows: the day-3
    # records that read them (build_features first) stay valid. Its model was retrained, and the
    # FM outputs precompute rewrote are new content: day 3's distillation, which read them, is
    # listed with what to rerun.
    assert "later record(s) now rest on rewritten days" in done.stdout, done.stdout
    assert f"build_features ds={DAYS[2]}:" not in done.stdout, done.stdout
    assert f"distill ds={DAYS[2]}:" in done.stdout, done.stdout
    assert re.search(rf"all of them: gem backfill --start {DAYS[2]} --end {DAYS[2]} --from-stage \w+", done.stdout)

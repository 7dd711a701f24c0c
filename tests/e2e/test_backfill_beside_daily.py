"""A backfill running beside the daily run: nothing lost, nothing claimed that is not there.

One lakehouse and Airflow home with days 1-3 from daily runs; then, at the same time, as real
processes: `gem backfill --start D1 --end D2` (Airflow's backfill, on the scheduler stack it starts)
and `gem run --ds D4` (the next daily run, `airflow dags test`). Both write the same tables (other
days' partitions) and the same completion table. Checked afterwards:
- both succeeded, and every table holds what daily runs of days 1-4 one after the other hold (run
  ids, times, versions and file locations aside; reruns of a day rebuild the same rows, which
  tests/e2e/test_backfill.py shows);
- no record lies: every completion record's day partition, read at the table version the record
  names, holds the rows the table holds for that day now, and the stage contract calls every record
  either done or stale with its reason (a day-3 record that read day 2 before the backfill rewrote
  it is stale, never silently done).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.backfill import NOT_COMPARED, airflow_env, daily_runs, differing_tables, world_config
from gem.config import REPO_ROOT, load_config
from gem.data.delta_log import partition_types, read_table, table_version
from gem.lakehouse.staleness import DONE, STALE, Ledger, all_records
from gem.lakehouse.tables import table_path
from schemas import TABLES

pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

DAYS = ["2026-01-01", "2026-01-02", "2026-01-03", "2026-01-04"]


def _gem(args: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "gem", *args], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def beside(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, str]]:
    tmp = tmp_path_factory.mktemp("beside")
    reference, shared = world_config(tmp / "reference"), world_config(tmp / "shared")
    daily_runs(airflow_env(tmp / "reference" / "airflow_home", reference), DAYS)
    env = airflow_env(tmp / "shared" / "airflow_home", shared)
    daily_runs(env, DAYS[:3])
    backfill = _gem(["backfill", "--start", DAYS[0], "--end", DAYS[1], "--config", str(shared)], env)
    daily = _gem(["run", "--ds", DAYS[3], "--config", str(shared)], env)
    outputs = {name: proc.communicate(timeout=3000)[0] for name, proc in (("backfill", backfill), ("daily", daily))}
    codes = {"backfill": backfill.returncode, "daily": daily.returncode}
    assert codes == {"backfill": 0, "daily": 0}, {k: v[-4000:] for k, v in outputs.items()}
    return reference, shared, outputs


def test_tables_equal_the_days_run_one_after_the_other(beside) -> None:
    reference, shared, _ = beside
    differ, filled = differing_tables(reference, shared)
    assert differ == [] and filled >= 15


def test_no_record_names_a_version_that_does_not_hold_its_day(beside) -> None:
    _, shared, _ = beside
    cfg = load_config(str(shared))
    records = all_records(cfg)
    checked = 0
    for (stage, ds), record in records.items():
        for table, version in (record.get("table_versions") or {}).items():
            path = table_path(cfg, TABLES[table])
            if "ds" not in partition_types(path, table_version(path)):
                continue
            keep = [c for c in read_table(path, version=int(version)).column_names if c not in NOT_COMPARED]
            then = read_table(path, version=int(version), columns=keep, where={"ds": ds})
            now = read_table(path, columns=keep, where={"ds": ds})
            assert sorted(map(repr, then.to_pylist())) == sorted(map(repr, now.to_pylist())), (stage, ds, table, version)
            checked += 1
    assert checked >= 30


def test_every_record_is_done_or_stale_with_its_reason(beside) -> None:
    _, shared, outputs = beside
    cfg = load_config(str(shared))
    ledger = Ledger(all_records(cfg))
    ledger.warm(ledger.records)
    states = {key: ledger.status(*key) for key in ledger.records}
    assert {s.state for s in states.values()} <= {DONE, STALE}
    for key, status in states.items():
        if status.state == STALE:
            assert status.why and key[1] > DAYS[1], (key, status)  # only records after the backfilled days
    # Day 3's records read day 2, which the backfill rewrote after them: they must not pass for done.
    assert any(status.state == STALE and key[1] == DAYS[2] for key, status in states.items()), states
    assert "later record(s) now rest on rewritten days" in outputs["backfill"]

"""A backfill running beside the daily run: nothing lost, nothing claimed that is not there.

One lakehouse and Airflow home with days 1-3 from daily runs; then, at the same time, as real
processes: `gem backfill --start D1 --end D3` (Airflow's backfill, on the scheduler stack it starts)
and `gem run --ds D4` (the next daily run, `airflow dags test`, with task retries as in production,
only shorter). Both write the same tables (other days' partitions) and the same completion table.

Day 4 carries state from day 3, which the backfill is rewriting: its stateful tasks must refuse to
build on a day 3 whose records are withdrawn or rest on rewritten days (the stage contract's
freshness check fails the try, naming what to rerun). Checked afterwards:
- the backfill succeeded and day 4's build_sequences refused the day 3 being rewritten, naming it;
- no record lies: every completion record's day partition, read at the table version the record
  names, holds the rows the table holds for that day now;
- NOT YET (xfail): day 4 converges by retries to what daily runs of days 1-4 one after the other
  hold, every record done. Measured 2026-12-03: day 4's build_features succeeded on a retry between
  the backfill's rewrites of day 2 and day 3 (day 3's counts were not stale then), so the rewrite of
  day 3 made its record stale; validate_silver of day 4 then refused on every retry (27 tries seen),
  since Airflow does not rerun a succeeded upstream task. Nothing lied, but the run cannot finish
  without rerunning build_features of day 4: daily runs must wait while a backfill covers the days
  they read.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from bench.backfill import NOT_COMPARED, airflow_env, daily_runs, differing_tables, world_config
from gem.airflow_runs import run_log
from gem.config import REPO_ROOT, load_config
from gem.data.delta_log import partition_types, read_table, table_version
from gem.lakehouse.staleness import DONE, Ledger, all_records
from gem.lakehouse.tables import table_path
from gem.orchestration import RETRIES_ENV, RETRY_DELAY_ENV
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
    backfill = _gem(["backfill", "--start", DAYS[0], "--end", DAYS[2], "--config", str(shared)], env)
    # Retries as in production (2 tries, 5 minutes apart), tighter: enough for the backfill to finish.
    daily = _gem(["run", "--ds", DAYS[3], "--config", str(shared)],
                 env | {RETRIES_ENV: "30", RETRY_DELAY_ENV: "20"})
    outputs = {name: proc.communicate(timeout=3000)[0] for name, proc in (("backfill", backfill), ("daily", daily))}
    outputs["daily_log"] = run_log(env, DAYS[3]).read_text()
    outputs["codes"] = {"backfill": backfill.returncode, "daily": daily.returncode}
    assert backfill.returncode == 0, outputs["backfill"][-4000:]
    return reference, shared, outputs


CONVERGES = pytest.mark.xfail(reason="a daily run beside a backfill can consume a day the backfill rewrites later; "
                                     "its record goes stale and the run cannot finish by retries (module docstring)",
                              strict=False)


@CONVERGES
def test_tables_equal_the_days_run_one_after_the_other(beside) -> None:
    reference, shared, outputs = beside
    assert outputs["codes"]["daily"] == 0, outputs["daily"][-4000:]
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


def test_day_4_refused_the_day_3_being_rewritten(beside) -> None:
    _, _, outputs = beside
    # A try of a day-4 stage that carries state refused the day 3 being rewritten, naming it.
    refusals = re.findall(r"(?:StaleInputError|MissingInputError): (build_sequences ds=2026-01-04 needs [^\n]*)",
                          outputs["daily_log"])
    assert refusals and all("ds=2026-01-03" in r for r in refusals), outputs["daily_log"][-4000:]


@CONVERGES
def test_every_record_is_done(beside) -> None:
    _, shared, outputs = beside
    assert outputs["codes"]["daily"] == 0, outputs["daily"][-4000:]
    cfg = load_config(str(shared))
    ledger = Ledger(all_records(cfg))
    ledger.warm(ledger.records)
    states = {key: ledger.status(*key) for key in ledger.records}
    assert {key: s.why for key, s in states.items() if s.state != DONE} == {}
    assert {ds for _, ds in states} == set(DAYS)

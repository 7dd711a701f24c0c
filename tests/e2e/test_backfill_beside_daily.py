"""A backfill running beside the daily run: nothing lost, nothing claimed that is not there, and the
daily run finishes with what running the two one after the other gives.

One lakehouse and Airflow home with days 1-3 from daily runs; then, at the same time, as real
processes: `gem backfill --start D1 --end D3` (Airflow's backfill, on the scheduler stack it starts)
and, once the backfill holds its range, `gem run --ds D4` (the next daily run, `airflow dags test`).
Both write the same tables (other days' partitions) and the same completion table.

Day 4 reads day 3, which the backfill is rewriting: its tasks that read a day of the range wait
(gem.lakehouse.backfill_hold: rescheduled, not failed) until the backfill has finished, then run on
the rewritten days. Checked afterwards:
- the backfill succeeded and day 4's build_sequences waited for it, naming the day 3 it reads;
- no record lies: every completion record's day partition, read at the table version the record
  names, holds the rows the table holds for that day now;
- day 4 converged: every table equals what daily runs of days 1-4 one after the other hold, and
  every record is done. (Without the hold, day 4's build_features can read day 3 between the
  backfill's rewrites of days 2 and 3: its record goes stale, and validate_silver of day 4 refuses
  on every retry.)
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path
from urllib.parse import unquote

import pytest

from bench.backfill import NOT_COMPARED, airflow_env, daily_runs, differing_tables, world_config
from gem.config import REPO_ROOT, load_config
from gem.data.delta_log import logged_files, partition_types, read_table, table_version
from gem.lakehouse.backfill_hold import live_holds
from gem.lakehouse.stages import stage
from gem.lakehouse.staleness import DONE, Ledger, all_records
from gem.lakehouse.tables import table_path
from gem.pipeline.airflow.orchestration import BACKFILL_POKE_ENV
from gem.pipeline.airflow.runs import run_log
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
    shared_cfg = load_config(str(shared))
    deadline = time.monotonic() + 120
    while not live_holds(shared_cfg):  # the daily run starts once the backfill holds its range
        assert backfill.poll() is None and time.monotonic() < deadline, backfill.communicate()[0][-4000:]
        time.sleep(0.5)
    # The demo's retries (one, 10 s apart): the wait for the backfill must not spend them.
    daily = _gem(["run", "--ds", DAYS[3], "--config", str(shared)], env | {BACKFILL_POKE_ENV: "10"})
    outputs = {name: proc.communicate(timeout=3000)[0] for name, proc in (("backfill", backfill), ("daily", daily))}
    outputs["daily_log"] = run_log(env, DAYS[3]).read_text()
    outputs["codes"] = {"backfill": backfill.returncode, "daily": daily.returncode}
    assert backfill.returncode == 0, outputs["backfill"][-4000:]
    return reference, shared, outputs


def test_tables_equal_the_days_run_one_after_the_other(beside) -> None:
    reference, shared, outputs = beside
    assert outputs["codes"]["daily"] == 0, outputs["daily"][-4000:]
    differ, filled = differing_tables(reference, shared)
    assert differ == [] and filled >= 15


def _day_files(path: str, version: int, ds: str) -> set[str]:
    return {f.path for f in logged_files(path, version) if f.partition.get("ds") == ds}


def _adders(path: str, after: int) -> dict[str, str]:
    """Data file (absolute path) -> the stage whose commit after version `after` added it (the
    commit's userMetadata names its run), "" when no commit names one."""
    added = {}
    for log in sorted(Path(path, "_delta_log").glob("*.json")):
        if int(log.stem) <= after:
            continue
        actions = [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
        run = next((a["commitInfo"].get("userMetadata") or "" for a in actions if "commitInfo" in a), "")
        stage = json.loads(run).get("stage", "") if run.startswith("{") else ""
        for action in actions:
            if "add" in action:
                added[str(Path(path, unquote(action["add"]["path"])))] = stage
    return added


def test_no_record_names_a_version_that_does_not_hold_its_day(beside) -> None:
    _, shared, _ = beside
    cfg = load_config(str(shared))
    records = all_records(cfg)
    checked = 0
    for (name, ds), record in records.items():
        declared = stage(name).partitions(cfg, ds)  # e.g. build_features of D writes the counts of D-1
        for table, version in (record.get("table_versions") or {}).items():
            path = table_path(cfg, TABLES[table])
            if "ds" not in partition_types(path, table_version(path)):
                continue
            keep = [c for c in read_table(path, version=int(version)).column_names if c not in NOT_COMPARED]
            for day in declared.get(table) or [ds]:  # a validation writes nothing: the day it validated
                then = read_table(path, version=int(version), columns=keep, where={"ds": day})
                now = read_table(path, columns=keep, where={"ds": day})
                if sorted(map(repr, then.to_pylist())) != sorted(map(repr, now.to_pylist())):
                    # A table several stages write (gold.metrics: pretrain's rows and distill's, by
                    # arch): every file the record vouches for still stands; other stages added the rest.
                    files_then = _day_files(path, int(version), day)
                    files_now = _day_files(path, table_version(path), day)
                    assert files_then <= files_now, (name, ds, table, version, day, sorted(files_then - files_now))
                    added_by = _adders(path, int(version))
                    adders = {added_by[f] for f in files_now - files_then}
                    assert adders and name not in adders and "" not in adders, (name, ds, table, version, day, adders)
                checked += 1
    assert checked >= 30


def test_day_4_waited_for_the_backfill(beside) -> None:
    _, _, outputs = beside
    # Day 4's build_sequences reads its own record of day 3: it waited, naming it, without failing a try.
    waits = re.findall(r"waiting for a backfill: (build_sequences ds=2026-01-04 reads [^\n]*)", outputs["daily_log"])
    assert waits and all("build_sequences ds=2026-01-03, which backfill 2026-01-01..2026-01-03" in w for w in waits), \
        outputs["daily_log"][-4000:]
    assert "StaleInputError" not in outputs["daily_log"] and "MissingInputError" not in outputs["daily_log"]


def test_every_record_is_done(beside) -> None:
    _, shared, outputs = beside
    assert outputs["codes"]["daily"] == 0, outputs["daily"][-4000:]
    cfg = load_config(str(shared))
    ledger = Ledger(all_records(cfg))
    ledger.warm(ledger.records)
    states = {key: ledger.status(*key) for key in ledger.records}
    assert {key: s.why for key, s in states.items() if s.state != DONE} == {}
    assert {ds for _, ds in states} == set(DAYS)

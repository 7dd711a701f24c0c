"""gem.lakehouse.backfill_hold: while a backfill holds days A..B, a run of a later day that reads one of
them waits (StageCommit.begin refuses it before reading anything, and its DAG task is rescheduled
without spending a retry); runs that read nothing inside the range, runs of days inside it, and any
run once the hold is gone go ahead."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from gem import storage
from gem.lakehouse import backfill_hold
from gem.lakehouse.backfill_hold import BackfillInProgressError, hold, hold_path, live_holds, require_not_held
from gem.lakehouse.commit import StageCommit, StageContext
from gem.lakehouse.completions import MissingInputError
from gem.lakehouse.stages import stage
from tests.support import REPO, make_config

START, END, LATER = "2026-01-01", "2026-01-03", "2026-01-04"


def _needs(cfg, name: str, ds: str) -> list[tuple[str, str]]:
    return stage(name).needed(cfg, ds)


def test_a_later_day_reading_inside_the_range_waits_and_others_go_ahead(tmp_path):
    cfg = make_config(tmp_path)
    with hold(cfg, START, END, "backfill-test"):
        assert [(s, e) for s, e, _ in live_holds(cfg)] == [(START, END)]
        # build_sequences of day 4 advances its own record of day 3: held, naming that record.
        with pytest.raises(BackfillInProgressError, match=r"build_sequences ds=2026-01-04 reads build_sequences "
                                                          r"ds=2026-01-03, which backfill 2026-01-01..2026-01-03"):
            require_not_held(cfg, "build_sequences", LATER, _needs(cfg, "build_sequences", LATER))
        # ingest of day 4 reads only day 4's landing partition; day 3's own runs are the backfill's.
        require_not_held(cfg, "ingest_events", LATER, _needs(cfg, "ingest_events", LATER))
        require_not_held(cfg, "build_sequences", END, _needs(cfg, "build_sequences", END))
    assert live_holds(cfg) == [] and not storage.exists(hold_path(cfg, START, END))
    require_not_held(cfg, "build_sequences", LATER, _needs(cfg, "build_sequences", LATER))


def test_the_stage_contract_refuses_before_it_reads_anything(tmp_path):
    cfg = make_config(tmp_path)
    ctx = StageContext(cfg)
    # Held rather than "missing day 3's record": the backfill is about to write it.
    with hold(cfg, START, END, "backfill-test"), pytest.raises(BackfillInProgressError):
        StageCommit.begin(ctx, "build_sequences", LATER)
    with pytest.raises(MissingInputError):  # no hold: the usual check, which names what to run first
        StageCommit.begin(ctx, "build_sequences", LATER)


def test_a_record_needed_beyond_the_day_rules_is_held_too(tmp_path):
    cfg = make_config(tmp_path)
    commit = StageCommit.join(cfg, "distill", LATER, "distill:test")  # distill also reads precompute of its training day
    with hold(cfg, START, END, "backfill-test"), pytest.raises(BackfillInProgressError, match="precompute ds=2026-01-03"):
        commit.also_needs("precompute", END)
    with pytest.raises(MissingInputError):
        commit.also_needs("precompute", END)


def test_a_second_backfill_of_the_same_range_is_refused(tmp_path):
    cfg = make_config(tmp_path)
    second = ("import sys; from pathlib import Path; from tests.support import make_config; "
              "from gem.lakehouse.backfill_hold import hold\n"
              f"with hold(make_config(Path({str(tmp_path)!r})), {START!r}, {END!r}, 'backfill-second'): pass")
    with hold(cfg, START, END, "backfill-first"):
        refused = subprocess.run([sys.executable, "-c", second], cwd=REPO, capture_output=True, text=True, check=False)
    assert refused.returncode == 1 and "LeaseHeldError: backfill 2026-01-01..2026-01-03 is being run by backfill-first" \
        in refused.stderr, refused.stderr[-2000:]
    taken = subprocess.run([sys.executable, "-c", second], cwd=REPO, capture_output=True, text=True, check=False)
    assert taken.returncode == 0, taken.stderr[-2000:]  # released: the next backfill takes it


def test_a_killed_backfill_stops_holding(tmp_path):
    cfg = make_config(tmp_path)
    path = hold_path(cfg, START, END)
    # On this host: its pid is gone.
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    storage.write_json(path, {"run_id": "backfill-killed", "host": os.uname().nodename, "pid": gone.pid,
                              "started_at": "2026-12-03T00:00:00+00:00", "renewed_at": time.time()})
    assert live_holds(cfg) == []
    # On another host: alive until EXPIRY_S after its last renewal (its renewed_at).
    elsewhere = {"run_id": "backfill-elsewhere", "host": "another-host", "pid": 1,
                 "started_at": "2026-12-03T00:00:00+00:00", "renewed_at": time.time()}
    storage.write_json(path, elsewhere)
    assert [h["run_id"] for *_, h in live_holds(cfg)] == ["backfill-elsewhere"]
    storage.write_json(path, {**elsewhere, "renewed_at": time.time() - backfill_hold.EXPIRY_S - 1})
    assert live_holds(cfg) == []
    # A lease file without renewed_at: its modification time is the last renewal.
    del elsewhere["renewed_at"]
    storage.write_json(path, elsewhere)
    assert [h["run_id"] for *_, h in live_holds(cfg)] == ["backfill-elsewhere"]
    old = time.time() - backfill_hold.EXPIRY_S - 1
    os.utime(path, (old, old))
    assert live_holds(cfg) == []


def test_the_holder_renews_while_it_runs(tmp_path, monkeypatch):
    monkeypatch.setattr(backfill_hold, "RENEW_S", 0.05)
    cfg = make_config(tmp_path)
    with hold(cfg, START, END, "backfill-test"):
        path = hold_path(cfg, START, END)
        old = storage.read_json(path)["renewed_at"] - 1000
        storage.write_json(path, {**storage.read_json(path), "renewed_at": old})
        time.sleep(0.3)
        assert storage.read_json(path)["renewed_at"] > old + 900


def test_the_dag_task_is_rescheduled_not_failed(tmp_path, monkeypatch):
    from airflow.sdk.exceptions import AirflowRescheduleException

    from gem.pipeline.airflow.orchestration import BACKFILL_POKE_ENV, run_stage_task

    cfg = make_config(tmp_path)
    config_file = tmp_path / "gem.yaml"
    config_file.write_text(f"lakehouse_uri: {cfg.lakehouse_uri}\n")
    monkeypatch.setenv("GEM_CONFIG", str(config_file))
    monkeypatch.setenv(BACKFILL_POKE_ENV, "7")
    with hold(cfg, START, END, "backfill-test"), pytest.raises(AirflowRescheduleException) as rescheduled:
        run_stage_task("build_sequences", LATER)
    assert isinstance(rescheduled.value.__cause__, BackfillInProgressError)
    import datetime as dt

    wait = (rescheduled.value.reschedule_date - dt.datetime.now(dt.UTC)).total_seconds()
    assert 0 < wait <= 7

"""gem.lakehouse.commit.StageCommit, the one commit path: inputs checked, record withdrawn, only declared
partitions replaced, counts reconciled against the commits' own metrics, a record naming the
versions read and created. Through `deltalake` (the torch stages' path): no JVM."""

from __future__ import annotations

import datetime as dt
import multiprocessing
import time

import pyarrow as pa
import pytest

from gem.data.delta_log import read_table
from gem.lakehouse import completions, tables
from gem.lakehouse.commit import CHECKED, ReconciliationError, StageCommit, StageContext, UndeclaredWriteError
from schemas.metrics import GOLD_METRICS
from schemas.mixture import GOLD_MIXTURE_MANIFEST
from tests.support import make_config

DS = "2026-01-03"


def _metrics(ds: str, arch: str = "kunlun", tasks: tuple[str, ...] = ("reels/click", "fb_feed/click")) -> pa.Table:
    rows = [{
        "ds": dt.date.fromisoformat(ds), "run_id": f"{arch}:{ds}", "arch": arch, "task": task, "split": "eval",
        "examples": 100, "positives": 5.0, "ne": 0.95, "auc": 0.6, "calibration": 1.0, "train_steps": 7,
        "mixture_id": "mix-x", "examples_version": 3, "sequences_version": 2, "code_version": "abc",
        "config": "{}", "created_at": dt.datetime(2026, 1, 4, tzinfo=dt.UTC),
    } for task in tasks]
    return pa.Table.from_pylist(rows, schema=GOLD_METRICS.arrow_schema())


def _mix_record(cfg, ds: str, manifest_version: int = 7) -> None:
    completions.publish_completion(cfg, "mix", ds, f"test:{ds}", None, 0, {}, {GOLD_MIXTURE_MANIFEST.name: manifest_version},
                                 reconciliation="test stand-in")


def test_begin_checks_inputs_then_withdraws_the_old_record(tmp_path):
    cfg = make_config(tmp_path)
    with pytest.raises(completions.MissingInputError, match="mix ds=2026-01-03"):
        StageCommit.begin(StageContext(cfg), "pretrain", DS)
    _mix_record(cfg, DS)
    first = StageCommit.begin(StageContext(cfg), "pretrain", DS)
    first.replace_arrow(_metrics(DS), GOLD_METRICS, also={"arch": "kunlun"})
    first.publish(None, written_tables=(GOLD_METRICS,), no_input_count="scores")
    assert completions.completion(cfg, "pretrain", DS) is not None
    StageCommit.begin(StageContext(cfg), "pretrain", DS)  # a rerun starts: the old record is gone
    assert completions.completion(cfg, "pretrain", DS) is None


def test_record_names_the_versions_read_and_created(tmp_path):
    cfg = make_config(tmp_path)
    _mix_record(cfg, DS, manifest_version=7)
    commit = StageCommit.begin(StageContext(cfg), "pretrain", DS)
    version = commit.replace_arrow(_metrics(DS), GOLD_METRICS, also={"arch": "kunlun"})
    record = commit.publish(None, written_tables=(GOLD_METRICS,), no_input_count="scores")
    stored = completions.completion(cfg, "pretrain", DS)
    assert stored["input_versions"] == {f"mix:{GOLD_MIXTURE_MANIFEST.name}@{DS}": 7} == record["input_versions"]
    assert stored["table_versions"] == {GOLD_METRICS.name: version}
    assert (stored["rows_in"], stored["rows_written"], stored["reconciliation"]) == (None, 2, "scores")


def test_replacing_one_architecture_leaves_the_others_rows(tmp_path):
    cfg = make_config(tmp_path)
    _mix_record(cfg, DS)
    for arch in ("kunlun", "dlrm", "kunlun"):
        commit = StageCommit.begin(StageContext(cfg), "pretrain", DS)
        commit.replace_arrow(_metrics(DS, arch), GOLD_METRICS, also={"arch": arch})
        commit.publish(None, written_tables=(GOLD_METRICS,), no_input_count="scores")
    rows = read_table(GOLD_METRICS.path(cfg.lakehouse_uri)).to_pylist()
    assert sorted((r["arch"], r["task"]) for r in rows) == [
        ("dlrm", "fb_feed/click"), ("dlrm", "reels/click"), ("kunlun", "fb_feed/click"), ("kunlun", "reels/click")]


def test_undeclared_tables_and_days_are_refused(tmp_path):
    cfg = make_config(tmp_path)
    _mix_record(cfg, DS)
    commit = StageCommit.begin(StageContext(cfg), "pretrain", DS)
    with pytest.raises(UndeclaredWriteError, match="does not name"):
        commit.replace_arrow(_metrics(DS), GOLD_MIXTURE_MANIFEST)
    with pytest.raises(UndeclaredWriteError, match="asked for"):
        commit._declared_where(GOLD_METRICS, ["2026-01-02"])
    assert not (tmp_path / "lakehouse" / "gold" / "mixture_manifest").exists()


def test_counts_must_agree_with_the_commits_and_unchecked_counts_say_why(tmp_path):
    cfg = make_config(tmp_path)
    _mix_record(cfg, DS)
    commit = StageCommit.begin(StageContext(cfg), "pretrain", DS)
    commit.replace_arrow(_metrics(DS), GOLD_METRICS, also={"arch": "kunlun"})
    with pytest.raises(ReconciliationError, match="wrote 2 rows, the stage counted 3"):
        commit.publish(3, 3, written_tables=(GOLD_METRICS,))
    with pytest.raises(ValueError, match="say why"):
        commit.publish(None, written_tables=(GOLD_METRICS,))
    assert completions.completion(cfg, "pretrain", DS) is None  # nothing was published
    record = commit.publish(2, written_tables=(GOLD_METRICS,))
    assert (record["rows_in"], record["rows_written"], record["reconciliation"]) == (2, 2, CHECKED)


def test_a_torch_stage_never_opens_spark(tmp_path):
    with pytest.raises(RuntimeError, match="declared without Spark"):
        StageContext(make_config(tmp_path)).spark_for("pretrain", DS)


def _commit_day(lake: str, ds: str, barrier) -> None:
    cfg = make_config_at(lake)
    commit = StageCommit.begin(StageContext(cfg), "pretrain", ds)
    barrier.wait()  # both days commit at the same moment
    commit.replace_arrow(_metrics(ds), GOLD_METRICS, also={"arch": "kunlun"})
    commit.publish(None, written_tables=(GOLD_METRICS,), no_input_count="scores")


def make_config_at(lake: str):
    from gem.config import load_config

    return load_config(overrides={"lakehouse_uri": lake}, environ={})


def test_two_days_committing_at_once_record_their_own_versions(tmp_path):
    """Real processes: each day's record names the version its own commit created (found by its run
    id in the log), never the other day's, whichever commits first."""
    cfg = make_config(tmp_path)
    days = ("2026-01-03", "2026-01-04")
    for d in days:
        _mix_record(cfg, d)
    tables.ensure_table(None, cfg, GOLD_METRICS)
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_commit_day, args=(cfg.lakehouse_uri, d, barrier)) for d in days]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    from deltalake import DeltaTable

    by_run = {c.get("userMetadata"): int(c["version"]) for c in DeltaTable(GOLD_METRICS.path(cfg.lakehouse_uri)).history()}
    versions = []
    for d in days:
        record = completions.completion(cfg, "pretrain", d)
        version = record["table_versions"][GOLD_METRICS.name]
        meta = next(m for m, v in by_run.items() if v == version)
        assert meta is not None, (d, record, DeltaTable(GOLD_METRICS.path(cfg.lakehouse_uri)).history())
        assert f'"ds": "{d}"' in meta and record["run_id"] in meta
        assert record["rows_written"] == 2  # its own commit's rows, from that commit's metrics
        versions.append(version)
    assert len(set(versions)) == 2
    assert len(read_table(GOLD_METRICS.path(cfg.lakehouse_uri)).to_pylist()) == 4


def _rerun_day(lake: str, ds: str, barrier, results) -> None:
    cfg = make_config_at(lake)
    barrier.wait()  # both runs of one (stage, ds) start at the same moment
    for attempt in range(60):  # the run that finds the other's lease fails clearly; a retry succeeds
        if attempt:
            time.sleep(0.5)
        try:
            commit = StageCommit.begin(StageContext(cfg), "pretrain", ds)
            commit.replace_arrow(_metrics(ds), GOLD_METRICS, also={"arch": "kunlun"})
            commit.publish(None, written_tables=(GOLD_METRICS,), no_input_count="scores")
            results.put(("ok", attempt, commit.run_id))
            return
        except Exception as e:  # noqa: BLE001 - reported to the parent, which asserts on it
            results.put(("error", attempt, f"{type(e).__name__}: {e}"))


def test_two_runs_of_one_stage_and_day_at_once_end_as_one_run(tmp_path):
    """Real processes, one (stage, ds): the table ends with one run's rows, and the record names
    a version its own run committed, whichever order the commits land in."""
    cfg = make_config(tmp_path)
    _mix_record(cfg, DS)
    tables.ensure_table(None, cfg, GOLD_METRICS)
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=_rerun_day, args=(cfg.lakehouse_uri, DS, barrier, results)) for _ in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    outcomes = [results.get(timeout=5) for _ in range(results.qsize())]
    assert sum(o[0] == "ok" for o in outcomes) == 2, outcomes  # each run succeeded, at the latest on retry
    failures = [o[2] for o in outcomes if o[0] == "error"]
    # The run that found the other's lease failed with a clear error telling it to retry.
    assert all(f.startswith(f"LeaseHeldError: pretrain ds={DS}") and "retry" in f for f in failures), failures
    rows = read_table(GOLD_METRICS.path(cfg.lakehouse_uri)).to_pylist()
    assert sorted(r["task"] for r in rows) == ["fb_feed/click", "reels/click"]  # one run's rows, not two
    record = completions.completion(cfg, "pretrain", DS)
    from deltalake import DeltaTable

    history = DeltaTable(GOLD_METRICS.path(cfg.lakehouse_uri)).history()
    meta = next(c.get("userMetadata") for c in history if int(c["version"]) == record["table_versions"][GOLD_METRICS.name])
    assert record["run_id"] in meta


def test_a_run_holding_the_lease_refuses_a_second_and_a_dead_holder_is_taken_over(tmp_path):
    import os
    import subprocess

    from gem import storage
    from gem.lakehouse import lease

    cfg = make_config(tmp_path)
    _mix_record(cfg, DS)
    first = StageCommit.begin(StageContext(cfg), "pretrain", DS)
    # Another live process holding it: refused, naming the holder.
    holder = storage.read_json(lease.lease_path(cfg, "pretrain", DS))
    sleeper = subprocess.Popen(["sleep", "30"])
    try:
        storage.write_json(lease.lease_path(cfg, "pretrain", DS), {**holder, "pid": sleeper.pid})
        with pytest.raises(lease.LeaseHeldError, match=f"{first.run_id}.*pid {sleeper.pid}.*retry"):
            StageCommit.begin(StageContext(cfg), "pretrain", DS)
    finally:
        sleeper.kill()
        sleeper.wait()
    # Its process gone: the lease is taken over; publishing releases it.
    second = StageCommit.begin(StageContext(cfg), "pretrain", DS)
    assert storage.read_json(lease.lease_path(cfg, "pretrain", DS))["run_id"] == second.run_id
    second.replace_arrow(_metrics(DS), GOLD_METRICS, also={"arch": "kunlun"})
    second.publish(None, written_tables=(GOLD_METRICS,), no_input_count="scores")
    assert not storage.exists(lease.lease_path(cfg, "pretrain", DS))
    assert os.getpid() == holder["pid"]


def test_a_range_needs_a_stage_declared_with_ranges(tmp_path):
    from gem.lakehouse.commit import UndeclaredWriteError

    cfg = make_config(tmp_path)
    with pytest.raises(UndeclaredWriteError, match="pretrain is not declared with ranges"):
        StageCommit.begin(StageContext(cfg), "pretrain", DS, "2026-01-05")

"""gem.pipeline.demo's closing printout, read back from the tables it summarizes (no Spark, no Airflow run)."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

from gem.days import shift_day
from gem.lakehouse import completions
from gem.lakehouse.commit import StageCommit, StageContext
from gem.lakehouse.landing import mark_partition_complete
from gem.pipeline import demo
from gem.train.daily import write_metrics as write_run_metrics
from tests.support import make_config


def write_metrics(cfg, rows: list[dict]) -> None:
    """Commit a run's metrics as the pretraining stage does, after a stand-in for its mixture's record."""
    ds = rows[0]["ds"].isoformat()
    completions.publish_completion(cfg, "mix", ds, "test", None, 0, {}, {}, reconciliation="test stand-in")
    commit = StageCommit.begin(StageContext(cfg), "pretrain", ds)
    write_run_metrics(commit, rows)
    commit.publish(None, no_input_count="test")


def _rows(ds: str, run_id: str, created: dt.datetime, auc: float, positives: float = 50.0) -> list[dict]:
    return [{
        "ds": dt.date.fromisoformat(ds), "run_id": run_id, "arch": "kunlun", "task": task, "split": "eval",
        "examples": 1000, "positives": positives, "ne": 0.95, "auc": auc, "calibration": 1.0, "train_steps": 7,
        "mixture_id": "mix-x", "examples_version": 3, "sequences_version": 2, "code_version": "abc",
        "config": "{}", "created_at": created,
    } for task in ("reels/click", "fb_feed/click")]


def test_model_metrics_shows_the_latest_run_with_its_partition_day(tmp_path: Path) -> None:
    """gold.metrics is partitioned by ds: the held-out day must come back from the Delta log (reading
    the data files alone raised KeyError: 'ds' at the end of every demo)."""
    cfg = make_config(tmp_path)
    assert demo.model_metrics(cfg) is None
    t0 = dt.datetime(2026, 1, 3, tzinfo=dt.UTC)
    write_metrics(cfg, _rows("2026-01-02", "kunlun:2026-01-02:old", t0, 0.55))
    write_metrics(cfg, _rows("2026-01-03", "kunlun:2026-01-03:new", t0 + dt.timedelta(hours=1), 0.66))
    text = demo.model_metrics(cfg)
    assert text is not None
    assert "kunlun:2026-01-03:new" in text and ":old" not in text
    held_out = shift_day("2026-01-03", -cfg.attribution_window_days)
    assert f"held-out day {held_out} of the mixture of 2026-01-03" in text and "(2 runs in gold.metrics)" in text
    assert "floor" not in text.splitlines()[1]  # no landing manifest with a floor for that day: no column
    assert "reels/click" in text and "0.6600" in text and "0.5500" not in text
    # A rerun of a day replaces that day's run (gold.metrics holds one run per day and architecture).
    write_metrics(cfg, _rows("2026-01-03", "kunlun:2026-01-03:rerun", t0 + dt.timedelta(hours=2), 0.77))
    text = demo.model_metrics(cfg)
    assert "kunlun:2026-01-03:rerun" in text and "(2 runs in gold.metrics)" in text


def test_summary_counts_rows_per_day_from_the_log(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    write_metrics(cfg, _rows("2026-01-02", "kunlun:2026-01-02:a", dt.datetime(2026, 1, 3, tzinfo=dt.UTC), 0.6))
    summary = demo.summarize(cfg)
    assert "gold.metrics" in summary and "2026-01-02: 2" in summary
    assert "bronze.ad_events" in summary and "(not written)" in summary


def test_model_metrics_prints_the_bayes_floor_of_the_held_out_day_beside_ne(tmp_path: Path) -> None:
    cfg = make_config(tmp_path)
    write_metrics(cfg, _rows("2026-01-10", "kunlun:2026-01-10:a", dt.datetime(2026, 1, 11, tzinfo=dt.UTC), 0.6))
    held_out = shift_day("2026-01-10", -cfg.attribution_window_days)
    mark_partition_complete(cfg.landing_root, held_out, {"bayes_floor": {
        "reels/click": {"examples": 1000, "positives": 50, "ne": 0.8123}, "fb_feed/click": {"ne": None}}})
    header, *rows = demo.model_metrics(cfg).splitlines()[1:]
    assert header.split() == ["task", "examples", "positives", "NE", "floor", "to", "floor", "AUC", "calib"]
    reels = next(r for r in rows if r.split()[0] == "reels/click").split()
    assert reels[3:5] == ["0.9500", "0.8123"]  # NE, then the floor beside it
    assert reels[5] == f"{100 * 0.05 / (1 - 0.8123):.0f}%"  # the share of the way from NE 1 to the floor
    assert next(r for r in rows if r.split()[0] == "fb_feed/click").split()[4] == "n/a"


def test_a_task_with_too_few_held_out_positives_shows_no_figures(tmp_path: Path) -> None:
    """report.min_positives: below it a task's NE, AUC and calibration are noise, so the table says so
    instead of printing them; at it they print."""
    cfg = make_config(tmp_path, report={"min_positives": 30})
    t0 = dt.datetime(2026, 1, 11, tzinfo=dt.UTC)
    rows = _rows("2026-01-10", "kunlun:2026-01-10:a", t0, 0.61, positives=29.0)
    rows[1]["positives"] = 30.0  # fb_feed/click
    write_metrics(cfg, rows)
    lines = demo.model_metrics(cfg).splitlines()[2:]
    reels = next(r for r in lines if r.split()[0] == "reels/click")
    fb = next(r for r in lines if r.split()[0] == "fb_feed/click")
    assert "too few positives to read (< 30)" in reels and "0.9500" not in reels and "0.6100" not in reels
    assert fb.split()[3:5] == ["0.9500", "0.6100"] and "too few" not in fb


def test_students_print_beside_the_fm_and_never_as_the_pretraining_run(tmp_path: Path) -> None:
    """A distill run's rows (the student's, the no-FM baseline student's and the FM's logged
    predictions) come after pretraining's: the pretraining table still shows the FM's run, and the
    students' table puts each task's student NE beside the baseline's and the FM's."""
    from gem.distill.run import FM_ARCH, student_arch

    cfg = make_config(tmp_path)
    assert demo.student_metrics(cfg) is None
    t0 = dt.datetime(2026, 1, 3, tzinfo=dt.UTC)
    write_metrics(cfg, _rows("2026-01-03", "kunlun:2026-01-03:fm", t0, 0.66))
    for stage, day in (("precompute", "2026-01-03"), ("validate_examples", "2026-01-03"),
                       ("validate_silver", "2026-01-03")):
        completions.publish_completion(cfg, stage, shift_day(day, 0), "test", None, 0, {}, {},
                                       reconciliation="test stand-in")
    commit = StageCommit.begin(StageContext(cfg), "distill", "2026-01-03")
    later = t0 + dt.timedelta(hours=1)
    for arch, ne in ((student_arch(cfg.student.variant), 0.97), (student_arch("baseline"), 0.99), (FM_ARCH, 0.91)):
        write_run_metrics(commit, [{**r, "arch": arch, "ne": ne} for r in _rows("2026-01-03", "distill:x", later, 0.6)])
    commit.publish(None, no_input_count="test")
    assert "kunlun:2026-01-03:fm" in demo.model_metrics(cfg)
    text = demo.student_metrics(cfg)
    assert text is not None and "distill:x" in text
    reels = next(line for line in text.splitlines() if line.split()[0] == "reels/click").split()
    # steps, student NE, AUC; the baseline student's NE, AUC; the FM's NE, AUC
    assert reels[2:] == ["7", "0.9700", "0.6000", "0.9900", "0.6000", "0.9100", "0.6000"]
    # A task with too few held-out positives reads as such, not as figures.
    few = make_config(tmp_path, report={"min_positives": 51})
    reels = next(line for line in demo.student_metrics(few).splitlines() if line.split()[0] == "reels/click")
    assert "too few positives to read (50 < 51)" in reels and "0.9700" not in reels


def test_task_seconds_has_a_column_per_day_a_run_processed() -> None:
    """A column per day a run processed (the task instances of its run, as Airflow's API gave them),
    whatever the run's logical date: a manual run of 2026-01-04 is dated 2026-01-05 00:00:01."""
    from gem.pipeline.airflow.api import TaskRun

    at = dt.datetime(2026, 12, 3, 10, 0, tzinfo=dt.UTC)
    tasks = {"2026-01-04": [TaskRun("ingest_events", "success", at, at + dt.timedelta(seconds=41)),
                            TaskRun("mix", "skipped", at + dt.timedelta(seconds=60), at + dt.timedelta(seconds=61))]}
    lines = demo.task_seconds(tasks, ["2026-01-04"]).splitlines()
    assert lines[0].split() == ["task", "2026-01-04"]
    assert lines[1].split() == ["ingest_events", "41s"] and lines[2].split() == ["mix", "1s", "skipped"]
    assert lines[3].split() == ["all", "tasks", "42s"]


def test_an_airflow_days_output_goes_to_its_log_and_then_back(tmp_path: Path) -> None:
    """gem.pipeline.demo_process: inside `output_to`, Python's and raw writes to descriptors 1 and 2 (where
    Airflow's handlers and the JVM write) land in the log; afterwards they reach the parent again."""
    import subprocess
    import sys

    log = tmp_path / "runs" / "day.log"
    script = (
        "import os, sys\n"
        "from pathlib import Path\n"
        "from gem.pipeline.demo_process import output_to\n"
        "print('before', flush=True)\n"
        f"with output_to(Path({str(log)!r})):\n"
        "    print('inside'); print('inside err', file=sys.stderr); os.write(1, b'raw\\n')\n"
        "print('after', flush=True)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                          cwd=Path(demo.__file__).resolve().parents[1])
    assert done.stdout.split() == ["before", "after"]
    assert sorted(log.read_text().split("\n")) == ["", "inside", "inside err", "raw"]


def test_task_seconds_gives_the_bulk_path_a_column_of_its_own() -> None:
    """The bulk path's runs (from gem.pipeline.demo_process's STAGE_RUN lines) in one column before
    the Airflow runs': a stage's runs summed, "skipped" only where none of them ran."""
    from gem.pipeline.airflow.api import TaskRun
    from gem.pipeline.bulk import StageRun
    from gem.pipeline.demo_process import STAGE_RUN, parse_stage_run, stage_run_line

    at = dt.datetime(2026, 12, 3, 10, 0, tzinfo=dt.UTC)
    tasks = {"2026-01-04": [TaskRun("generate_events", "success", at, at + dt.timedelta(seconds=5)),
                            TaskRun("ingest_events", "success", at + dt.timedelta(seconds=5),
                                    at + dt.timedelta(seconds=45))]}
    runs = [StageRun("2026-01-01", "generate_events", "2026-01-01", "success", 1.2),
            StageRun("2026-01-02", "generate_events", "2026-01-02", "success", 2.1),
            StageRun("2026-01-01", "ingest_events", "2026-01-01", "success", 30.4, "ingested", through="2026-01-02"),
            StageRun("2026-01-01", "mix", None, "skipped", 0.2), StageRun("2026-01-02", "mix", None, "skipped", 0.1)]
    # What the parent reads back from the child's line is the run itself.
    assert [parse_stage_run(stage_run_line(r).removeprefix(STAGE_RUN + " ")) for r in runs] == runs
    lines = demo.task_seconds(tasks, ["2026-01-04"], runs).splitlines()
    assert lines[0].split() == ["task", "bulk", "2026-01-01..2026-01-02", "2026-01-04"]
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:]}
    assert rows["generate_events"] == ["3s", "5s"] and rows["ingest_events"] == ["30s", "40s"]
    assert rows["mix"] == ["0s", "skipped", "-"]
    assert rows["all"] == ["tasks", "34s", "45s"]

"""Fast checks that dags/ parses cleanly and gem_daily runs the right jobs for the right partition.

Parsing happens on every DAG-processor loop, so it must stay import-light and quick; the date
rules (ds = UTC date of data_interval_start) are checked against the real Airflow timetable, not
a re-implementation of it.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gem.lakehouse import stages
from gem.pipeline.airflow import orchestration
from gem.pipeline.airflow.orchestration import REPO_ROOT, manual_logical_date, partition_ds
from tests.support import DAG_OUTLETS, ruff_path

DAGS = REPO_ROOT / "dags"
DAG_FILE = DAGS / "gem_daily.py"
# The expected shape, written out here on purpose (the DAG file is what is under test).
UPSTREAM = {
    "generate_events": set(),
    "wait_for_landing": {"generate_events"},
    "ingest_events": {"wait_for_landing"},
    "validate_events": {"ingest_events"},
    "build_sequences": {"validate_events"},
    "build_features": {"validate_events"},
    "validate_silver": {"build_sequences", "build_features"},
    "assemble_examples": {"validate_silver"},
    "validate_examples": {"assemble_examples"},
    "mix": {"validate_examples"},
    "pretrain": {"mix"},
    "precompute": {"pretrain"},
    "distill": {"precompute"},
}
SENSOR = "wait_for_landing"
SKIPPABLE = {"generate_events", "assemble_examples", "validate_examples", "mix", "pretrain", "precompute", "distill"}
# Everything else runs in the default pool; precompute is a Spark stage whose executors hold the GPUs.
POOLS = {"pretrain": "gpu", "distill": "gpu"}
# The tasks that wait for their own previous run (day-over-day state), written out by hand; each
# task's Assets: tests.support.DAG_OUTLETS.
DEPENDS_ON_PAST = {"build_sequences"}
# Tasks that take --ready-on (process the day whose window closes on the run's day) and skip on 99.
READY_ON = {"assemble_examples": "assemble_examples", "validate_examples": "validate_silver --examples"}
JOBS = [t for t in UPSTREAM if t != SENSOR]
HEAVY = ["pyspark", "torch", "pandas", "great_expectations", "delta", "deltalake", "numpy"]

# Airflow reads its config on first import and writes airflow.cfg into AIRFLOW_HOME: keep both in
# the repo's gitignored .airflow (unless the caller sourced infra/airflow/airflow_env.sh already).
os.environ.setdefault("AIRFLOW_HOME", str(REPO_ROOT / ".airflow"))
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ.setdefault("AIRFLOW__CORE__DAGS_FOLDER", str(DAGS))


@pytest.fixture(scope="module")
def dagbag() -> Iterator[Any]:
    from airflow.dag_processing.dagbag import DagBag

    with pytest.MonkeyPatch.context() as mp:
        # Retries are read at parse time; make sure the production defaults are what we check.
        mp.delenv(orchestration.RETRIES_ENV, raising=False)
        mp.delenv(orchestration.RETRY_DELAY_ENV, raising=False)
        mp.delenv(orchestration.LANDING_POKE_ENV, raising=False)
        mp.delenv(orchestration.DAG_START_ENV, raising=False)
        yield DagBag(dag_folder=str(DAGS))


@pytest.fixture(scope="module")
def dag(dagbag: Any) -> Any:
    assert "gem_daily" in dagbag.dags, f"gem_daily not found; parsed {sorted(dagbag.dags)}"
    return dagbag.dags["gem_daily"]


def _utc(*args: int) -> dt.datetime:
    import pendulum

    return pendulum.datetime(*args, tz="UTC")


def _core_timetable(dag: Any) -> Any:
    """The scheduler-side timetable the SDK one serializes to (it holds the scheduling logic)."""
    from airflow.serialization.encoders import coerce_to_core_timetable

    return coerce_to_core_timetable(dag.timetable)


def test_no_import_errors(dagbag: Any) -> None:
    assert dagbag.import_errors == {}


def _job_tasks(dag: Any) -> list[Any]:
    return [t for t in dag.tasks if t.task_id != SENSOR]


def test_tasks_in_order(dag: Any) -> None:
    assert sorted(dag.task_ids) == sorted(UPSTREAM)
    assert {t: dag.get_task(t).upstream_task_ids for t in UPSTREAM} == UPSTREAM


def test_the_dag_is_the_registry(dag: Any) -> None:
    """The DAG is built from gem.lakehouse.stages; the graph above is written out by hand, so a wrong registry
    fails one of the two comparisons."""
    from gem.pipeline.airflow.daily_dag import task_upstream

    assert set(stages.REGISTRY) | {SENSOR} == set(dag.task_ids) == set(UPSTREAM)
    assert task_upstream() == UPSTREAM
    for stage in stages.STAGES:
        task = dag.get_task(stage.name)
        assert task.python_callable is orchestration.run_stage_task
        assert task.op_kwargs == {"stage_name": stage.name, "run_day": "{{ partition_ds(data_interval_start) }}",
                                  "from_stage": "{{ (dag_run.conf or {}).get('from_stage', '') }}"}
        assert task.pool == (stage.pool or "default_pool")
        assert {a.name for a in task.outlets} == {w.table for w in stage.writes}
        assert task.depends_on_past is stage.carries_state


def test_assets_and_depends_on_past(dag: Any) -> None:
    """Each task's outlets are the Assets of the tables it writes; only day-over-day state waits
    for the previous run."""
    assert {t.task_id: {a.name for a in t.outlets} for t in dag.tasks if t.outlets} == DAG_OUTLETS
    for task in dag.tasks:
        assert all(a.uri == f"x-gem-lakehouse://{a.name.replace('.', '/')}" for a in task.outlets)
    assert {t.task_id for t in dag.tasks if t.depends_on_past} == DEPENDS_ON_PAST


def test_landing_sensor_reschedules(dag: Any) -> None:
    """The stages reading landing files wait for the day's `_SUCCESS` in a sensor that frees its
    worker slot between pokes and runs even when generate_events is skipped (source: landing)."""
    sensor = dag.get_task(SENSOR)
    assert sensor.mode == "reschedule"
    assert sensor.trigger_rule == "none_failed"
    assert sensor.python_callable is orchestration.landing_ready
    assert sensor.op_kwargs == {"ds": "{{ partition_ds(data_interval_start) }}"}
    assert sensor.poke_interval == orchestration.DEFAULT_LANDING_POKE_S


def test_failure_callback_on_every_task(dag: Any) -> None:
    for task in dag.tasks:
        assert task.on_failure_callback == [orchestration.record_task_failure], task.task_id


def test_dag_settings(dag: Any) -> None:
    assert set(dag.tags) == {"gem", "daily"}
    assert dag.catchup is False
    assert dag.max_active_runs == 1
    assert dag.user_defined_macros["partition_ds"] is partition_ds


def test_pretraining_queues_in_the_gpu_pool(dag: Any) -> None:
    assert {t.task_id: t.pool for t in dag.tasks} == {t: POOLS.get(t, "default_pool") for t in UPSTREAM}
    init_db = (REPO_ROOT / "infra" / "airflow" / "init_db.sh").read_text()
    assert f"pools set {stages.GPU_POOL} {orchestration.GPU_POOL_SLOTS} " in init_db


def test_every_task_retries(dag: Any) -> None:
    for task in _job_tasks(dag):
        assert task.retries >= 1, task.task_id
        assert task.retry_delay.total_seconds() > 0, task.task_id


def test_tasks_run_their_stage_for_the_run_day(dag: Any) -> None:
    """Each job task runs its own registry stage for the run's day (a ready_on stage works out the
    day it processes itself, as its job's --ready-on does); only stages that may have nothing ready
    skip."""
    for task in _job_tasks(dag):
        assert task.op_kwargs["stage_name"] == task.task_id
        stage = stages.stage(task.task_id)
        assert orchestration.may_skip(stage) is (task.task_id in SKIPPABLE), task.task_id
        if task.task_id in READY_ON:
            assert stage.ready_on and f"{stage.module} {stage.extra_args}".strip() == READY_ON[task.task_id]
        else:
            assert not stage.ready_on and stage.module == task.task_id


def test_a_stage_with_nothing_ready_skips_its_task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The task callable itself, on a fresh lakehouse: mix has no closed example day on the first
    day, so its task is skipped (as its job's exit 99 skipped the command's)."""
    from airflow.sdk.exceptions import AirflowSkipException

    config = tmp_path / "config.yaml"
    config.write_text(json.dumps({"lakehouse_uri": str(tmp_path / "lakehouse")}))  # JSON is valid YAML
    monkeypatch.setenv("GEM_CONFIG", str(config))
    with pytest.raises(AirflowSkipException, match="mix: nothing ready on run day 2026-01-01"):
        orchestration.run_stage_task("mix", "2026-01-01")


def test_timetable_is_daily_data_interval(dag: Any) -> None:
    from airflow.timetables.interval import CronDataIntervalTimetable

    tt = _core_timetable(dag)
    assert isinstance(tt, CronDataIntervalTimetable), type(tt)
    assert tt.serialize() == {"expression": "0 0 * * *", "timezone": "UTC"}


def test_scheduled_run_processes_its_interval_start(dag: Any) -> None:
    """The scheduled run after [D-1, D) covers [D, D+1), starts at D+1 and processes ds=D."""
    from airflow.timetables.base import DataInterval, TimeRestriction

    tt = _core_timetable(dag)
    info = tt.next_dagrun_info(
        last_automated_data_interval=DataInterval(_utc(2025, 12, 31), _utc(2026, 1, 1)),
        restriction=TimeRestriction(earliest=dag.start_date, latest=None, catchup=True),
    )
    assert (info.data_interval.start, info.data_interval.end) == (_utc(2026, 1, 1), _utc(2026, 1, 2))
    assert info.run_after == _utc(2026, 1, 2)
    assert partition_ds(info.data_interval.start) == "2026-01-01"


def test_first_scheduled_run_is_start_ds(dag: Any) -> None:
    from airflow.timetables.base import TimeRestriction

    from gem.config import GemConfig

    tt = _core_timetable(dag)
    info = tt.next_dagrun_info(
        last_automated_data_interval=None,
        restriction=TimeRestriction(earliest=dag.start_date, latest=None, catchup=True),
    )
    assert partition_ds(info.data_interval.start) == orchestration.START_DS == GemConfig().start_ds


@pytest.mark.parametrize("ds", ["2026-01-01", "2026-01-02", "2026-03-01", "2026-12-31"])
def test_manual_run_logical_date_maps_to_ds(dag: Any, ds: str) -> None:
    """`airflow dags test gem_daily X` infers the interval from X: the last complete day before it."""
    import pendulum

    tt = _core_timetable(dag)
    interval = tt.infer_manual_data_interval(run_after=pendulum.parse(manual_logical_date(ds), tz="UTC"))
    assert partition_ds(interval.start) == ds
    assert interval.end - interval.start == dt.timedelta(days=1)


def test_rendered_run_day_uses_partition_ds(dag: Any) -> None:
    from types import SimpleNamespace

    task = dag.get_task("ingest_events")
    context = {"data_interval_start": _utc(2026, 1, 1), "ds": "2026-01-02"}  # ds (logical date) must be ignored
    for conf, from_stage in ((None, ""), ({}, ""), ({"from_stage": "build_features"}, "build_features")):
        rendered = task.render_template(task.op_kwargs, context | {"dag_run": SimpleNamespace(conf=conf)},
                                        jinja_env=dag.get_template_env())
        assert rendered == {"stage_name": "ingest_events", "run_day": "2026-01-01", "from_stage": from_stage}


def test_a_run_from_a_stage_skips_the_stages_before_it_without_running_them(monkeypatch) -> None:
    """A stage before the run's from_stage returns at once (its job is never called); an unknown stage
    name fails the task instead of silently rerunning everything."""
    import gem.pipeline.bulk

    def must_not_run(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the stage ran")

    monkeypatch.setattr(gem.pipeline.bulk, "run_stage", must_not_run)
    assert "not rerun (this run starts at build_features)" in orchestration.run_stage_task(
        "ingest_events", "2026-01-01", from_stage="build_features")
    assert orchestration.before_start("validate_silver", "build_features") is False
    assert orchestration.before_start("ingest_events", "") is False
    with pytest.raises(ValueError, match="not a stage"):
        orchestration.run_stage_task("ingest_events", "2026-01-01", from_stage="build_featrues")


def test_partition_ds_is_utc_date() -> None:
    cet = dt.timezone(dt.timedelta(hours=1))
    assert partition_ds(dt.datetime(2026, 1, 2, 0, 30, tzinfo=cet)) == "2026-01-01"
    assert partition_ds(dt.datetime(2026, 1, 1, tzinfo=dt.UTC)) == "2026-01-01"
    with pytest.raises(ValueError):
        partition_ds(dt.datetime(2026, 1, 1))
    with pytest.raises(ValueError):
        partition_ds(None)


def test_dag_parse_is_fast(dagbag: Any) -> None:
    (stat,) = [s for s in dagbag.dagbag_stats if s.file.endswith("gem_daily.py")]
    # The DAG file alone, with airflow already imported: far below the limit.
    assert stat.duration.total_seconds() < 2.0, stat


def test_dag_file_import_is_light(tmp_path: Path) -> None:
    """A fresh interpreter importing the DAG file loads no heavy library, and does so quickly."""
    probe = (
        "import importlib.util, json, sys, time\n"
        "t = time.perf_counter()\n"
        f"spec = importlib.util.spec_from_file_location('gem_daily_probe', {str(DAG_FILE)!r})\n"
        "mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)\n"
        "took = time.perf_counter() - t\n"
        f"print(json.dumps({{'took': took, 'heavy': [m for m in {HEAVY!r} if m in sys.modules]}}))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "GEM_"))}
    env |= {"AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__LOAD_EXAMPLES": "False", "PYTHONPATH": str(REPO_ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", probe], env=env, cwd=REPO_ROOT, check=False, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["heavy"] == [], f"DAG parse imports heavy modules: {result['heavy']}"
    # Almost all of it is importing airflow.sdk itself; the limit leaves room for a busy machine.
    assert result["took"] < 15.0, result


def test_ruff_airflow_rules() -> None:
    ruff = ruff_path()
    out = subprocess.run(
        [ruff, "check", "--no-cache", "--select", "AIR", str(DAGS)],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_manual_run_never_takes_a_scheduled_or_backfill_runs_logical_date(dag: Any) -> None:
    """A DAG holds one run per logical date, and a backfill clears and reruns a run already at its
    date: the manual run of ds (gem run, make demo) must not sit on the next day's midnight."""
    import pendulum
    from airflow.timetables.base import DataInterval, TimeRestriction

    assert orchestration.manual_logical_date("2026-12-31") == "2027-01-01T00:00:01+00:00"
    tt = _core_timetable(dag)
    for ds in ("2026-01-01", "2026-02-28", "2026-12-31"):
        manual = pendulum.parse(manual_logical_date(ds), tz="UTC")
        day = pendulum.parse(ds, tz="UTC")
        # The run the scheduler (and `airflow backfill create`) makes for the next day.
        scheduled = tt.next_dagrun_info(
            last_automated_data_interval=DataInterval(day, day.add(days=1)),
            restriction=TimeRestriction(earliest=dag.start_date, latest=None, catchup=True))
        assert partition_ds(scheduled.data_interval.start) == day.add(days=1).to_date_string()
        assert scheduled.logical_date == scheduled.data_interval.start  # a midnight
        assert manual != scheduled.logical_date and manual.time() != dt.time(0)


def test_the_upkeep_dag_runs_weekly_one_task_on_the_day_its_interval_closes(dagbag: Any) -> None:
    """gem_upkeep: one task, Sundays 06:00 UTC; its day is the date its week closes, so the
    retention counts back from the run's own interval, never from now()."""
    from airflow.timetables.base import TimeRestriction

    dag = dagbag.dags["gem_upkeep"]
    assert [t.task_id for t in dag.tasks] == ["upkeep"] and dag.max_active_runs == 1
    info = _core_timetable(dag).next_dagrun_info(
        last_automated_data_interval=None, restriction=TimeRestriction(earliest=dag.start_date, latest=None, catchup=True))
    assert info.data_interval.start == _utc(2026, 1, 4, 6) and info.data_interval.end == _utc(2026, 1, 11, 6)
    assert dag.tasks[0].op_kwargs["ds"] == "{{ partition_ds(data_interval_end) }}"

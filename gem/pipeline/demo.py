"""`make demo`: run the daily DAG through Airflow for the demo days, then say where everything is.

The first `demo.bulk_days` days load through the bulk path (gem.pipeline.bulk: every stage in one process
and Spark session, as a history is loaded before daily runs take over). Each later demo day D runs
as `airflow dags test gem_daily <D+1 00:00:01>` (a manual run covers the last full day before its
logical date, so it processes ds=D; see gem/pipeline/airflow/orchestration.py) against Airflow's metadata DB
(SQLite in .airflow/ unless AIRFLOW__DATABASE__SQL_ALCHEMY_CONN names another), with $GEM_CONFIG
pointing the jobs at the demo config. Both happen in one child process
(gem.pipeline.demo_process), so the Airflow days' Spark stages run on the bulk days' warm JVM. It prints one
line per stage or task as it finishes (day, task, state, seconds); Spark's log goes to
.airflow/runs/demo-<first>..<last>.spark.log and each Airflow run's to .airflow/runs/gem_daily-<D>.log,
whose paths it prints first. What Airflow recorded (each task's state and times) comes from its REST
API (gem.pipeline.airflow.api): the configured server, else one started once for the demo, in the
background while the bulk days run. At the end it prints the seconds per stage, reads the tables back through
the Delta log with the `deltalake` package (no Spark) and prints their locations, row counts per day,
the held-out metrics and the reports' paths (`report`).

`make cluster-demo` (gem.pipeline.cluster_demo) runs the same days with `run_days` and prints the same
summary with `report`, on the local cluster topology.
"""

from __future__ import annotations

import datetime as dt
import queue
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

import typer

from gem import storage
from gem.config import REPO_ROOT, GemConfig, load_config
from gem.data.delta_log import logged_files, read_table, table_version
from gem.days import day_range, shift_day
from gem.environment import RETRIES_ENV, RETRY_DELAY_ENV
from gem.lakehouse.tables import table_exists
from gem.pipeline.airflow.api import TaskRun, airflow_api
from gem.pipeline.airflow.runs import POLL_S, TaskReporter, airflow_env, airflow_home, init_db, run_log
from gem.pipeline.bulk import StageRun
from gem.pipeline.cli import job_app, run_command
from gem.pipeline.demo_process import DAY_DONE, DAY_START, STAGE_RUN, parse_stage_run
from gem.pipeline.services import stop_group
from gem.quality.runner import docs_site_uri
from gem.report.run_report import student_results, write
from gem.sources.bayes_floor import reported_floor
from gem.train.evaluate import metrics_table
from schemas import TABLES
from schemas.metrics import GOLD_METRICS

DEFAULT_CONFIG = REPO_ROOT / "configs" / "demo.yaml"


def demo_days(cfg: GemConfig) -> tuple[list[str], list[str]]:
    """The demo's days, split: (those the bulk path loads, those that run through Airflow)."""
    days = day_range(cfg.start_ds, shift_day(cfg.start_ds, cfg.demo.days - 1))
    return days[: cfg.demo.bulk_days], days[cfg.demo.bulk_days:]


@dataclass
class DemoRun:
    """What `run_days` ran: seconds per part (the bulk path, each Airflow run), each stage's run on
    the bulk path, and the task instances of each Airflow run (by the day it processed)."""

    parts: list[tuple[str, float]] = field(default_factory=list)
    bulk_runs: list[StageRun] = field(default_factory=list)
    airflow_tasks: dict[str, list[TaskRun]] = field(default_factory=dict)


# How long the child's process group has to exit after SIGTERM, when the parent stops early.
STOP_TIMEOUT_S = 20.0


def run_days(cfg_path: Path, cfg: GemConfig) -> DemoRun:
    """Run the demo days in order in one process (gem.pipeline.demo_process): the first demo.bulk_days through
    the bulk path, the others through Airflow's `dags test`, so every Spark stage after the first runs
    on one warm JVM. One line per stage or task as it finishes (the tasks read through Airflow's API,
    its server started here in the background when none is configured); Spark's log and each Airflow
    run's log go to files whose paths are printed. Exits on a failure.

    The child runs in its own process group (with its JVM and anything it starts); when this
    function ends early (a failure, an interrupt, an exception), the group is stopped before it returns."""

    env = airflow_env(cfg, cfg_path)
    env.setdefault(RETRIES_ENV, "1")
    env.setdefault(RETRY_DELAY_ENV, "10")  # a demo fails fast instead of waiting 5 minutes
    init_db(env)
    bulk, daily = demo_days(cfg)
    days = bulk + daily
    spark_log = airflow_home(env) / "runs" / f"demo-{days[0]}..{days[-1]}.spark.log"
    spark_log.parent.mkdir(parents=True, exist_ok=True)
    args = ([f"--bulk-start {bulk[0]} --bulk-end {bulk[-1]}"] if bulk else []) + [f"--airflow-day {ds}" for ds in daily]
    print(f"demo days {days[0]}..{days[-1]} in one process and one Spark session (bulk path: "
          f"{bulk[0] + '..' + bulk[-1] if bulk else 'none'}; through Airflow: {', '.join(daily) or 'none'}); "
          f"Spark's log: {spark_log}", flush=True)
    command = (f". infra/airflow/airflow_env.sh && exec {sys.executable} -m gem.pipeline.demo_process "
               f"--config {cfg_path.resolve()} {' '.join(args)}")
    lines: queue.Queue[str | None] = queue.Queue()
    ran = DemoRun()
    api_log = spark_log.with_name(f"demo-{days[0]}..{days[-1]}.api-server.log")
    with airflow_api(env, api_log) as api, open(spark_log, "w") as err:
        proc = subprocess.Popen(["bash", "-c", command], cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=err, text=True, start_new_session=True)
        try:
            def pump() -> None:
                assert proc.stdout is not None
                for line in proc.stdout:
                    lines.put(line.rstrip("\n"))
                lines.put(None)

            threading.Thread(target=pump, daemon=True).start()
            t0, reporter, part = time.time(), None, f"bulk path ds={bulk[0]}..{bulk[-1]}" if bulk else None
            while True:
                try:
                    line = lines.get(timeout=POLL_S)
                except queue.Empty:
                    line = ""
                if reporter is not None:
                    reporter.report()
                if line is None:
                    break
                word, *rest = line.split(maxsplit=1) or [""]
                if word == STAGE_RUN:
                    run = parse_stage_run(rest[0])
                    ran.bulk_runs.append(run)
                    print(run.line(), flush=True)
                elif word == DAY_START:
                    if part is not None:
                        ran.parts.append((part, time.time() - t0))
                    ds, since = rest[0].split()
                    print(f"gem_daily ds={ds}: Airflow's log: {run_log(env, ds)}", flush=True)
                    t0, part = time.time(), f"gem_daily run of ds={ds}"
                    reporter = TaskReporter(api, ds, dt.datetime.fromisoformat(since),
                                            lambda task: print(task, flush=True))
                elif word == DAY_DONE:
                    ds, outcome = rest[0].split()
                    if reporter is not None:
                        reporter.report(wait=True)
                        ran.airflow_tasks[ds] = reporter.tasks
                    reporter = None
                    if outcome != "ok":
                        raise SystemExit(f"demo failed: the gem_daily run of ds={ds} failed; see {run_log(env, ds)}")
                    ran.parts.append((part or ds, time.time() - t0))
                    part = None
                elif line:
                    print(line, flush=True)
            if proc.wait() != 0:
                raise SystemExit(f"demo failed (exit {proc.returncode}); see {spark_log}")
        finally:
            stop_group(proc, STOP_TIMEOUT_S)
    if part is not None:
        ran.parts.append((part, time.time() - t0))
    return ran


def task_seconds(airflow_tasks: Mapping[str, Sequence[TaskRun]], days: list[str],
                 bulk_runs: Sequence[StageRun] = ()) -> str:
    """Seconds and state of every stage: of its runs on the bulk path (`bulk_runs`, one column, a
    stage's runs summed), and of every task of the demo's Airflow runs (`airflow_tasks`: the task
    instances of the run of each day, as Airflow's API gave them).

    One row per task (in the order the tasks first started in Airflow, then stages only the bulk path
    ran), one column for the bulk path and one per Airflow run (the ds it processed).
    """

    rows = [(day, t.task_id, t.state, t.start, t.seconds) for day, tasks in airflow_tasks.items() for t in tasks]
    cells: dict[str, dict[str, str]] = {}
    first_start: dict[str, str] = {}
    totals = dict.fromkeys(days, 0.0)
    for day, task, state, start, seconds in rows:
        started = start.isoformat() if start else "~"  # never started: last
        first_start[task] = min(first_start.get(task) or "~", started)
        if day not in totals:
            continue
        totals[day] += seconds
        cells.setdefault(task, {})[day] = f"{seconds:.0f}s" if state == "success" else f"{seconds:.0f}s {state}"
    order = sorted(cells, key=lambda t: first_start[t])
    columns = list(days)
    if bulk_runs:
        column = f"bulk {bulk_runs[0].run_day}..{max(r.through or r.run_day for r in bulk_runs)}"
        columns.insert(0, column)
        totals[column] = sum(r.seconds for r in bulk_runs)
        for stage in dict.fromkeys(r.stage for r in bulk_runs):
            runs = [r for r in bulk_runs if r.stage == stage]
            seconds = sum(r.seconds for r in runs)
            ran = any(r.state == "success" for r in runs)
            cells.setdefault(stage, {})[column] = f"{seconds:.0f}s" if ran else f"{seconds:.0f}s skipped"
            if stage not in order:
                order.append(stage)
    widths = {c: max(18, len(c) + 2) for c in columns}
    header = "  " + f"{'task':<20}" + "".join(f"{c:>{widths[c]}}" for c in columns)
    lines = [header] + ["  " + f"{t:<20}" + "".join(f"{cells[t].get(c, '-'):>{widths[c]}}" for c in columns)
                        for t in order]
    lines.append("  " + f"{'all tasks':<20}" + "".join(f"{totals[c]:>{widths[c] - 1}.0f}s" for c in columns))
    return "\n".join(lines)


def summarize(cfg: GemConfig) -> str:
    """Row counts per ds of each table, from the Delta log alone (the way non-Spark readers list files).

    The counts come from the log's per-file statistics (`num_records`, partition values), so no data
    file is read.
    """

    lines = []
    for name, schema in TABLES.items():
        path = schema.path(cfg.lakehouse_uri)
        if not table_exists(path):
            lines.append(f"  {name:<28} {path}  (not written)")
            continue
        version = table_version(path)
        rows_by_ds: dict[str, int] = {}
        for f in logged_files(path, version):
            rows_by_ds[f.partition["ds"]] = rows_by_ds.get(f.partition["ds"], 0) + f.rows
        per_day = ", ".join(f"{ds}: {n:,}" for ds, n in sorted(rows_by_ds.items()))
        lines.append(f"  {name:<28} {path}  (version {version}; rows by ds: {per_day})")
    return "\n".join(lines)


def model_metrics(cfg: GemConfig) -> str | None:
    """The latest pretraining run's held-out NE / AUC / calibration per task, from gold.metrics
    (None when no run has written any)."""

    path = GOLD_METRICS.path(cfg.lakehouse_uri)
    if not table_exists(path):
        return None
    rows = [r for r in read_table(path).to_pylist() if r["arch"] == cfg.model.arch]
    if not rows:
        return None
    latest = max(rows, key=lambda r: r["created_at"])
    run = sorted((r for r in rows if r["run_id"] == latest["run_id"]), key=lambda r: r["task"])
    runs = len({r["run_id"] for r in rows})
    held_out = shift_day(latest["ds"].isoformat(), -cfg.attribution_window_days)  # the mix's held-out day
    title = (f"  run {latest['run_id']}: {latest['arch']}, {latest['train_steps']} steps, held-out day {held_out} "
             f"of the mixture of {latest['ds']} ({runs} runs in gold.metrics); floor: the NE of the generator's "
             f"true probabilities on that day (gem.sources.bayes_floor)")
    floor = reported_floor(cfg.landing_root, held_out, [r["task"] for r in run])
    return title + "\n" + metrics_table({r["task"]: r for r in run}, indent="    ", floor=floor,
                                         min_positives=cfg.report.min_positives)


def student_metrics(cfg: GemConfig) -> str | None:
    """The latest distillation run's students beside the no-FM baseline students and the FM's logged
    predictions of the same held-out examples, per task, from gold.metrics (None when no distill run
    has written any)."""

    found = student_results(cfg)
    if found is None:
        return None
    run_id, arch, rows = found

    def fmt(v: float | None) -> str:
        return "    n/a" if v is None else f"{v:7.4f}"

    width = max((len(r["task"]) for r in rows), default=len("task"))
    signals = "predictions and history codes" if cfg.student.uses("history_codes") else "predictions"
    window = f"{cfg.student_train.days} day{'s' if cfg.student_train.days > 1 else ''}"
    header = (f"    {'task':<{width}} {'examples':>9} {'steps':>5} {'NE':>7} {'AUC':>7} {'base NE':>7} {'base AUC':>8} "
              f"{'FM NE':>7} {'FM AUC':>7}")
    lines = [f"  run {run_id}: {arch} per surface, trained on the FM's logged {signals}; base: the no-FM baseline",
             f"  student. Each day both train {cfg.student_train.length()} over their surface's examples of the FM-predicted days",
             f"  of the {window} before the held-out one, warm-started from the ones promoted before (on their first",
             "  day from scratch), and are scored on the same held-out examples as the FM's logged predictions",
             header]
    for r in rows:
        head = f"    {r['task']:<{width}} {r['examples']:>9,} {'n/a' if r['steps'] is None else r['steps']:>5}"
        if r["positives"] < cfg.report.min_positives:  # an NE over so few positives is noise
            lines.append(f"{head}  too few positives to read ({r['positives']:.0f} < {cfg.report.min_positives})")
        else:
            lines.append(f"{head} {fmt(r['NE'])} {fmt(r['AUC'])} {fmt(r['baseline NE'])} {fmt(r['baseline AUC']):>8} "
                         f"{fmt(r['FM NE'])} {fmt(r['FM AUC'])}")
    return "\n".join(lines)


def reports(cfg: GemConfig, ds: str) -> str:
    """Where the reports are: the run report of ds (written now, `gem report --ds ds`) and the Data Docs."""

    return "\n".join([f"  {'run report of ' + ds:<28} {write(cfg, ds)}",
                      f"  {'data-quality report':<28} {storage.join(docs_site_uri(cfg), 'index.html')}"])


def report(cfg_path: Path, cfg: GemConfig, ran: DemoRun, started: float) -> int:
    """The demo's closing printout, after `run_days` returned `ran` (it started at `started`, a
    time.time()): the seconds per part and per stage, the tables, the held-out metrics, the reports.
    -> the demo's exit status: 1 when pretraining wrote no held-out metrics."""
    print("\n== GEM demo done ==")
    for what, seconds in ran.parts:
        print(f"  {what}: {seconds:.0f}s")
    print(f"  total wall time: {time.time() - started:.0f}s")
    bulk, daily = demo_days(cfg)
    print("== seconds per stage: its runs on the bulk path (a ranged stage runs once for all its days), and per task "
          "of each Airflow run (by the day it processed; from Airflow's metadata DB) ==")
    print(task_seconds(ran.airflow_tasks, daily, ran.bulk_runs))
    print("== tables ==")
    print(f"  {'landing files':<28} {cfg.landing_root}")
    print(summarize(cfg))
    print("== pretraining: held-out metrics per task (gold.metrics) ==")
    metrics = model_metrics(cfg)
    print(metrics or f"  none: no pretraining run wrote {GOLD_METRICS.path(cfg.lakehouse_uri)}")
    print("== students: held-out metrics per task beside the FM's logged predictions (gold.metrics) ==")
    last = (bulk + daily)[-1]
    students = student_metrics(cfg)
    print(students or "  none: the distill stage needs precompute on two consecutive days")
    print("== reports ==")
    print(reports(cfg, last))
    if students is not None:
        print(f"  {'transfer report (not run)':<28} python -m gem.distill.transfer --ds {last} --config {cfg_path}"
              "  (a student per surface, arm and seed: longer than the demo)")
    if metrics is None:
        print(f"demo failed: the pipeline ran {cfg.demo.days} day(s) but pretraining wrote no held-out metrics "
              "(a mixture needs a training day before its held-out day); see the pretrain task's log above",
              file=sys.stderr)
        return 1
    return 0


ConfigFile = Annotated[Path, typer.Option("--config", help="the demo's YAML config", exists=True, dir_okay=False)]


def command_line(config: ConfigFile = DEFAULT_CONFIG) -> int:
    """Run the demo days (the bulk path, then Airflow), then print the summary."""
    cfg = load_config(config)
    started = time.time()
    return report(config, cfg, run_days(config, cfg), started)


def main(argv: Sequence[str] | None = None) -> int:
    app = job_app("python -m gem.pipeline.demo")
    app.command(help=__doc__.split("\n\n")[0])(command_line)
    return run_command(app, argv)


if __name__ == "__main__":
    sys.exit(main())

"""`make demo`: run the daily DAG through Airflow for the demo days, then say where everything is.

The first `demo.bulk_days` days load through the bulk path (gem.bulk: every stage in one process
and Spark session, as a history is loaded before daily runs take over). For each later demo day D
it runs `airflow dags test gem_daily <D+1 00:00:01>` (a manual run covers the last full
day before its logical date, so it processes ds=D; see gem/orchestration.py) against a SQLite
metadata DB in .airflow/, with $GEM_CONFIG pointing the jobs at the demo config. It prints one line
per task as it finishes (day, task, state, seconds); Airflow's and the jobs' (Spark's) output goes to
.airflow/runs/gem_daily-<D>.log, whose path it prints first. At the end it
reads the tables back through the Delta log with the `deltalake` package (no Spark) and prints
their locations, row counts per day and the data-quality report's path.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from pathlib import Path
from typing import Any

from gem.airflow_runs import airflow_env, airflow_home, init_db, run_day, run_log
from gem.config import REPO_ROOT, GemConfig, load_config
from gem.days import day_range, shift_day
from schemas.metrics import GOLD_METRICS

DEFAULT_CONFIG = REPO_ROOT / "configs" / "demo.yaml"


def load_bulk_days(cfg_path: Path, days: list[str], env: dict[str, str]) -> float:
    """The first demo days through the bulk path (`python -m gem.bulk`), one line per stage as it
    finishes; its Spark output goes to a log file whose path is printed. -> seconds; exits on failure."""
    import subprocess

    log = airflow_home(env) / "runs" / f"bulk-{days[0]}..{days[-1]}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    print(f"bulk path ds={days[0]}..{days[-1]} (every stage in one process and Spark session): its Spark log: {log}",
          flush=True)
    t0 = time.time()
    cmd = [sys.executable, "-m", "gem.bulk", "--start", days[0], "--end", days[-1], "--config", str(cfg_path.resolve())]
    with open(log, "w") as err:
        proc = subprocess.Popen(cmd, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=err, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            print(line.rstrip(), flush=True)
    if proc.wait() != 0:
        raise SystemExit(f"demo failed: the bulk path for ds={days[0]}..{days[-1]} failed; see {log}")
    return time.time() - t0


def demo_days(cfg: GemConfig) -> tuple[list[str], list[str]]:
    """The demo's days, split: (those the bulk path loads, those that run through Airflow)."""
    days = day_range(cfg.demo.start_ds, shift_day(cfg.demo.start_ds, cfg.demo.days - 1))
    return days[: cfg.demo.bulk_days], days[cfg.demo.bulk_days:]


def run_days(cfg_path: Path, cfg: GemConfig) -> list[tuple[str, float]]:
    """Run the demo days in order: the first demo.bulk_days through the bulk path, the others
    through Airflow; one line per task as it finishes, each run's Airflow (and Spark) log in a file
    whose path is printed. -> (what ran, seconds) per run; exits on a failed run."""
    env = airflow_env(cfg, cfg_path)
    env.setdefault("GEM_TASK_RETRIES", "1")
    env.setdefault("GEM_TASK_RETRY_DELAY_S", "10")  # a demo fails fast instead of waiting 5 minutes
    init_db(env)
    timings = []
    bulk, daily = demo_days(cfg)
    if bulk:
        timings.append((f"bulk path ds={bulk[0]}..{bulk[-1]}", load_bulk_days(cfg_path, bulk, env)))
    for ds in daily:
        log = run_log(env, ds)
        print(f"gem_daily ds={ds}: Airflow's and Spark's log: {log}", flush=True)
        t0 = time.time()
        if not run_day(ds, env, log, on_task=lambda line: print(line, flush=True)):
            raise SystemExit(f"demo failed: the gem_daily run of ds={ds} failed; see {log}")
        timings.append((f"gem_daily run of ds={ds}", time.time() - t0))
    return timings


def task_seconds(airflow_home: Path, days: list[str]) -> str:
    """Seconds and state of every task of the demo's runs, read from Airflow's metadata DB.

    One row per task (in the order the tasks first started), one column per run (the ds it processed).
    """
    import sqlite3

    db = airflow_home / "airflow.db"
    if not db.is_file():
        return f"  (no Airflow metadata DB at {db})"
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT substr(r.data_interval_start, 1, 10), t.task_id, t.state, t.start_date, t.end_date "
            "FROM task_instance t JOIN dag_run r ON r.dag_id = t.dag_id AND r.run_id = t.run_id "
            "WHERE t.dag_id = 'gem_daily'"
        ).fetchall()
    cells: dict[str, dict[str, str]] = {}
    first_start: dict[str, str] = {}
    totals = dict.fromkeys(days, 0.0)
    for day, task, state, start, end in rows:
        first_start[task] = min(first_start.get(task) or "~", start or "~")  # never started: last
        if day not in totals:
            continue
        seconds = (dt.datetime.fromisoformat(end) - dt.datetime.fromisoformat(start)).total_seconds() if start and end else 0.0
        totals[day] += seconds
        cells.setdefault(task, {})[day] = f"{seconds:.0f}s" if state == "success" else f"{seconds:.0f}s {state}"
    order = sorted(cells, key=lambda t: first_start[t])
    header = "  " + f"{'task':<20}" + "".join(f"{d:>18}" for d in days)
    lines = [header] + ["  " + f"{t:<20}" + "".join(f"{cells[t].get(d, '-'):>18}" for d in days) for t in order]
    lines.append("  " + f"{'all tasks':<20}" + "".join(f"{totals[d]:>17.0f}s" for d in days))
    return "\n".join(lines)


def summarize(cfg: GemConfig) -> str:
    """Row counts per ds of each table, from the Delta log alone (the way non-Spark readers list files).

    The counts come from the log's per-file statistics (`num_records`, partition values), so no data
    file is read.
    """
    from gem.data.delta_log import logged_files, table_version
    from schemas import TABLES

    lines = []
    for name, schema in TABLES.items():
        path = schema.path(cfg.lakehouse_uri)
        if not Path(path, "_delta_log").is_dir():
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
    from gem.data.delta_log import read_table
    from gem.days import shift_day
    from gem.sources.bayes_floor import reported_floor
    from gem.train.evaluate import metrics_table

    path = GOLD_METRICS.path(cfg.lakehouse_uri)
    if not Path(path, "_delta_log").is_dir():
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
    floor = reported_floor(cfg.landing_root, held_out)
    return title + "\n" + metrics_table({r["task"]: r for r in run}, indent="    ", floor=floor)


def student_metrics(cfg: GemConfig) -> str | None:
    """The latest distillation run's students beside the FM's logged predictions of the same held-out
    examples, per task, from gold.metrics (None when no distill run has written any)."""
    from gem.data.delta_log import read_table
    from gem.distill.run import FM_ARCH, student_arch

    path = GOLD_METRICS.path(cfg.lakehouse_uri)
    if not Path(path, "_delta_log").is_dir():
        return None
    arch = student_arch(cfg.student.variant)
    rows = [r for r in read_table(path).to_pylist() if r["arch"] in (arch, FM_ARCH)]
    if not rows:
        return None
    run_id = max(rows, key=lambda r: r["created_at"])["run_id"]
    by_task: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r["run_id"] == run_id and r["ne"] is not None:
            by_task.setdefault(r["task"], {})[r["arch"]] = r
    def fmt(v: float | None) -> str:
        return "    n/a" if v is None else f"{v:7.4f}"

    lines = [f"  run {run_id}: {arch} per surface, trained on the FM's logged predictions"
             + (" and history codes" if cfg.student.uses("history_codes") else ""),
             f"    {'task':<28} {'examples':>9} {'NE':>7} {'AUC':>7} {'FM NE':>7} {'FM AUC':>7}"]
    for task, pair in sorted(by_task.items()):
        student, fm = pair.get(arch, {}), pair.get(FM_ARCH, {})
        lines.append(f"    {task:<28} {student.get('examples', 0):>9,} {fmt(student.get('ne'))} "
                     f"{fmt(student.get('auc'))} {fmt(fm.get('ne'))} {fmt(fm.get('auc'))}")
    return "\n".join(lines)


def reports(cfg: GemConfig, ds: str) -> str:
    """Where the reports are: the run report of ds (written now, `gem report --ds ds`) and the Data Docs."""
    from gem.quality.runner import docs_site_dir
    from gem.run_report import write

    return "\n".join([f"  {'run report of ' + ds:<28} {write(cfg, ds)}",
                      f"  {'data-quality report':<28} {docs_site_dir(cfg) / 'index.html'}"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(DEFAULT_CONFIG))
    args = parser.parse_args(argv)
    cfg_path = Path(args.config)
    cfg = load_config(cfg_path)
    t0 = time.time()
    timings = run_days(cfg_path, cfg)
    print("\n== GEM demo done ==")
    for what, seconds in timings:
        print(f"  {what}: {seconds:.0f}s")
    print(f"  total wall time: {time.time() - t0:.0f}s")
    print("== seconds per task of each Airflow run (by the day it processed; from Airflow's metadata DB) ==")
    print(task_seconds(airflow_home(), demo_days(cfg)[1]))
    print("== tables ==")
    print(f"  {'landing files':<28} {cfg.landing_root}")
    print(summarize(cfg))
    print("== pretraining: held-out metrics per task (gold.metrics) ==")
    metrics = model_metrics(cfg)
    print(metrics or f"  none: no pretraining run wrote {GOLD_METRICS.path(cfg.lakehouse_uri)}")
    print("== students: held-out metrics per task beside the FM's logged predictions (gold.metrics) ==")
    bulk, daily = demo_days(cfg)
    last = (bulk + daily)[-1]
    students = student_metrics(cfg)
    print(students or "  none: the distill stage needs precompute on two consecutive days")
    print("== reports ==")
    print(reports(cfg, last))
    if students is not None:
        print(f"  {'transfer ratio (minutes)':<28} python -m gem.distill.transfer --ds {last} --config {cfg_path}")
    if metrics is None:
        print(f"demo failed: the pipeline ran {cfg.demo.days} day(s) but pretraining wrote no held-out metrics "
              "(a mixture needs a training day before its held-out day); see the pretrain task's log above",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())

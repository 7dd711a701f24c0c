"""A backfill through Airflow against the same days run daily: wall time side by side, tables compared.

    python -m bench.backfill [--days 7] [--events-per-day 4000] [--users 400] [--ads 80]

Two lakehouses and Airflow homes under one temporary folder, one small synthetic world:
  daily      one `airflow dags test` run per day, in order (`gem run`: every task in one process
             per day, sharing a warm Spark session);
  backfill   `gem backfill --start D1 --end Dn`: Airflow's own backfill, one day at a time, run by the
             API server, DAG processor and LocalExecutor scheduler the command starts (each task in
             its own process with its own Spark session).
Prints both wall times, their ratio and, per table, whether the rows agree (run ids, times, Delta
versions and file locations aside: gem.lakehouse.compare's NOT_COMPARED) and publishes the figures
through bench.results (backfill). The world is gem.sources.small_world's. Day 2 on trains (one training
day), so pretraining, precompute and distillation are compared too. tests/e2e/test_backfill.py runs
the same for 3 days.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer

from bench.results import RESULTS_DIR, Figure, ResultsDirOption, record
from gem.command_line import job_app, run_command
from gem.config import REPO_ROOT, load_config
from gem.days import day_range, shift_day
from gem.lakehouse.compare import NOT_COMPARED, lakehouse_rows
from gem.pipeline.airflow.runs import init_db, run_day, run_log
from gem.sources.small_world import START_DS, world_config
from schemas import TABLES


def free_port() -> int:
    """A TCP port free on this machine now (for an Airflow server of our own, never another's)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def airflow_env(home: Path, cfg_path: Path) -> dict[str, str]:
    """A clean Airflow environment on home (nothing from the caller's Airflow or GEM_ settings; task
    retries off; this interpreter's `airflow` first on PATH) with free ports for the API server and
    the workers' log server."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "GEM_"))}
    return env | {"AIRFLOW_HOME": str(home), "GEM_CONFIG": str(cfg_path), "GEM_TASK_RETRIES": "0",
                  "GEM_DAG_START_DS": START_DS, "PATH": f"{Path(sys.executable).parent}:{env.get('PATH', '')}",
                  "GEM_AIRFLOW_PORT": str(free_port()), "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port())}


def daily_runs(env: dict[str, str], days: list[str]) -> None:
    """One `airflow dags test` run per day, in order; raises on the first failed run."""
    init_db(env)
    for ds in days:
        if not run_day(ds, env, run_log(env, ds), on_task=lambda line: None):
            raise RuntimeError(f"the daily run of {ds} failed; see {run_log(env, ds)}")


def gem_backfill(env: dict[str, str], start: str, end: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """`gem backfill --start --end [extra]` in a child process (its output captured)."""
    return subprocess.run([sys.executable, "-m", "gem", "backfill", "--start", start, "--end", end, *extra],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=6 * 3600, check=False)


def differing_tables(cfg_a: Path, cfg_b: Path) -> tuple[list[str], int]:
    """(tables whose rows differ between the two lakehouses, tables compared that hold rows)."""
    a, b = load_config(str(cfg_a)), load_config(str(cfg_b))
    differ, filled = [], 0
    for name in TABLES:
        rows_a, rows_b = lakehouse_rows(a, name, NOT_COMPARED), lakehouse_rows(b, name, NOT_COMPARED)
        differ += [name] if rows_a != rows_b else []
        filled += bool(rows_a or rows_b)
    return differ, filled


def command_line(
    day_count: Annotated[int, typer.Option("--days")] = 7,
    events_per_day: Annotated[int, typer.Option()] = 4000,
    users: Annotated[int, typer.Option()] = 400,
    ads: Annotated[int, typer.Option()] = 80,
    results_dir: ResultsDirOption = RESULTS_DIR,
) -> int:
    root = Path(tempfile.mkdtemp(prefix="gem-bench-backfill-"))
    days = day_range(START_DS, shift_day(START_DS, day_count - 1))
    configs = {arm: world_config(root / arm, events_per_day, users, ads) for arm in ("daily", "backfill")}
    seconds = {}
    started = time.monotonic()
    daily_runs(airflow_env(root / "daily" / "airflow_home", configs["daily"]), days)
    seconds["daily"] = time.monotonic() - started
    started = time.monotonic()
    done = gem_backfill(airflow_env(root / "backfill" / "airflow_home", configs["backfill"]), days[0], days[-1])
    seconds["backfill"] = time.monotonic() - started
    if done.returncode != 0:
        print(done.stdout[-4000:], done.stderr[-4000:], sep="\n")
        raise SystemExit(f"gem backfill failed (exit {done.returncode}); files under {root}")
    differ, filled = differing_tables(configs["daily"], configs["backfill"])
    print(f"{day_count} days of {events_per_day:,} impressions ({users} users, {ads} ads) under {root}")
    print(f"  daily runs (airflow dags test, one per day): {seconds['daily']:.0f}s ({seconds['daily'] / day_count:.0f}s a day)")
    print(f"  gem backfill (Airflow's backfill, scheduler + LocalExecutor): {seconds['backfill']:.0f}s "
          f"({seconds['backfill'] / day_count:.0f}s a day) = {seconds['backfill'] / seconds['daily']:.2f}x the daily runs")
    print(f"  tables: {filled} hold rows; " + (f"DIFFERENT: {', '.join(differ)}" if differ else "every one equal"))
    record("backfill", "gem backfill (Airflow's backfill) against the same days run daily, side by side", [
        Figure("days", "days run by each arm", day_count),
        Figure("daily_s", "daily runs (airflow dags test, one per day), wall time", round(seconds["daily"]), "s"),
        Figure("backfill_s", "gem backfill (scheduler + LocalExecutor), wall time", round(seconds["backfill"]), "s"),
        Figure("daily_s_per_day", "daily runs, wall time per day", round(seconds["daily"] / day_count), "s"),
        Figure("backfill_s_per_day", "gem backfill, wall time per day", round(seconds["backfill"] / day_count), "s"),
        Figure("backfill_over_daily", "gem backfill / daily runs, wall time",
               round(seconds["backfill"] / seconds["daily"], 2), "x"),
        Figure("tables_with_rows", "tables holding rows", filled),
        Figure("tables_differing", "tables whose rows differ between the arms", len(differ)),
    ], notes=f"{events_per_day:,} impressions a day, {users} users, {ads} ads."
             + (f" Tables that differ: {', '.join(differ)}." if differ else ""), results_dir=results_dir)
    return 1 if differ else 0




def main(argv: list[str] | None = None) -> int:
    app = job_app("python -m bench.backfill")
    app.command(help=__doc__.splitlines()[0])(command_line)
    return run_command(app, argv)


if __name__ == "__main__":
    sys.exit(main())

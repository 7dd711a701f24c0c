"""The demo's days in one process, so the Airflow day's Spark stages start on the bulk days' warm JVM.

    python -m gem.pipeline.demo_process --config FILE [--bulk-start A --bulk-end B] [--airflow-day D ...]

gem.pipeline.demo runs this with infra/airflow/airflow_env.sh sourced. The bulk days go through
gem.pipeline.bulk.run_range (one line per stage on stdout); each Airflow day is Airflow's own `airflow dags
test` (airflow.__main__.main, what the `airflow` command runs), called in this process. `dags test`
runs its tasks in the process that calls it, so their Spark sessions are the bulk days' session:
the JVM is started and its JIT warmed once, and the Airflow day's Spark stages run faster than in
a fresh `airflow dags test` process.

What the parent (gem.pipeline.demo) reads on stdout: one line `STAGE_RUN <json>` per stage of the bulk
path as it finishes (a gem.pipeline.bulk.StageRun), the stages' own output, then per Airflow day one line
`AIRFLOW_DAY <ds> <UTC time before its run was made>` and one line `AIRFLOW_DONE <ds> <ok|failed>`;
between them the day's own output (Airflow's, its tasks') goes to its run log
(gem.pipeline.airflow.runs.run_log), and the parent prints each task as it finishes, read through
Airflow's API (the day's run is the newest of ds made after that time).
Spark's log stays in this process's stderr: the JVM keeps the stderr it was started with.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import sys
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Annotated, TextIO

import typer

from gem.config import load_config
from gem.pipeline.airflow.orchestration import DAG_ID, manual_logical_date
from gem.pipeline.airflow.runs import now, run_log
from gem.pipeline.bulk import StageRun, run_range
from gem.pipeline.cli import DAY, day_value, job_app, run_command

DAY_START = "AIRFLOW_DAY"
DAY_DONE = "AIRFLOW_DONE"
STAGE_RUN = "STAGE_RUN"


def stage_run_line(run: StageRun) -> str:
    """The line that hands one bulk stage's run to the parent (`parse_stage_run` reads it back)."""
    return f"{STAGE_RUN} {json.dumps(dataclasses.asdict(run))}"


def parse_stage_run(text: str) -> StageRun:
    """A StageRun from the JSON after STAGE_RUN on a `stage_run_line`."""
    return StageRun(**json.loads(text))


@contextlib.contextmanager
def output_to(log: Path) -> Iterator[None]:
    """This process's stdout and stderr (file descriptors 1 and 2, so Airflow's handlers and any child
    process follow) go to `log` inside the block, and back afterwards."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as out:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            for fd in saved:
                os.close(fd)


def airflow_dags_test(ds: str) -> bool:
    """`airflow dags test gem_daily <manual date of ds>` in this process; True when the run succeeded."""
    # Airflow reads and writes its config on import; gem.pipeline.demo imports this module for DAY_START
    # and DAY_DONE alone, in a process that runs no Airflow.
    from airflow.__main__ import main as airflow_main  # noqa: PLC0415

    argv = sys.argv
    sys.argv = ["airflow", "dags", "test", DAG_ID, manual_logical_date(ds)]
    try:
        airflow_main()
    except SystemExit as exit_:  # `dags test` exits with "DagRun failed" when the run failed
        return exit_.code in (0, None)
    finally:
        sys.argv = argv
    return True


def run_airflow_day(ds: str, parent: TextIO) -> bool:
    """One Airflow day, framed for the parent by the DAY_START and DAY_DONE lines on `parent`."""
    print(f"{DAY_START} {ds} {now().isoformat()}", file=parent, flush=True)
    with output_to(run_log(os.environ, ds)):
        try:
            ok = airflow_dags_test(ds)
        except Exception:  # noqa: BLE001 - the traceback goes to the run log; the parent says where
            traceback.print_exc()
            ok = False
    print(f"{DAY_DONE} {ds} {'ok' if ok else 'failed'}", file=parent, flush=True)
    return ok


def days_value(values: list[str] | None) -> list[str]:
    """typer callback: each day of a repeated day option, normalised (gem.pipeline.cli.day_value)."""
    return [day for day in map(day_value, values or []) if day is not None]


def command_line(
    config: Annotated[Path, typer.Option("--config", help="the demo's YAML config", exists=True, dir_okay=False)],
    bulk_start: Annotated[str | None, typer.Option(
        help="first day through the bulk path (with --bulk-end)", metavar=DAY, callback=day_value)] = None,
    bulk_end: Annotated[str | None, typer.Option(
        help="last day through the bulk path (with --bulk-start)", metavar=DAY, callback=day_value)] = None,
    airflow_day: Annotated[list[str] | None, typer.Option(
        help="a day through `airflow dags test`, after the bulk days (repeat for several, in order)",
        metavar=DAY, callback=days_value)] = None,
) -> int:
    """Run the bulk days, then each Airflow day, in this process (one Spark session for all)."""
    if (bulk_start is None) != (bulk_end is None):
        raise typer.BadParameter("--bulk-start and --bulk-end go together", param_hint="--bulk-end")
    if bulk_start is not None and bulk_end is not None:
        for run in run_range(load_config(config), bulk_start, bulk_end):
            print(stage_run_line(run), flush=True)
    try:
        for ds in airflow_day or []:
            if not run_airflow_day(ds, sys.stdout):
                return 1
    finally:
        # Airflow's logging writes to stdout; py4j's goodbye at exit would land among the parent's lines.
        logging.getLogger("py4j").setLevel(logging.WARNING)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    app = job_app("python -m gem.pipeline.demo_process")
    app.command(help=__doc__.split("\n\n")[0])(command_line)
    return run_command(app, argv)


if __name__ == "__main__":
    sys.exit(main())

"""The bulk path: the registry's stages for a range of days in one process and one Spark session.

    python -m gem.pipeline.bulk --start A --end B [--through-stage S] [--config F]     (also `gem bulk`)

A run per day pays a process and a cold JVM per run (and, under an executor, per Spark task); on a
few cores that fixed cost (starting the JVM, importing Great Expectations, the first, cold query) is
much of a small day's time.
The bulk path calls each stage's own entry point (`Stage.entry` in jobs.<module>, through
`run_stage`, which the DAG's tasks call too) against one `StageContext`, so it writes the same
partitions and publishes the same completion records as the daily runs, through the same
`StageCommit` checks; only the process and the Spark session are shared. A stage declared with
`ranges` (the Spark stages from ingest to the examples' validation) runs ONCE for the whole range,
`entry(ctx, first, through=last)`: one Spark pass and one commit per table whatever the number of
days, one record per day. Consecutive ranged stages run stage by stage (each over every day before
the next starts); the other stages run day by day, in registry order, as the DAG would: e.g. the
generator for every day, then ingest..validate_examples once each, then mix, pretrain, precompute,
distill day after day (pretraining carries its model from day to day). Use it to load a history (a first backfill, an import) before the daily DAG takes over; runs
through Airflow (`gem run`, `airflow dags test`) stay the way to process one day.

A stage with nothing ready (a mixture before any training day, a `--ready-on` day before the first
window closes, the generator under `source: landing`) is reported as skipped, as the DAG's task would
be. The first failure stops the run; the stages after it have not run, and `gem status` lists them.
"""

from __future__ import annotations

import importlib
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import groupby
from typing import Annotated

import typer

from gem import storage
from gem.command_line import ConfigOption, day_option, job_app, run_command
from gem.config import GemConfig, load_config
from gem.days import day_range
from gem.lakehouse import backfill_hold
from gem.lakehouse.commit import StageContext, StageResult
from gem.lakehouse.stages import STAGES, Stage
from gem.quality.gate import GateError


@dataclass(frozen=True)
class StageRun:
    """One stage's run of one run day: `ds` is the day it processed (None: nothing ready)."""

    run_day: str
    stage: str
    ds: str | None
    state: str  # "success" | "skipped"
    seconds: float
    summary: str = ""  # the stage's own summary line (StageResult.summary) when it published a record
    through: str | None = None  # a ranged run's last run day (and `ds` its first processed day)

    def line(self) -> str:
        """As the DAG runs print theirs: day, task, state, seconds."""
        days = self.run_day if self.through is None else f"{self.run_day}..{self.through}"
        return f"  {days}  {self.stage:<20} {self.state:<14} {self.seconds:>8.0f}s"


def entry_point(stage: Stage) -> Callable[[StageContext, str], StageResult]:
    """The stage's `entry(ctx, ds)` in jobs.<module>: what its command line runs."""
    module = importlib.import_module(f"jobs.{stage.module}")
    return getattr(module, stage.entry)


def stages_through(last: str | None) -> tuple[Stage, ...]:
    """The registry's stages in order, up to and including `last` (all when None)."""
    names = [s.name for s in STAGES]
    if last is None:
        return STAGES
    if last not in names:
        raise ValueError(f"no stage {last!r} in the registry; stages: {', '.join(names)}")
    return STAGES[: names.index(last) + 1]


def checked_days(cfg: GemConfig, start: str, end: str) -> list[str]:
    """The run days start..end; ValueError for an empty range or one before the pipeline's start_ds."""
    days = day_range(start, end)
    if not days:
        raise ValueError(f"empty range: --start {start} is after --end {end}")
    if start < cfg.start_ds:
        raise ValueError(f"--start {start} is before the pipeline's start_ds={cfg.start_ds}")
    return days


def run_stage(ctx: StageContext, stage: Stage, run_day: str,
              entry: Callable[[StageContext, str], StageResult] | None = None) -> StageRun:
    """One stage's run of `run_day` through its own entry point (the day it processes: `stage.ds`);
    "skipped" when nothing was ready. The DAG's tasks (gem.pipeline.airflow.orchestration.run_stage_task) and the bulk
    path both run stages this way."""
    return run_stage_over(ctx, stage, [run_day], entry)


def run_stage_over(ctx: StageContext, stage: Stage, run_days: list[str],
                   entry: Callable[..., StageResult] | None = None) -> StageRun:
    """One run of a stage for the consecutive run days `run_days`: the days it processes (`stage.ds`
    of each run day that has one) in one call, `entry(ctx, first, through=last)` for several (stages
    declared with `ranges`), `entry(ctx, ds)` for one; "skipped" when nothing was ready."""
    started = time.monotonic()
    storage.require_reachable(ctx.cfg.lakehouse_uri, ctx.cfg.landing_root)  # an unusable store fails here, named
    days = [d for d in (stage.ds(ctx.cfg, r) for r in run_days) if d is not None]
    # Held by a running backfill: refused before the entry opens Spark (StageCommit.begin checks too).
    for ds in days:
        backfill_hold.require_not_held(ctx.cfg, stage.name, ds, stage.needed(ctx.cfg, ds))
    run = entry or entry_point(stage)
    through = {"through": days[-1]} if len(days) > 1 else {}
    result = run(ctx, days[0], **through) if days else None
    # A source publishes no record (its _SUCCESS marker is its completion) but details of
    # what it wrote; a stage with nothing ready returns neither.
    ran = result is not None and (result.published or bool(result.details))
    summary = result.summary() if result is not None and result.published else ""
    return StageRun(run_days[0], stage.name, days[0] if days else None, "success" if ran else "skipped",
                    time.monotonic() - started, summary, through=run_days[-1] if len(run_days) > 1 else None)


def run_range(cfg: GemConfig, start: str, end: str, through_stage: str | None = None,
              ctx: StageContext | None = None, day_by_day: bool = False) -> Iterator[StageRun]:
    """Run the stages (up to `through_stage`) for run days start..end; yields each stage's run as it
    finishes. Consecutive stages declared with `ranges` run once each over the range (unless
    `day_by_day`: every stage once per day, the daily runs' order); the others day by day. The Spark
    session opens on the first Spark stage and stays open."""
    days = checked_days(cfg, start, end)
    ctx = ctx or StageContext(cfg)
    plan = [(stage, entry_point(stage)) for stage in stages_through(through_stage)]
    for ranged, group in groupby(plan, key=lambda step: step[0].ranges and not day_by_day):
        steps = list(group)
        if ranged:
            for stage, entry in steps:
                yield run_stage_over(ctx, stage, days, entry)
            continue
        for run_day in days:
            for stage, entry in steps:
                yield run_stage(ctx, stage, run_day, entry)


def command_line(
    start: Annotated[str, day_option("--start", "first run day, YYYY-MM-DD")],
    end: Annotated[str, day_option("--end", "last run day, YYYY-MM-DD")],
    through_stage: Annotated[str | None, typer.Option(help="the last stage to run each day (default: all)")] = None,
    config: ConfigOption = None,
) -> int:
    cfg = load_config(config)
    started = time.monotonic()
    try:
        stages_through(through_stage)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--through-stage") from None
    try:
        checked_days(cfg, start, end)
    except ValueError as e:
        raise typer.BadParameter(str(e), param_hint="--start") from None
    try:
        for run in run_range(cfg, start, end, through_stage):
            print(run.line(), flush=True)
    except GateError as failed:  # a critical gate: the days' records up to it stay; the rerun redoes the range
        failed.rerun = " ".join(["gem bulk --start", start, "--end", end,
                                 *(["--through-stage", through_stage] if through_stage else []),
                                 *(["--config", str(config)] if config is not None else [])])
        print(f"bulk {start}..{end} FAILED after {time.monotonic() - started:.0f}s: {failed}", file=sys.stderr)
        return 1
    print(f"bulk {start}..{end}: done in {time.monotonic() - started:.0f}s")
    return 0


def main(argv: list[str] | None = None) -> int:
    app = job_app("python -m gem.pipeline.bulk")
    app.command(help=__doc__.splitlines()[0])(command_line)
    return run_command(app, argv)


if __name__ == "__main__":
    sys.exit(main())

"""Synthetic multi-surface ad events for one day, written as landing files by arrival day.

A thin entry point over gem.sources (the world, its simulation, the dirty rows and the landing
output are modules of their own there): `generate_day` simulates day D and writes
`{landing_root}/ds=X/events-from-D.json.gz` for each arrival day X in D..D+7.

Usage:
    python -m jobs.generate_events --ds 2026-01-01 [--users N --events M --seed S --config FILE]
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from typing import Annotated

import typer

from gem.config import GemConfig, load_config
from gem.lakehouse.commit import StageContext, StageResult
from gem.pipeline.airflow.orchestration import NOTHING_READY_EXIT
from gem.pipeline.cli import StageCall, run_command, stage_command
from gem.sources.synthetic_day import generate_day


def config_with_overrides(call: StageCall, users: int | None, events: int | None, seed: int | None) -> GemConfig:
    """The command line's config with its generator overrides (--users, --events, --seed) on top."""
    flags = {"users": users, "events_per_day": events, "seed": seed}
    overrides = {k: v for k, v in flags.items() if v is not None}
    return load_config(call.config, overrides={"generator": overrides}) if overrides else call.cfg


def run(ctx: StageContext, ds: str) -> StageResult:
    """Generate day ds's landing files. A source: its completion is the landing partition's
    `_SUCCESS` marker (which ingest_events needs), not a record; details: the marker's manifest
    (none when the config's source is not `synthetic`)."""
    if ctx.cfg.source != "synthetic":  # the landing files come from elsewhere: nothing to generate
        return StageResult("generate_events", ds, 0.0)
    started = time.time()
    manifest = generate_day(ctx.cfg, ds)
    return StageResult("generate_events", ds, time.time() - started, details=manifest)


def command_line(
    call: StageCall,
    users: Annotated[int | None, typer.Option(help="override generator.users")] = None,
    events: Annotated[int | None, typer.Option(help="override generator.events_per_day (impressions)")] = None,
    seed: Annotated[int | None, typer.Option(help="override generator.seed")] = None,
) -> int:
    """Generate the landing files of --ds; print what was written, or exit 99 when the config's
    source is not `synthetic`."""
    cfg = config_with_overrides(call, users, events, seed)
    result = run(StageContext(cfg), call.ds)
    if not result.details:  # the task shows as skipped
        print(f"generate_events ds={call.ds}: source is {cfg.source!r}, not 'synthetic': nothing to generate")
        return NOTHING_READY_EXIT
    manifest, seconds = result.details, result.seconds
    by_type = manifest["events"]
    print(
        f"generate_events ds={call.ds}: {manifest['lines']} lines ({by_type['impression']} impressions, "
        f"{by_type['click']} clicks, {by_type['conversion']} conversions, {manifest['dirty']} dirty) "
        f"in {seconds:.1f}s = {manifest['lines'] / max(seconds, 1e-9):,.0f} events/s"
    )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return run_command(stage_command("generate_events", command_line), argv)


if __name__ == "__main__":
    sys.exit(main())

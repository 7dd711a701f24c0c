"""Synthetic multi-surface ad events for one day, written as landing files by arrival day.

A thin entry point over gem.sources (the world, its simulation, the dirty rows and the landing
output are modules of their own there): `generate_day` simulates day D and writes
`{landing_root}/ds=X/events-from-D.json.gz` for each arrival day X in D..D+7.

Usage:
    python -m jobs.generate_events --ds 2026-01-01 [--users N --events M --seed S --config FILE]
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
from collections.abc import Sequence

from gem.config import GemConfig, add_config_arg, load_config
from gem.lakehouse.commit import StageContext, StageResult
from gem.pipeline.airflow.orchestration import NOTHING_READY_EXIT
from gem.sources.synthetic_day import generate_day


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ds", required=True, help="day to generate, YYYY-MM-DD")
    parser.add_argument("--users", type=int, default=None, help="override generator.users")
    parser.add_argument("--events", type=int, default=None, help="override generator.events_per_day (impressions)")
    parser.add_argument("--seed", type=int, default=None, help="override generator.seed")
    add_config_arg(parser)
    args = parser.parse_args(argv)
    try:
        dt.date.fromisoformat(args.ds)
    except ValueError:
        parser.error(f"--ds must be YYYY-MM-DD, got {args.ds!r}")
    return args


def config_from_args(args: argparse.Namespace) -> GemConfig:
    """The config file/env config with the CLI's generator overrides on top."""
    flags = {"users": args.users, "events_per_day": args.events, "seed": args.seed}
    overrides = {k: v for k, v in flags.items() if v is not None}
    return load_config(args.config, overrides={"generator": overrides} if overrides else None)


def run(ctx: StageContext, ds: str) -> StageResult:
    """Generate day ds's landing files. A source: its completion is the landing partition's
    `_SUCCESS` marker (which ingest_events needs), not a record; details: the marker's manifest
    (none when the config's source is not `synthetic`)."""
    if ctx.cfg.source != "synthetic":  # the landing files come from elsewhere: nothing to generate
        return StageResult("generate_events", ds, 0.0)
    started = time.time()
    manifest = generate_day(ctx.cfg, ds)
    return StageResult("generate_events", ds, time.time() - started, details=manifest)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = config_from_args(args)
    result = run(StageContext(cfg), args.ds)
    if not result.details:  # the task shows as skipped
        print(f"generate_events ds={args.ds}: source is {cfg.source!r}, not 'synthetic': nothing to generate")
        return NOTHING_READY_EXIT
    manifest, seconds = result.details, result.seconds
    events = manifest["events"]
    print(
        f"generate_events ds={args.ds}: {manifest['lines']} lines ({events['impression']} impressions, "
        f"{events['click']} clicks, {events['conversion']} conversions, {manifest['dirty']} dirty) "
        f"in {seconds:.1f}s = {manifest['lines'] / max(seconds, 1e-9):,.0f} events/s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

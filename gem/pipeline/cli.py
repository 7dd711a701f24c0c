"""Shared command-line plumbing for jobs: `--ds YYYY-MM-DD` and `--config FILE`."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gem.config import add_config_arg
from gem.days import iso_day
from gem.lakehouse.stages import ready_on_day

__all__ = ["add_through_arg", "examples_parser", "job_exit", "job_parser", "parse_examples_args", "resolve_examples_day"]

if TYPE_CHECKING:
    from gem.config import GemConfig
    from gem.lakehouse.commit import StageResult


def job_parser(description: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--ds", required=True, type=iso_day, help="partition day, YYYY-MM-DD")
    add_config_arg(parser)
    return parser


def add_through_arg(parser: argparse.ArgumentParser) -> None:
    """`--through D2`: the job runs the days --ds..D2 in one commit, one record per day (stages
    declared with `ranges`, e.g. a first backfill of a history)."""
    parser.add_argument("--through", type=iso_day, default=None,
                        help="run the days --ds..--through in one commit (one record per day), e.g. a backfill")


def examples_parser(description: str | None) -> argparse.ArgumentParser:
    """`--ds D` (the impression day, `--through D2` for the days D..D2) or `--ready-on R` (the day
    whose attribution window closes on R). Parse with `parse_examples_args`."""
    parser = argparse.ArgumentParser(description=description)
    day = parser.add_mutually_exclusive_group(required=True)
    day.add_argument("--ds", type=iso_day, help="impression day, YYYY-MM-DD")
    day.add_argument(
        "--ready-on", type=iso_day, help="run day R: process ds = R - attribution_window_days (the DAG's form)"
    )
    add_through_arg(parser)
    add_config_arg(parser)
    return parser


def parse_examples_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """An `examples_parser`'s arguments; exits 2 when --through comes without --ds (--ready-on names one day)."""
    args = parser.parse_args(argv)
    if args.through is not None and args.ds is None:
        parser.error("--through goes with --ds (impression days); --ready-on names one day")
    return args


def resolve_examples_day(cfg: GemConfig, args: argparse.Namespace) -> str | None:
    """The impression day to process; None when --ready-on names a day no window has closed on yet."""
    return args.ds if args.ds is not None else ready_on_day(cfg, args.ready_on)


def job_exit(result: StageResult) -> int:
    """A stage job's exit status: NOTHING_READY_EXIT (the DAG task shows as skipped) when it
    published nothing, else 0 after printing its summary."""
    from gem.pipeline.airflow.orchestration import NOTHING_READY_EXIT

    if not result.published:
        return NOTHING_READY_EXIT
    print(result.summary())
    return 0

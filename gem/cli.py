"""Shared command-line plumbing for jobs: `--ds YYYY-MM-DD` and `--config FILE`."""

from __future__ import annotations

import argparse
import datetime as dt

from gem.config import add_config_arg


def iso_day(text: str) -> str:
    """argparse type: a calendar day written YYYY-MM-DD (returned normalised)."""
    try:
        return dt.date.fromisoformat(text).isoformat()
    except ValueError:
        raise argparse.ArgumentTypeError(f"--ds must be a day written YYYY-MM-DD, got {text!r}") from None


def job_parser(description: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--ds", required=True, type=iso_day, help="partition day, YYYY-MM-DD")
    add_config_arg(parser)
    return parser


def shift_day(ds: str, days: int) -> str:
    return (dt.date.fromisoformat(ds) + dt.timedelta(days=days)).isoformat()

"""Import a MovieLens ratings dataset (ml-1m or ml-100k) into the landing zone as ad events.

A thin entry point over gem.sources.movielens_format (the parsers) and gem.sources.movielens_events
(the conversion rules and the landing output).

    python -m jobs.import_movielens --path DIR [--config FILE] [--summary FILE]

It prints a few lines (ratings, days, events by type) and writes the full summary, with every day
it wrote, as JSON to a file it names: by default SUMMARY_FILE under the landing root, beside the
day partitions (no `ds=` folder, so no stage reads it as one).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from gem import storage
from gem.config import load_config
from gem.pipeline.cli import ConfigOption, job_app, run_command
from gem.sources.movielens_events import import_movielens
from gem.sources.movielens_format import MovieLensFormatError

SUMMARY_FILE = "_imports/movielens.json"  # under the landing root


def summary_lines(summary: dict[str, Any], where: str) -> list[str]:
    """What a person reads after an import: the ratings, the days, the events by type, where the rest is."""
    days = summary["days"]
    span = f"{days[0]}..{days[-1]}" if days else "none"
    events = ", ".join(f"{kind} {n:,}" for kind, n in summary["events_by_type"].items())
    return [f"MovieLens {summary['format']}: {summary['ratings']:,} ratings -> {len(days):,} landing days ({span})",
            f"events by type: {events}",
            f"full summary (every day written): {where}"]


def command_line(
    path: Annotated[Path, typer.Option(
        "--path", help="folder with ratings.dat, movies.dat, users.dat (ml-1m) or u.data, u.item, u.user")],
    config: ConfigOption = None,
    summary_file: Annotated[str | None, typer.Option(
        "--summary", help=f"where the full summary goes as JSON (default: <landing root>/{SUMMARY_FILE})")] = None,
) -> int:
    """Import a MovieLens ml-1m or ml-100k folder into the landing zone as ad events; print a short
    summary and write the full one to a file it names, or print a one-line error and exit 1."""
    cfg = load_config(config)
    try:
        summary = import_movielens(cfg, str(path), progress=True)
    except MovieLensFormatError as e:
        print(f"import_movielens: {e}", file=sys.stderr)
        return 1
    where = summary_file or storage.join(cfg.landing_root, SUMMARY_FILE)
    storage.makedirs(storage.parent(where))
    storage.write_json(where, summary)
    print("\n".join(summary_lines(summary, where)))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    app = job_app("python -m jobs.import_movielens")
    app.command()(command_line)
    return run_command(app, argv)


if __name__ == "__main__":
    sys.exit(main())

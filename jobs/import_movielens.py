"""Import a MovieLens ratings dataset (ml-1m or ml-100k) into the landing zone as ad events.

A thin entry point over gem.sources.movielens_format (the parsers) and gem.sources.movielens_events
(the conversion rules and the landing output).

    python -m jobs.import_movielens --path DIR [--config FILE]
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated

import typer

from gem.config import load_config
from gem.pipeline.cli import ConfigOption, job_app, run_command
from gem.sources.movielens_events import import_movielens
from gem.sources.movielens_format import MovieLensFormatError


def command_line(
    path: Annotated[Path, typer.Option(
        "--path", help="folder with ratings.dat, movies.dat, users.dat (ml-1m) or u.data, u.item, u.user")],
    config: ConfigOption = None,
) -> int:
    """Import a MovieLens ml-1m or ml-100k folder into the landing zone as ad events; print the
    summary as JSON, or a one-line error and exit status 1."""
    cfg = load_config(config)
    try:
        summary = import_movielens(cfg, str(path), progress=True)
    except MovieLensFormatError as e:
        print(f"import_movielens: {e}", file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=1))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    app = job_app("python -m jobs.import_movielens")
    app.command()(command_line)
    return run_command(app, argv)


if __name__ == "__main__":
    sys.exit(main())

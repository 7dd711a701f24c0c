"""Import a MovieLens ratings dataset (ml-1m or ml-100k) into the landing zone as ad events.

A thin entry point over gem.sources.movielens_format (the parsers) and gem.sources.movielens_events
(the conversion rules and the landing output).

    python -m jobs.import_movielens --path DIR [--config FILE]
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from gem.config import add_config_arg, load_config
from gem.sources.movielens_events import import_movielens
from gem.sources.movielens_format import MovieLensFormatError

# --------------------------------------------------------------------------------------------------
# CLI.


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m jobs.import_movielens",
        description="Import a MovieLens ml-1m or ml-100k folder into the landing zone as ad events.",
    )
    parser.add_argument(
        "--path", required=True, help="folder with ratings.dat, movies.dat, users.dat (ml-1m) or u.data, u.item, u.user"
    )
    add_config_arg(parser)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the import; print the summary as JSON, or a one-line error and exit status 1."""
    args = parse_args(argv)
    cfg = load_config(args.config)
    try:
        summary = import_movielens(cfg, args.path, progress=True)
    except MovieLensFormatError as e:
        print(f"import_movielens: {e}", file=sys.stderr)
        return 1
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""A long history through the bulk path: landing to validated training examples, days x events.

    python -m bench.bulk_history [--days 1000] [--ratings 560000] [--compare-days 8] [--seed 0] [--workdir DIR]

What a new user importing a real history pays (MovieLens-1M is 1M ratings over 1,038 days). The
bench writes a MovieLens-1M-format folder of synthetic ratings (6,040 users, 3,706 movies, every day
of the range rated; about 1.8 events per rating: an impression, a click for 4-5 stars, a conversion
for 5), imports it with `gem import-movielens`'s importer under configs/movielens.yaml, and times

  ranged      `gem.pipeline.bulk.run_range(..., through_stage="validate_examples")`: the generator skips
              (source: landing), then ingest .. validate_examples each run ONCE over the range;
and, side by side on the first `--compare-days` days (each arm in its own lakehouse, same session):
  day_by_day  the same stages once per day, in the daily runs' order (`day_by_day=True`);
  ranged      the same days ranged, whose wall time the ratio is taken against.

Prints each stage's seconds, the total, events per second, and the compare ratio, and publishes them
through bench.results (bulk_history). The goal of issue 17: 1,000 days with 1M events from landing
to training examples in at most 30 minutes on 2 cores. Never part of CI (wall time is a measurement,
not a gate).
"""

from __future__ import annotations

import calendar
import random
import tempfile
import time
from pathlib import Path
from typing import Annotated

import typer

from bench.results import RESULTS_DIR, Figure, ResultsDirOption, record
from gem.command_line import job_app, run_command
from gem.config import load_config
from gem.days import day_range, shift_day
from gem.lakehouse.commit import StageContext
from gem.lakehouse.spark import get_spark
from gem.pipeline.bulk import run_range
from gem.sources.movielens_events import import_movielens

USERS, MOVIES = 6040, 3706  # MovieLens-1M's
START_DS = "2000-04-25"  # MovieLens-1M's first rating day
GENRES = ("Action", "Adventure", "Animation", "Children's", "Comedy", "Crime", "Documentary", "Drama",
          "Fantasy", "Film-Noir", "Horror", "Musical", "Mystery", "Romance", "Sci-Fi", "Thriller", "War",
          "Western")
RATING_WEIGHTS = (0.06, 0.11, 0.26, 0.35, 0.22)  # 1..5 stars, about MovieLens-1M's shares


def write_movielens(folder: Path, days: int, ratings: int, seed: int) -> None:
    """ml-1m's three files: skewed user activity and movie popularity, one rating per (user, movie),
    each day of the range with at least one rating (then uniform over the days)."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)

    def movie(m: int) -> str:
        genres = "|".join(rng.sample(GENRES, rng.randint(1, 3)))
        return f"{m}::Movie {m} ({rng.randint(1930, 2000)})::{genres}\n"

    def user(u: int) -> str:
        return (f"{u}::{rng.choice('FM')}::{rng.choice((1, 18, 25, 35, 45, 50, 56))}::{rng.randint(0, 20)}::"
                f"{rng.randint(10000, 99999)}\n")

    with open(folder / "movies.dat", "w", encoding="latin-1") as f:
        f.writelines(movie(m) for m in range(1, MOVIES + 1))
    with open(folder / "users.dat", "w", encoding="latin-1") as f:
        f.writelines(user(u) for u in range(1, USERS + 1))
    user_weights = [1.0 / (u ** 0.8) for u in range(1, USERS + 1)]
    movie_weights = [1.0 / (m ** 0.9) for m in range(1, MOVIES + 1)]
    first = calendar.timegm(time.strptime(START_DS, "%Y-%m-%d"))
    seen: set[tuple[int, int]] = set()
    with open(folder / "ratings.dat", "w", encoding="latin-1") as f:
        n = 0
        while n < ratings:
            batch = min(100_000, ratings - n)
            users = rng.choices(range(1, USERS + 1), user_weights, k=batch)
            movies = rng.choices(range(1, MOVIES + 1), movie_weights, k=batch)
            stars = rng.choices(range(1, 6), RATING_WEIGHTS, k=batch)
            for u, m, r in zip(users, movies, stars, strict=True):
                if (u, m) in seen:
                    continue
                seen.add((u, m))
                day = n if n < days else rng.randrange(days)  # every day rated, then uniform
                f.write(f"{u}::{m}::{r}::{first + day * 86_400 + rng.randrange(86_400)}\n")
                n += 1


def _config(root: Path, arm: str):
    """configs/movielens.yaml with the arm's own lakehouse; every arm reads the one landing folder."""
    return load_config("configs/movielens.yaml", overrides={
        "lakehouse_uri": str(root / arm / "lakehouse"), "landing_uri": str(root / "landing"), "start_ds": START_DS})


def _run(cfg, first: str, last: str, ctx, day_by_day: bool = False) -> tuple[float, dict[str, float]]:
    """Wall seconds of the bulk path over first..last, and seconds per stage (summed over its runs)."""
    started, per_stage = time.monotonic(), {}
    for run in run_range(cfg, first, last, "validate_examples", ctx=ctx, day_by_day=day_by_day):
        per_stage[run.stage] = per_stage.get(run.stage, 0.0) + run.seconds
        if not day_by_day and run.state != "skipped":  # (the generator skips every day: source landing)
            print(run.line(), flush=True)
    return time.monotonic() - started, per_stage


def command_line(
    day_count: Annotated[int, typer.Option("--days")] = 1000,
    ratings: Annotated[int, typer.Option(help="about 1.8 events each")] = 560_000,
    compare_days: Annotated[int, typer.Option(help="days of the side-by-side arms (0: none)")] = 8,
    seed: Annotated[int, typer.Option()] = 0,
    workdir: Annotated[Path | None, typer.Option(
        help="an empty folder to write into and keep (the lakehouse, for inspection); default: a temporary "
             "folder, removed at the end")] = None,
    results_dir: ResultsDirOption = RESULTS_DIR,
) -> int:
    last = shift_day(START_DS, day_count - 1)
    if workdir is not None and workdir.exists() and any(workdir.iterdir()):
        raise typer.BadParameter(f"{workdir} is not empty", param_hint="--workdir")

    with tempfile.TemporaryDirectory(prefix="gem-bulk-history-") as tmp:
        root = workdir.resolve() if workdir is not None else Path(tmp)
        started = time.monotonic()
        write_movielens(root / "ml-1m", day_count, ratings, seed)
        cfg = _config(root, "full")
        summary = import_movielens(cfg, root / "ml-1m")
        events = sum(summary["events_by_type"].values())
        print(f"history: {len(summary['days'])} days {START_DS}..{last}, {summary['ratings']:,} ratings, "
              f"{events:,} events {summary['events_by_type']} (written and imported in "
              f"{time.monotonic() - started:.0f}s)", flush=True)
        spark = get_spark(cfg, app_name="bench-bulk-history")

        seconds: dict[str, float] = {}
        if compare_days:
            compare_last = shift_day(START_DS, compare_days - 1)
            for arm, day_by_day in (("day_by_day", True), ("ranged", False)):
                arm_cfg = _config(root, arm)
                seconds[arm], _ = _run(arm_cfg, START_DS, compare_last, StageContext(arm_cfg, spark), day_by_day)
            print(f"first {compare_days} days: day_by_day {seconds['day_by_day']:.0f}s, ranged "
                  f"{seconds['ranged']:.0f}s: ranged is {seconds['day_by_day'] / seconds['ranged']:.2f}x faster",
                  flush=True)

        wall, per_stage = _run(cfg, START_DS, last, StageContext(cfg, spark))
        print("seconds per stage: " + ", ".join(f"{s} {t:.0f}" for s, t in per_stage.items()))
        print(f"{len(day_range(START_DS, last))} days, {events:,} events, landing to validated examples: "
              f"{wall:.0f}s ({wall / 60:.1f} min, {events / wall:,.0f} events/s); goal: at most 30 min")
        spark.stop()
    days = len(day_range(START_DS, last))
    figures = [
        Figure("days", "days of history", days),
        Figure("events", "events imported", events),
        Figure("wall_s", "landing to validated training examples, ranged, wall time", round(wall), "s"),
        Figure("events_per_s", "landing to validated training examples", round(events / wall), "events/s"),
    ]
    if seconds:
        figures += [
            Figure("compare_day_by_day_s", f"first {compare_days} days, one day at a time",
                   round(seconds["day_by_day"]), "s"),
            Figure("compare_ranged_s", f"first {compare_days} days, ranged", round(seconds["ranged"]), "s"),
            Figure("ranged_speedup", f"first {compare_days} days: day by day / ranged, wall time",
                   round(seconds["day_by_day"] / seconds["ranged"], 2), "x"),
        ]
    record("bulk_history", "A long history through the bulk path: landing to validated training examples", figures,
           notes=f"synthetic MovieLens-1M-format history: {ratings:,} ratings over {days} days "
                 f"(seed {seed}).",
           extra={"seconds_per_stage": {stage: round(t, 1) for stage, t in per_stage.items()}},
           results_dir=results_dir)
    return 0




def main(argv: list[str] | None = None) -> int:
    app = job_app("python -m bench.bulk_history")
    app.command(help=__doc__.splitlines()[0])(command_line)
    return run_command(app, argv)


if __name__ == "__main__":
    raise SystemExit(main())

"""Where build_sequences' daily time goes: the history lookup, split, over a lakehouse that
bench.silver_incremental left behind (run that first).

    python -m bench.sequence_lookup [--root /tmp/gem-bench-silver] [--days 30]

Times (noop writes, so only the reading and the computing count) for day N:
  1. the narrow step: each active user's latest earlier (user_id, ds) key, over every history row;
  2. that plus the wide rows of those keys (gem.silver.sequences.latest_previous_rows, broadcast filter);
  3. decoding the wide columns of every history row (what the filter would have to avoid).
The times and the ratio of 3 to 2 are published through bench.results (sequence_lookup). Not a
test: nothing here gates CI.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from pyspark.sql import functions as F

from bench.results import RESULTS_DIR, Figure, ResultsDirOption, record
from bench.silver_incremental import START, bench_config
from gem.command_line import job_app, run_command
from gem.days import shift_day
from gem.lakehouse import tables
from gem.lakehouse.spark import get_spark
from gem.silver.sequences import latest_previous_rows
from schemas.events import BRONZE_AD_EVENTS
from schemas.sequences import SILVER_USER_SEQUENCES


def _noop(df: Any) -> float:
    t0 = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - t0


def command_line(
    root: Annotated[Path, typer.Option()] = Path("/tmp/gem-bench-silver"),
    days: Annotated[int, typer.Option()] = 30,
    master: Annotated[str, typer.Option()] = "local[2]",
    results_dir: ResultsDirOption = RESULTS_DIR,
) -> None:
    cfg = bench_config(root, master)
    spark = get_spark(cfg, app_name="bench-sequence-lookup")
    ds = shift_day(START, days - 1)
    day = F.lit(ds).cast("date")
    sequences = tables.read_table(spark, cfg, SILVER_USER_SEQUENCES)
    users = tables.read_table(spark, cfg, BRONZE_AD_EVENTS).where(F.col("ds") == day).select("user_id").distinct()
    history = sequences.where(F.col("ds") < day)
    latest_keys = (history.select("user_id", "ds").join(users, "user_id", "left_semi")
                   .groupBy("user_id").agg(F.max("ds").alias("ds")))
    history_rows, active_users = history.count(), users.count()
    print(f"day {ds}: {history_rows:,} history rows, {active_users:,} active users")
    keys_s = _noop(latest_keys)
    print(f"  latest keys (narrow):             {keys_s:6.1f}s")
    rows_s = _noop(latest_previous_rows(sequences, users, ds))
    print(f"  latest keys + their wide rows:    {rows_s:6.1f}s")
    every_s = _noop(history)
    print(f"  wide columns of every history row: {every_s:6.1f}s")
    record("sequence_lookup", "build_sequences' history lookup, split: narrow keys, their wide rows, every row", [
        Figure("latest_keys_s", "latest earlier key per active user (narrow)", round(keys_s, 1), "s"),
        Figure("latest_rows_s", "those keys and their wide rows (the job's lookup)", round(rows_s, 1), "s"),
        Figure("every_row_wide_s", "wide columns of every history row", round(every_s, 1), "s"),
        Figure("every_row_over_lookup", "every history row's wide columns / the job's lookup",
               round(every_s / rows_s, 2), "x"),
    ], notes=f"day {days} of the lakehouse bench.silver_incremental left in {root}: {history_rows:,} "
             f"history rows, {active_users:,} active users.", results_dir=results_dir)


def main(argv: list[str] | None = None) -> int:
    app = job_app("python -m bench.sequence_lookup")
    app.command(help=__doc__.splitlines()[0])(command_line)
    return run_command(app, argv)


if __name__ == "__main__":
    sys.exit(main())

"""Build one day of silver.user_sequences from bronze.ad_events: each active user's capped sequences.

`python -m jobs.build_sequences --ds YYYY-MM-DD [--config FILE]`

Layout (schemas/sequences.py): partition ds=D holds ONLY users with events in bronze ds=D, with
their full capped sequences as of the end of D. A user's snapshot for day D is their row with the
greatest ds <= D; users without events on D cost no work and keep their earlier row.

Flow (the transform is pure; I/O is the thin shell around it):
  gate: completion of validate_events for D, and of build_sequences for D-1 unless D == start_ds;
  bronze ds=D --> the users present on D --> each one's latest previous row (greatest ds < D);
  merge_sequences(previous, day events, caps): per type, old sequence + new events (dedup on
  event_id), sorted by (event_time, event_id), last `cap` kept;
  commit: withdraw the (build_sequences, D) record; replace silver ds=D; publish the record LAST.

A rerun reads only rows with ds < D, so it rewrites ds=D with identical contents.
"""

from __future__ import annotations

import json
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gem.cli import job_parser, shift_day
from gem.config import GemConfig, SequenceCaps, load_config
from schemas.events import BRONZE_AD_EVENTS
from schemas.sequences import SEQUENCE_COLUMNS, SEQUENCE_FIELDS, SILVER_USER_SEQUENCES

if TYPE_CHECKING:
    from pyspark.sql import Column as SparkColumn
    from pyspark.sql import DataFrame, SparkSession

STAGE = "build_sequences"
VALIDATE_STAGE = "validate_events"


@dataclass(frozen=True)
class BuildResult:
    ds: str
    users: int  # distinct users with events on ds = rows written
    table_version: int
    seconds: float


# --------------------------------------------------------------------------------------------------
# Pure transforms.


def _cap(caps: SequenceCaps, event_type: str) -> int:
    return int(getattr(caps, event_type))


def day_sequences(day_events: "DataFrame") -> "DataFrame":
    """bronze rows of one ds -> one row per user: (user_id, ds, new_impressions, new_clicks,
    new_conversions, day_last_event_time), the new_* arrays unsorted structs shaped as in
    schemas/sequences.py. A repeated event_id within the day counts once."""
    from pyspark.sql import functions as F

    events = day_events.dropDuplicates(["event_id"])
    new_arrays = [
        # collect_list skips nulls, so each list holds only its own event type.
        F.collect_list(
            F.when(F.col("event_type") == event_type, F.struct(*[F.col(f) for f in fields]))
        ).alias(f"new_{SEQUENCE_COLUMNS[event_type][0]}")
        for event_type, fields in SEQUENCE_FIELDS.items()
    ]
    return events.groupBy("user_id", "ds").agg(*new_arrays, F.max("event_time").alias("day_last_event_time"))


def _merged_sequence(
    old: "SparkColumn", new: "SparkColumn", cap: int, empty_type: str
) -> tuple["SparkColumn", "SparkColumn"]:
    """(old capped sequence or null, today's events) -> (new capped sequence, number of events added).

    Today's events whose event_id already sits in the old sequence are dropped (a replay must not
    count twice). Sorting the union by (event_time, event_id) puts late events in place, and the
    last `cap` of that order equal the last `cap` of the user's whole history, because the old
    sequence already holds that history's last `cap`.
    """
    from pyspark.sql import functions as F

    old = F.coalesce(old, F.array().cast(empty_type))
    fresh = F.filter(new, lambda x: ~F.exists(old, lambda o: o["event_id"] == x["event_id"]))
    merged = F.sort_array(F.concat(old, fresh))
    start = F.greatest(F.size(merged) - F.lit(cap) + F.lit(1), F.lit(1))
    return F.slice(merged, start, F.lit(cap)), F.size(fresh)


def merge_sequences(previous: "DataFrame", day_events: "DataFrame", caps: SequenceCaps) -> "DataFrame":
    """Each user with events in `day_events` -> their silver.user_sequences row as of the end of its ds.

    previous: silver.user_sequences rows, at most one per user (their latest before ds); users not in
        day_events are ignored.
    day_events: bronze.ad_events rows of one ds.
    Returns rows with SILVER_USER_SEQUENCES columns, one per distinct user_id of day_events.
    """
    from pyspark.sql import functions as F

    today = day_sequences(day_events)
    prior = previous.select(
        "user_id",
        *[F.col(seq).alias(f"old_{seq}") for seq, _ in SEQUENCE_COLUMNS.values()],
        *[F.col(n).alias(f"old_{n}") for _, n in SEQUENCE_COLUMNS.values()],
        F.col("last_event_time").alias("old_last_event_time"),
    )
    joined = today.join(prior, "user_id", "left")

    out: list["SparkColumn"] = [F.col("ds"), F.col("user_id")]
    counts: list["SparkColumn"] = []
    for event_type, (seq, n) in SEQUENCE_COLUMNS.items():
        empty_type = SILVER_USER_SEQUENCES.column(seq).sql_type
        capped, added = _merged_sequence(F.col(f"old_{seq}"), F.col(f"new_{seq}"), _cap(caps, event_type), empty_type)
        out.append(capped.alias(seq))
        counts.append((F.coalesce(F.col(f"old_{n}"), F.lit(0)) + added).cast("long").alias(n))
    # greatest() skips nulls: a user seen for the first time has no old_last_event_time.
    last = F.greatest(F.col("old_last_event_time"), F.col("day_last_event_time")).alias("last_event_time")
    return joined.select(*out, *counts, last).select(*SILVER_USER_SEQUENCES.column_names)


def latest_previous_rows(sequences: "DataFrame", users: "DataFrame", ds: str) -> "DataFrame":
    """silver rows, users (user_id) -> for each of those users, their row with the greatest ds < `ds`.

    The max(ds) per user is found from the two narrow columns (user_id, ds) only; the wide sequence
    columns are then read just for the matching (user_id, ds) pairs, not for every user's history.
    """
    from pyspark.sql import functions as F

    before = sequences.where(F.col("ds") < F.lit(ds).cast("date"))
    latest = (
        before.select("user_id", "ds")
        .join(users, "user_id", "left_semi")
        .groupBy("user_id")
        .agg(F.max("ds").alias("ds"))
    )
    # Broadcast the (user_id, ds) keys: the wide history rows are then filtered where they are
    # scanned instead of being shuffled to a sort-merge join (the shuffle of every earlier row's
    # arrays made the daily update grow with the days of history).
    return before.join(F.broadcast(latest), ["user_id", "ds"], "inner")


# --------------------------------------------------------------------------------------------------
# Thin I/O.


def require_inputs(spark: "SparkSession", cfg: GemConfig, ds: str) -> None:
    """Bronze for ds passed data quality; the previous day's sequences exist (unless ds starts the pipeline)."""
    from gem import lakehouse

    try:
        lakehouse.require_completed(spark, cfg, VALIDATE_STAGE, ds)
    except lakehouse.MissingInputError as e:
        raise lakehouse.MissingInputError(
            f"{STAGE} ds={ds} needs bronze ds={ds} to have passed data quality: {e}"
        ) from e
    if ds == cfg.start_ds:
        return
    prev = shift_day(ds, -1)
    try:
        lakehouse.require_completed(spark, cfg, STAGE, prev)
    except lakehouse.MissingInputError as e:
        raise lakehouse.MissingInputError(
            f"{STAGE} ds={ds} needs the previous day's sequences (ds={prev}; start_ds={cfg.start_ds}): {e}"
        ) from e


def _previous_rows(spark: "SparkSession", cfg: GemConfig, ds: str, users: "DataFrame") -> "DataFrame":
    from delta.tables import DeltaTable

    from gem import lakehouse

    path = lakehouse.table_path(cfg, SILVER_USER_SEQUENCES)
    # The first day starts fresh, whatever an earlier experiment left in the table.
    if ds == cfg.start_ds or not DeltaTable.isDeltaTable(spark, path):
        return spark.createDataFrame([], SILVER_USER_SEQUENCES.spark_schema())
    return latest_previous_rows(lakehouse.read_table(spark, cfg, SILVER_USER_SEQUENCES), users, ds)


def run(cfg: GemConfig, ds: str, spark: "SparkSession | None" = None) -> BuildResult:
    from pyspark.sql import functions as F

    from gem import lakehouse
    from gem.spark import get_spark

    t0 = time.time()
    spark = spark or get_spark(cfg, app_name=f"{STAGE}:{ds}")
    require_inputs(spark, cfg, ds)
    run_id = lakehouse.new_run_id(STAGE, ds)

    day_events = lakehouse.read_table(spark, cfg, BRONZE_AD_EVENTS).where(F.col("ds") == F.lit(ds).cast("date"))
    users = day_events.select("user_id").distinct()
    previous = _previous_rows(spark, cfg, ds, users)
    # A local checkpoint, not persist(): the plan reads this very table (ds < D), and a cached plan
    # over it would be recomputed when our own commit below invalidates it.
    rows = merge_sequences(previous, day_events, cfg.sequence_caps).localCheckpoint(eager=True)
    rows_written = rows.count()
    rows_in = users.count()

    lakehouse.clear_completion(spark, cfg, STAGE, ds)
    meta = json.dumps({"run_id": run_id, "stage": STAGE, "ds": ds})
    version = lakehouse.replace_partition(rows, cfg, SILVER_USER_SEQUENCES, {"ds": ds}, user_metadata=meta)
    lakehouse.publish_completion(
        spark, cfg, STAGE, ds, run_id, rows_in, rows_written, {}, {SILVER_USER_SEQUENCES.name: version}
    )
    return BuildResult(ds, rows_written, version, time.time() - t0)


def main(argv: list[str] | None = None) -> int:
    args = job_parser(__doc__.splitlines()[0]).parse_args(argv)
    cfg = load_config(args.config)
    result = run(cfg, args.ds)
    print(
        f"{STAGE} ds={result.ds}: users={result.users} version={result.table_version} in {result.seconds:.1f}s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

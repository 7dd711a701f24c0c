"""Repeated event ids: within a day, across the days of a range, and against bronze's good events of
the `ingest.dedup_lookback_days` days around them.

A day ingested out of order (day 2 before day 1) is checked against the later day already in
bronze: the copy being ingested is the duplicate (bronze never holds both; which copy stays depends
on the order days were ingested in). Limit, by choice: an id repeated further apart than the
lookback is not caught (no all-time event-id index is kept; a lookup over all of bronze per day
would grow without bound); so the schema suite checks event_id unique per ds, as a daily run's
one-day batch does. In a range, each day is checked against the range's earlier days as if they
were in bronze already, by one window over every copy of an id (`mark_duplicates`); bronze's old
partitions of the range's own days are being replaced and are not consulted (`outside_event_ids`).
"""

from __future__ import annotations

from pyspark.sql import Column as SparkColumn
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from gem.config import GemConfig
from gem.days import shift_day
from gem.lakehouse import tables
from gem.lakehouse.tables import table_path
from schemas.events import BRONZE_AD_EVENTS


def mark_duplicates(parsed: DataFrame, lookback_days: int, outside_ids: DataFrame | None = None) -> DataFrame:
    """Good lines (no reason yet) whose event id repeats become `duplicate_event_id`, exactly as if
    the days in `parsed` were ingested one by one, in order:

    - a copy whose day has a good copy of the id within `lookback_days` before it, among the earlier
      days in `parsed` or in `outside_ids` (event_id, ds: bronze's good events outside these days),
      or within `lookback_days` after it in `outside_ids` (days ingested out of order), is a duplicate
      with detail "already in bronze ds=<the earliest such day>";
    - otherwise the day's first copy (ordered by raw line, then file) is good and the others are
      "repeated within this ds".

    Which earlier copies are good depends on the rule itself: with a 7-day lookback and copies on
    Jan 1, Jan 8 and Jan 15, Jan 8's is a duplicate of Jan 1's and Jan 15's is good (no GOOD copy
    within 7 days before it). So per id the good days are found by one fold over its sorted days
    (`aggregate`), not by comparing each copy with every earlier copy. One shuffle by event id
    serves the bronze join and the window; the lines that broke a rule keep their own reason.
    """
    lookback = max(lookback_days, 0)
    candidate = F.col("reason").isNull()
    df = parsed.withColumn("_event_id", F.col("t.event_id"))
    if outside_ids is not None:
        seen = outside_ids.groupBy("event_id").agg(F.collect_set("ds").alias("_outside_days"))
        df = df.join(seen, df["_event_id"] == seen["event_id"], "left").drop(seen["event_id"])
        outside = F.coalesce(F.col("_outside_days"), F.array().cast("array<date>"))
    else:
        outside = F.array().cast("array<date>")
    # Candidates first, so a candidate's preceding rows are the earlier copies that compete with it.
    copies = Window.partitionBy("_event_id").orderBy(~candidate, "ds", "value", "source_file")
    days_so_far = F.array_sort(F.collect_set(F.when(candidate, F.col("ds"))).over(
        copies.rowsBetween(Window.unboundedPreceding, Window.currentRow)))

    def near(day: SparkColumn, other: SparkColumn) -> SparkColumn:
        return F.abs(F.datediff(other, day)) <= lookback

    def blocked(good: SparkColumn, day: SparkColumn) -> SparkColumn:
        """day has a good copy within the lookback: outside, or the last good day before it."""
        last_good = F.element_at(good, -1)
        return F.exists(outside, lambda o: near(day, o)) | ((F.size(good) > 0) & near(day, last_good))

    good_days = F.aggregate(days_so_far, F.array().cast("array<date>"),
                            lambda good, day: F.when(blocked(good, day), good).otherwise(F.array_append(good, day)))
    df = df.select("*", F.when(candidate, good_days).alias("_good_days"),
                   F.coalesce(F.lag("ds").over(copies) != F.col("ds"), F.lit(True)).alias("_first_of_day"))
    seen_ds = F.array_min(F.filter(F.concat(outside, F.col("_good_days")),
                                   lambda d: near(F.col("ds"), d)))
    day_is_good = F.array_contains("_good_days", F.col("ds"))
    duplicate = candidate & ~(day_is_good & F.col("_first_of_day"))
    return (
        df.withColumn(
            "detail",
            F.when(candidate & ~day_is_good, F.concat(F.lit("already in bronze ds="), seen_ds.cast("string")))
            .when(duplicate, F.lit("repeated within this ds"))
            .otherwise(F.col("detail")),
        )
        .withColumn("reason", F.when(duplicate, F.lit("duplicate_event_id")).otherwise(F.col("reason")))
        .drop("_event_id", "_outside_days", "_good_days", "_first_of_day")
    )


def outside_event_ids(spark: SparkSession, cfg: GemConfig, days: tuple[str, ...]) -> DataFrame | None:
    """(event_id, ds) of bronze's good events within the dedup lookback before the first day and
    after the last (days ingested out of order); bronze's partitions of the days themselves are being
    replaced, so a rerun does not count its own earlier output as duplicates."""
    lookback, path = cfg.ingest.dedup_lookback_days, table_path(cfg, BRONZE_AD_EVENTS)
    if lookback <= 0 or not tables.table_exists(path):
        return None
    lo, first, last, hi = (F.lit(d).cast("date") for d in (shift_day(days[0], -lookback), days[0], days[-1],
                                                            shift_day(days[-1], lookback)))
    before = (F.col("ds") >= lo) & (F.col("ds") < first)
    after = (F.col("ds") > last) & (F.col("ds") <= hi)
    return spark.read.format("delta").load(tables.spark_location(spark, path)).where(before | after).select("event_id", "ds")

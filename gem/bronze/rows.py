"""Classified lines -> the rows ingest writes: bronze.ad_events (good lines) and bronze.quarantine."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from schemas.events import BRONZE_AD_EVENTS


def good_rows(classified: DataFrame) -> DataFrame:
    """Lines with no reason -> bronze.ad_events rows (typed, event_time as timestamp, ds)."""
    cols = []
    for c in BRONZE_AD_EVENTS.columns:
        if c.name == "ds":
            cols.append(F.col("ds"))
        elif c.name == "event_time":
            cols.append(F.timestamp_millis(F.col("t.event_time")).alias("event_time"))
        else:
            cols.append(F.col(f"t.{c.name}").alias(c.name))
    return classified.where(F.col("reason").isNull()).select(*cols)


def quarantined_rows(classified: DataFrame) -> DataFrame:
    """Lines with a reason -> bronze.quarantine rows (the raw line verbatim)."""
    return classified.where(F.col("reason").isNotNull()).select(
        "ds",
        "reason",
        "detail",
        "source_file",
        F.col("value").alias("raw_line"),
    )

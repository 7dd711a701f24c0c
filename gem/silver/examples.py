"""silver.training_examples rows of the impressions of one day (or of a range of days): the bronze
days a run reads, the click links, the conversions' attribution, the examples and the census each
day's record counts (jobs/assemble_examples.py reads the inputs and commits). Definitions of every
link and label: schemas/examples.py.

Which bronze days (arrival ds) the run of day D reads, with W = attribution_window_days:
  conversions [D, D+W]: every conversion that can label an impression of D (it must arrive by D+W),
      and the ones arriving on D, which this run classifies (attributed or quarantined);
  clicks [D-2W, D+W]: a conversion arriving on X in [D, D+W] that is not rejected as late happened
      on X-W or later, so its last click within the window happened on X-2W >= D-2W or later;
  impressions [D-2W-1, D+W]: a click's impression is at most click_window_minutes (<= 1 day)
      before it; only the impressions whose (user, ad, surface) has a click are kept;
  clipped below at start_ds (gem.lakehouse.stages.examples_bronze_days). A range A..B reads the
  union, [A-2W-1, B+W].

One decision, whichever run makes it. Each decision belongs to one day: an impression's labels to
its arrival day, a conversion's outcome and a click's quarantine to theirs. It is made on the
bronze that day's own run reads, from `first_read_day` on (earlier impressions and clicks do not
compete), so a range run, which reads more, decides exactly as the daily runs do. For events that
arrive on time this cut changes nothing (the ranges above are sufficient for the exact rule); it
matters only for a click or conversion that arrived more than about 2W days after it happened.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import Column as SparkColumn
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from gem.config import GemConfig
from gem.lakehouse.commit import DayCounts
from gem.lakehouse.stages import examples_bronze_days
from gem.silver.id_hashes import id_hash
from schemas.examples import (
    AD_FEATURE_PREFIX,
    CLICK_REASONS,
    LABEL_COLUMNS,
    SILVER_TRAINING_EXAMPLES,
    USER_FEATURE_PREFIX,
)
from schemas.features import COUNTER_COLUMNS
from schemas.ids import HASHED_IDS, hash_column

NO_IMPRESSION = CLICK_REASONS[0]  # "no_impression_in_click_window"


# --------------------------------------------------------------------------------------------------
# Which bronze days a run reads.


def bronze_window(cfg: GemConfig, ds: str, through: str | None = None) -> tuple[str, str]:
    """(first, last) arrival day read for the examples of ds..through: [max(ds-2W-1, start_ds),
    through+W] (the union of the registry's day rule, gem.lakehouse.stages.examples_bronze_days)."""
    return examples_bronze_days(cfg, ds)[0], examples_bronze_days(cfg, through or ds)[-1]


def first_read_day(ds: SparkColumn, window_days: int) -> SparkColumn:
    """The first arrival day the run of day `ds` reads, ds-2W-1 (examples_bronze_days; its clip at
    start_ds is the read's own): the decisions that belong to ds see no earlier impression or click.

    Example (W 7): 2026-01-20 -> 2026-01-05."""
    return F.date_sub(ds, 2 * window_days + 1)


# --------------------------------------------------------------------------------------------------
# Pure transforms.


def link_clicks(clicks: DataFrame, impressions: DataFrame, click_window_minutes: int) -> DataFrame:
    """Each click -> the impressions it may belong to (schemas/examples.py); `linked_impression`
    picks the one it links to.

    clicks, impressions: bronze.ad_events rows (event_id, user_id, ad_id, surface, event_time, ds).
    Returns one row per click: click_id, user_id, ad_id, click_time, click_ds, candidates: the
    user's impressions of the ad on the surface at most click_window_minutes before the click that
    arrived by the click's arrival day, each struct(impression_time, impression_id, impression_ds)
    (empty: none).

    Example: impressions i1 at 10:00:00 and i2 at 10:00:05 of (u1, a7, reels), a click at 10:00:20
    -> {"click_id": "c1", "candidates": [i1, i2], ...}; a click at 11:30 with a 60-minute window -> [].
    """
    c = clicks.select(
        F.col("event_id").alias("click_id"), "user_id", "ad_id", "surface",
        F.col("event_time").alias("click_time"), F.col("ds").alias("click_ds"),
    )
    i = impressions.select(
        F.col("event_id").alias("impression_id"), F.col("user_id").alias("i_user"), F.col("ad_id").alias("i_ad"),
        F.col("surface").alias("i_surface"), F.col("event_time").alias("impression_time"),
        F.col("ds").alias("impression_ds"),
    )
    earliest = F.col("click_time") - F.expr(f"INTERVAL {int(click_window_minutes)} MINUTES")
    on = (
        (F.col("user_id") == F.col("i_user")) & (F.col("ad_id") == F.col("i_ad"))
        & (F.col("surface") == F.col("i_surface"))
        & (F.col("impression_time") <= F.col("click_time")) & (F.col("impression_time") >= earliest)
        & (F.col("impression_ds") <= F.col("click_ds"))
    )
    # A click without a match keeps one row of nulls, which collect_list skips.
    candidate = F.when(F.col("impression_id").isNotNull(), F.struct("impression_time", "impression_id", "impression_ds"))
    return c.join(i, on, "left").groupBy("click_id", "user_id", "ad_id", "click_time", "click_ds").agg(
        F.collect_list(candidate).alias("candidates"))


def linked_impression(candidates: SparkColumn, arrived_since: SparkColumn) -> SparkColumn:
    """The candidate (link_clicks) a click links to among the impressions that arrived on
    `arrived_since` or later: the latest, ties on impression_time broken by the larger
    impression_id (a struct compares field by field), so the link is deterministic; null when none."""
    return F.array_max(F.filter(candidates, lambda c: c["impression_ds"] >= arrived_since))


def click_reason(window_days: int) -> SparkColumn:
    """A link_clicks row's reason for the click quarantine, as the run of its arrival day sees it:
    no_impression_in_click_window when no candidate arrived since that run's first_read_day; else null."""
    link = linked_impression(F.col("candidates"), first_read_day(F.col("click_ds"), window_days))
    return F.when(link.isNull(), F.lit(NO_IMPRESSION))


def attribute_conversions(conversions: DataFrame, linked_clicks: DataFrame, window_days: int) -> DataFrame:
    """Each conversion -> its last click, that click's impression, and why it counts nowhere (or null).

    conversions: bronze.ad_events rows of event_type conversion; linked_clicks: link_clicks output.
    Returns one row per conversion: conversion_id, conversion_time, conversion_type, user_id, ad_id,
    ds (its arrival day), click_id, impression_id, impression_ds, reason (null = attributed to
    impression_id). Reasons, first matching wins: schemas.examples.ATTRIBUTION_REASONS. Clicks and
    impressions count from the first_read_day of the conversion's arrival day on (which cuts only
    what a conversion rejected as late could find).

    Example (window 7): click c1 on 2026-01-03 of impression i1 (ds 2026-01-03), a lead on
    2026-01-09 arriving 2026-01-10 -> {"click_id": "c1", "impression_id": "i1", "reason": None};
    arriving 2026-01-11 instead -> reason "after_impression_window".
    """
    conv = conversions.select(
        F.col("event_id").alias("conversion_id"), F.col("event_time").alias("conversion_time"),
        "conversion_type", "user_id", "ad_id", "ds",
    )
    k = linked_clicks.select(
        F.col("user_id").alias("k_user"), F.col("ad_id").alias("k_ad"), "click_id", "click_time", "click_ds",
        "candidates",
    )
    seen_since = first_read_day(F.col("ds"), window_days)
    on = (
        (F.col("user_id") == F.col("k_user")) & (F.col("ad_id") == F.col("k_ad"))
        & (F.col("click_time") <= F.col("conversion_time"))
        & (F.datediff(F.to_date("conversion_time"), F.to_date("click_time")) <= window_days)
        & (F.col("click_ds") <= F.col("ds")) & (F.col("click_ds") >= seen_since)
    )
    last = F.max(F.struct("click_time", "click_id", "candidates")).alias("_click")
    keys = ["conversion_id", "conversion_time", "conversion_type", "user_id", "ad_id", "ds"]
    found = conv.join(k, on, "left").groupBy(*keys).agg(last).select(
        *keys, "_click.click_id", linked_impression(F.col("_click.candidates"), seen_since).alias("_imp")
    ).select(*keys, "click_id", "_imp.impression_id", "_imp.impression_ds")
    reason = (
        F.when(F.datediff("ds", F.to_date("conversion_time")) > window_days, F.lit("arrived_after_window"))
        .when(F.col("click_id").isNull(), F.lit("no_click_in_window"))
        .when(F.col("impression_id").isNull(), F.lit("click_without_impression"))
        .when(F.datediff("ds", "impression_ds") > window_days, F.lit("after_impression_window"))
    )
    return found.withColumn("reason", reason)


def between_days(col: str, first_day: str, last_day: str) -> SparkColumn:
    """True where the date column `col` is in first_day..last_day (both inclusive)."""
    return F.col(col).between(F.lit(first_day).cast("date"), F.lit(last_day).cast("date"))


def _labels(linked_clicks: DataFrame, attributed: DataFrame, first_day: str, last_day: str,
            window_days: int) -> DataFrame:
    """(impression_id, ds) -> label columns and attributed_conversions, for the impressions that
    arrived on first_day..last_day with any label. A click labels the candidate it links to as the
    run of that impression's day sees them, if it arrived by the impression's ds + window."""
    candidates = linked_clicks.select("click_ds", "candidates", F.explode("candidates").alias("c"))
    impression_ds = F.col("c.impression_ds")
    links_here = linked_impression(F.col("candidates"), first_read_day(impression_ds, window_days)) == F.col("c")
    click_labels = candidates.where(
        between_days("c.impression_ds", first_day, last_day)
        & (F.col("click_ds") <= F.date_add(impression_ds, window_days)) & links_here
    ).select(F.col("c.impression_id").alias("impression_id"), impression_ds.alias("ds"),
             F.lit(1).alias("_click"), F.lit(None).cast("string").alias("conversion_type"))
    conversion_labels = attributed.where(between_days("impression_ds", first_day, last_day)).select(
        "impression_id", F.col("impression_ds").alias("ds"), F.lit(0).alias("_click"), "conversion_type"
    )
    per_type = [
        F.max(F.when(F.col("conversion_type") == t, 1).otherwise(0)).alias(col)
        for t, col in LABEL_COLUMNS.items() if t != "click"
    ]
    return click_labels.unionByName(conversion_labels).groupBy("impression_id", "ds").agg(
        F.max("_click").alias(LABEL_COLUMNS["click"]),
        *per_type,
        F.count("conversion_type").cast("int").alias("attributed_conversions"),
    )


def _prefixed_features(features: DataFrame, key: str, prefix: str) -> DataFrame:
    return features.select(
        F.col("ds").alias(f"{prefix}features_ds"), F.col(key).alias(f"{prefix}key"),
        *[F.col(c.name).alias(f"{prefix}{c.name}") for c in COUNTER_COLUMNS],
    )


def assemble(
    impressions: DataFrame,
    linked_clicks: DataFrame,
    attributed: DataFrame,
    user_features: DataFrame,
    ad_features: DataFrame,
    first_day: str,
    last_day: str,
    window_days: int,
) -> DataFrame:
    """Impressions that arrived on first_day..last_day (bronze rows) -> silver.training_examples rows,
    each in its arrival day's partition.

    attributed: attribute_conversions rows with reason null. Features: silver.user_features /
    silver.ad_features rows; each impression joins the rows of features_ds = its event day.
    """
    labels = _labels(linked_clicks, attributed, first_day, last_day, window_days)
    base = impressions.select(
        F.col("ds"), "surface", F.col("event_id").alias("impression_id"),
        F.col("event_time").alias("impression_time"), "user_id", "ad_id", "advertiser_id", "campaign_id",
        "objective", "creative_type", "position", *[id_hash(F.col(c)).alias(hash_column(c)) for c in HASHED_IDS],
        # build_sequences wrote a row for this user in ds: the impression itself arrived on ds.
        F.col("ds").alias("sequence_ds"), F.to_date("event_time").alias("features_ds"),
    )
    # Only the feature rows an impression joins, picked where they are scanned by a broadcast of the
    # impressions' (entity, day) keys, before the joins shuffle them: a range's feature tables hold
    # a row per entity and day of a 28-day window (1,000 MovieLens days: 7.9M rows of 54 counters
    # for 560k impressions).
    user, ad = (
        _prefixed_features(features, key, prefix).join(F.broadcast(base.select(
            F.col(key).alias(f"{prefix}key"), F.col("features_ds").alias(f"{prefix}features_ds")).distinct()),
            [f"{prefix}key", f"{prefix}features_ds"], "left_semi")
        for features, key, prefix in ((user_features, "user_id", USER_FEATURE_PREFIX),
                                      (ad_features, "ad_id", AD_FEATURE_PREFIX)))
    joined = (
        base.join(labels, ["impression_id", "ds"], "left")
        .join(user, (F.col("user_id") == F.col("user_key")) & (F.col("features_ds") == F.col("user_features_ds")), "left")
        .join(ad, (F.col("ad_id") == F.col("ad_key")) & (F.col("features_ds") == F.col("ad_features_ds")), "left")
    )

    def filled(name: str) -> SparkColumn:
        col = SILVER_TRAINING_EXAMPLES.column(name)
        # Labels and counters of an entity without a row are 0; rates stay null (0/0).
        return F.coalesce(F.col(name), F.lit(0)).cast(col.sql_type).alias(name) if not col.nullable else F.col(name)

    zero_filled = [*LABEL_COLUMNS.values(), "attributed_conversions"] + [
        f"{p}{c.name}" for p in (USER_FEATURE_PREFIX, AD_FEATURE_PREFIX) for c in COUNTER_COLUMNS
    ]
    out = [filled(c) if c in zero_filled else F.col(c) for c in SILVER_TRAINING_EXAMPLES.column_names]
    return joined.select(*out)


def orphan_clicks(linked_clicks: DataFrame, first_day: str, last_day: str, window_days: int) -> DataFrame:
    """The clicks that arrived on first_day..last_day and link to no impression -> silver.click_quarantine rows."""
    return linked_clicks.where(between_days("click_ds", first_day, last_day)).select(
        F.col("click_ds").alias("ds"), click_reason(window_days).alias("reason"),
        "click_id", "click_time", "user_id", "ad_id",
    ).where(F.col("reason").isNotNull())


def census(impressions: DataFrame, examples: DataFrame, outcomes: DataFrame, linked_clicks: DataFrame,
           first_day: str, last_day: str, window_days: int) -> DataFrame:
    """What each day's record counts, in one aggregation: (ds, kind, reason, n) for kind impression
    (arrived), example (written), conversion and click (arrived; reason null: attributed / linked)."""
    none = F.lit(None).cast("string").alias("reason")
    parts = [
        impressions.select("ds", F.lit("impression").alias("kind"), none),
        examples.select("ds", F.lit("example").alias("kind"), none),
        outcomes.where(between_days("ds", first_day, last_day)).select("ds", F.lit("conversion").alias("kind"), "reason"),
        linked_clicks.where(between_days("click_ds", first_day, last_day)).select(
            F.col("click_ds").alias("ds"), F.lit("click").alias("kind"), click_reason(window_days).alias("reason")),
    ]
    tally = parts[0]
    for part in parts[1:]:
        tally = tally.unionByName(part)
    return tally.groupBy("ds", "kind", "reason").agg(F.count(F.lit(1)).alias("n"))


def day_counts(rows: list[dict[str, Any]], days: tuple[str, ...]) -> tuple[dict[str, DayCounts], dict[str, dict[str, int]]]:
    """census rows -> each day's record counts, and its figures (examples, conversions_in,
    attributed, clicks_in, orphan_clicks); a day without rows counts zeros.

    Example: rows {ds 2026-01-03: 5 impressions, 5 examples, conversions 3 attributed + 1
    no_click_in_window, clicks 4 linked + 1 no_impression_in_click_window} -> DayCounts(rows_in=14,
    rows_written=12, quarantined_by_reason={"no_click_in_window": 1, "no_impression_in_click_window": 1}).
    """
    n: dict[str, dict[tuple[str, str | None], int]] = {day: {} for day in days}
    for r in rows:
        n[r["ds"].isoformat()][(r["kind"], r["reason"])] = int(r["n"])
    counts, figures = {}, {}
    for day, got in n.items():
        arrived = {kind: sum(c for (k, _), c in got.items() if k == kind) for kind in ("conversion", "click")}
        figures[day] = {
            "examples": got.get(("example", None), 0),
            "conversions_in": arrived["conversion"],
            "attributed": got.get(("conversion", None), 0),
            "clicks_in": arrived["click"],
            "orphan_clicks": got.get(("click", NO_IMPRESSION), 0),
        }
        counts[day] = DayCounts(
            rows_in=got.get(("impression", None), 0) + arrived["conversion"] + arrived["click"],
            rows_written=figures[day]["examples"] + figures[day]["attributed"] + got.get(("click", None), 0),
            quarantined_by_reason=dict(sorted((reason, c) for (kind, reason), c in got.items()
                                              if kind in ("conversion", "click") and reason is not None)),
        )
    return counts, figures

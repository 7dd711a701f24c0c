"""Assemble silver.training_examples for the impressions of one day, once their window has closed.

    python -m jobs.assemble_examples --ds D          # the impressions that arrived on D
    python -m jobs.assemble_examples --ready-on R    # the day whose window closes on R: D = R - window

Runs once bronze is validated through D + attribution_window_days (the DAG runs it with
--ready-on; a day before start_ds + window has nothing ready and exits 99, which Airflow shows as
skipped). Definitions of every link and label: schemas/examples.py.

Which bronze days (arrival ds) it reads, with W = attribution_window_days:
  conversions [D, D+W]: every conversion that can label an impression of D (it must arrive by D+W),
      and the ones arriving on D, which this run classifies (attributed or quarantined);
  clicks [D-2W, D+W]: a conversion arriving on X in [D, D+W] that is not rejected as late happened
      on X-W or later, so its last click within the window happened on X-2W >= D-2W or later;
  impressions [D-2W-1, D+W]: a click's impression is at most click_window_minutes (<= 1 day)
      before it; only the impressions whose (user, ad, surface) has a click are kept;
  clipped below at start_ds. Those ranges are sufficient for the exact rule, so the same function
  classifies a conversion identically in every run that sees it.

Flow (pure transforms; thin I/O around them):
  gate: validate_events for every bronze day read, validate_silver for D (sequences, features);
  link_clicks(clicks, impressions) -> each click's impression;
  attribute_conversions(conversions, linked clicks) -> each conversion's click, impression, reason;
  assemble(impressions of D, linked clicks, attributed conversions, features) -> examples of D;
  commit (gem.lakehouse.commit.StageCommit): withdraw (assemble_examples, D); replace examples ds=D; replace attribution quarantine
  ds=D (the conversions that arrived on D and count nowhere); replace click quarantine ds=D (the
  clicks that arrived on D and link to no impression); publish the record LAST with
  rows_in = impressions(D) + conversions(D) + clicks(D)
          = examples + attributed + linked clicks + quarantined (conversions and clicks, by reason).
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

from gem.cli import examples_parser, resolve_examples_day, shift_day
from gem.config import GemConfig, load_config
from gem.lakehouse.commit import ReconciliationError, StageCommit, StageContext, StageResult
from gem.lakehouse.stages import examples_bronze_days
from gem.orchestration import NOTHING_READY_EXIT  # exit code: nothing ready yet, the task is skipped
from schemas.events import BRONZE_AD_EVENTS
from schemas.examples import (
    AD_FEATURE_PREFIX,
    LABEL_COLUMNS,
    SILVER_ATTRIBUTION_QUARANTINE,
    SILVER_CLICK_QUARANTINE,
    SILVER_TRAINING_EXAMPLES,
    USER_FEATURE_PREFIX,
)
from schemas.features import COUNTER_COLUMNS, SILVER_AD_FEATURES, SILVER_USER_FEATURES

if TYPE_CHECKING:
    from pyspark.sql import Column as SparkColumn
    from pyspark.sql import DataFrame

STAGE = "assemble_examples"
VALIDATE_SILVER_STAGE = "validate_silver"
VALIDATE_EVENTS_STAGE = "validate_events"


# --------------------------------------------------------------------------------------------------
# Which bronze days a run reads.


def bronze_window(cfg: GemConfig, ds: str) -> tuple[str, str]:
    """(first, last) arrival day read for the examples of ds: [max(ds-2W-1, start_ds), ds+W]
    (the registry's day rule, gem.lakehouse.stages.examples_bronze_days)."""
    days = examples_bronze_days(cfg, ds)
    return days[0], days[-1]


# --------------------------------------------------------------------------------------------------
# Pure transforms.


def link_clicks(clicks: DataFrame, impressions: DataFrame, click_window_minutes: int) -> DataFrame:
    """Each click -> the impression it belongs to (schemas/examples.py), or none.

    clicks, impressions: bronze.ad_events rows (event_id, user_id, ad_id, surface, event_time, ds).
    Returns one row per click: click_id, user_id, ad_id, click_time, click_ds, impression_id,
    impression_ds (both null when no impression qualifies). Ties on impression_time break by the
    larger impression_id, so the link is deterministic.

    Example: impressions i1 at 10:00:00 and i2 at 10:00:05 of (u1, a7, reels), a click at 10:00:20
    -> {"click_id": "c1", "impression_id": "i2", ...}; a click at 11:30 with a 60-minute window -> none.
    """
    from pyspark.sql import functions as F

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
    # max() of a struct compares field by field: the latest impression, then the larger id. A click
    # without a match keeps one row whose struct fields are all null.
    latest = F.max(F.struct("impression_time", "impression_id", "impression_ds")).alias("_imp")
    linked = c.join(i, on, "left").groupBy("click_id", "user_id", "ad_id", "click_time", "click_ds").agg(latest)
    return linked.select(
        "click_id", "user_id", "ad_id", "click_time", "click_ds",
        F.col("_imp.impression_id").alias("impression_id"), F.col("_imp.impression_ds").alias("impression_ds"),
    )


def attribute_conversions(conversions: DataFrame, linked_clicks: DataFrame, window_days: int) -> DataFrame:
    """Each conversion -> its last click, that click's impression, and why it counts nowhere (or null).

    conversions: bronze.ad_events rows of event_type conversion; linked_clicks: link_clicks output.
    Returns one row per conversion: conversion_id, conversion_time, conversion_type, user_id, ad_id,
    ds (its arrival day), click_id, impression_id, impression_ds, reason (null = attributed to
    impression_id). Reasons, first matching wins: schemas.examples.ATTRIBUTION_REASONS.

    Example (window 7): click c1 on 2026-01-03 of impression i1 (ds 2026-01-03), a lead on
    2026-01-09 arriving 2026-01-10 -> {"click_id": "c1", "impression_id": "i1", "reason": None};
    arriving 2026-01-11 instead -> reason "after_impression_window".
    """
    from pyspark.sql import functions as F

    conv = conversions.select(
        F.col("event_id").alias("conversion_id"), F.col("event_time").alias("conversion_time"),
        "conversion_type", "user_id", "ad_id", "ds",
    )
    k = linked_clicks.select(
        F.col("user_id").alias("k_user"), F.col("ad_id").alias("k_ad"), "click_id", "click_time", "click_ds",
        "impression_id", "impression_ds",
    )
    on = (
        (F.col("user_id") == F.col("k_user")) & (F.col("ad_id") == F.col("k_ad"))
        & (F.col("click_time") <= F.col("conversion_time"))
        & (F.datediff(F.to_date("conversion_time"), F.to_date("click_time")) <= window_days)
        & (F.col("click_ds") <= F.col("ds"))
    )
    last = F.max(F.struct("click_time", "click_id", "impression_id", "impression_ds")).alias("_click")
    keys = ["conversion_id", "conversion_time", "conversion_type", "user_id", "ad_id", "ds"]
    found = conv.join(k, on, "left").groupBy(*keys).agg(last).select(
        *keys, "_click.click_id", "_click.impression_id", "_click.impression_ds"
    )
    reason = (
        F.when(F.datediff("ds", F.to_date("conversion_time")) > window_days, F.lit("arrived_after_window"))
        .when(F.col("click_id").isNull(), F.lit("no_click_in_window"))
        .when(F.col("impression_id").isNull(), F.lit("click_without_impression"))
        .when(F.datediff("ds", "impression_ds") > window_days, F.lit("after_impression_window"))
    )
    return found.withColumn("reason", reason)


def _labels(linked_clicks: DataFrame, attributed: DataFrame, ds: str, arrived_by: str) -> DataFrame:
    """impression_id -> label columns and attributed_conversions, for impressions of ds with any label."""
    from pyspark.sql import functions as F

    day = F.lit(ds).cast("date")
    click_labels = (
        linked_clicks.where((F.col("impression_ds") == day) & (F.col("click_ds") <= F.lit(arrived_by).cast("date")))
        .select("impression_id", F.lit(1).alias("_click"), F.lit(None).cast("string").alias("conversion_type"))
    )
    conversion_labels = attributed.where(F.col("impression_ds") == day).select(
        "impression_id", F.lit(0).alias("_click"), "conversion_type"
    )
    per_type = [
        F.max(F.when(F.col("conversion_type") == t, 1).otherwise(0)).alias(col)
        for t, col in LABEL_COLUMNS.items() if t != "click"
    ]
    return click_labels.unionByName(conversion_labels).groupBy("impression_id").agg(
        F.max("_click").alias(LABEL_COLUMNS["click"]),
        *per_type,
        F.count("conversion_type").cast("int").alias("attributed_conversions"),
    )


def _prefixed_features(features: DataFrame, key: str, prefix: str) -> DataFrame:
    from pyspark.sql import functions as F

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
    ds: str,
    window_days: int,
) -> DataFrame:
    """Impressions that arrived on ds (bronze rows) -> silver.training_examples rows of ds.

    attributed: attribute_conversions rows with reason null. Features: silver.user_features /
    silver.ad_features rows; each impression joins the rows of features_ds = its event day.
    """
    from pyspark.sql import functions as F

    labels = _labels(linked_clicks, attributed, ds, shift_day(ds, window_days))
    base = impressions.select(
        F.col("ds"), "surface", F.col("event_id").alias("impression_id"),
        F.col("event_time").alias("impression_time"), "user_id", "ad_id", "advertiser_id", "campaign_id",
        "objective", "creative_type", "position",
        # build_sequences wrote a row for this user in ds: the impression itself arrived on ds.
        F.col("ds").alias("sequence_ds"), F.to_date("event_time").alias("features_ds"),
    )
    user = _prefixed_features(user_features, "user_id", USER_FEATURE_PREFIX)
    ad = _prefixed_features(ad_features, "ad_id", AD_FEATURE_PREFIX)
    joined = (
        base.join(labels, "impression_id", "left")
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


# --------------------------------------------------------------------------------------------------
# Thin I/O.


def check_day(cfg: GemConfig, ds: str) -> tuple[str, str]:
    """The bronze window (first, last arrival day) the examples of ds read; ds must be a pipeline day."""
    if ds < cfg.start_ds:
        raise ValueError(f"{STAGE} ds={ds} is before the pipeline's start_ds={cfg.start_ds}")
    return bronze_window(cfg, ds)


def require_feature_days(commit: StageCommit, day_impressions: DataFrame) -> list[str]:
    """The features_ds values the impressions of ds join (their event days; earlier than ds only for
    impressions that arrived late), each validated. Days before start_ds have no features: the
    counters of such an impression are 0, as for an entity without history."""
    from pyspark.sql import functions as F

    rows = day_impressions.select(F.to_date("event_time").alias("d")).distinct().collect()
    days = sorted(d for d in (r["d"].isoformat() for r in rows) if d >= commit.cfg.start_ds)
    for d in days:
        if d != commit.ds:  # ds itself is a declared need, checked when the commit began
            commit.also_needs(VALIDATE_SILVER_STAGE, d)
    return days


def orphan_clicks(linked_clicks: DataFrame, ds: str) -> DataFrame:
    """The clicks that arrived on ds and link to no impression -> silver.click_quarantine rows."""
    from pyspark.sql import functions as F

    day = F.lit(ds).cast("date")
    return linked_clicks.where((F.col("click_ds") == day) & F.col("impression_id").isNull()).select(
        day.alias("ds"), F.lit("no_impression_in_click_window").alias("reason"),
        "click_id", "click_time", "user_id", "ad_id",
    )


def run(ctx: StageContext, ds: str) -> StageResult:
    """Assemble impression day ds; details: examples, conversions_in and clicks_in (arrived on ds),
    attributed, orphan_clicks."""
    from pyspark.sql import functions as F

    from gem.lakehouse import tables

    t0, cfg = time.time(), ctx.cfg
    first, last = check_day(cfg, ds)
    spark = ctx.spark_for(STAGE, ds)
    commit = StageCommit.begin(ctx, STAGE, ds)
    day = F.lit(ds).cast("date")

    # Each input at the version its validation saw (refused if rewritten since, naming the rerun).
    bronze_version = commit.validated_version(BRONZE_AD_EVENTS, VALIDATE_EVENTS_STAGE, examples_bronze_days(cfg, ds))
    bronze = tables.read_table(spark, cfg, BRONZE_AD_EVENTS, version=bronze_version).where(
        F.col("ds").between(F.lit(first).cast("date"), F.lit(last).cast("date"))
    )
    narrow = bronze.select("event_id", "event_type", "user_id", "ad_id", "surface", "event_time", "ds", "conversion_type")
    clicks = narrow.where(F.col("event_type") == "click")
    clicked_keys = clicks.select("user_id", "ad_id", "surface").distinct()
    impressions = narrow.where(F.col("event_type") == "impression").join(
        clicked_keys, ["user_id", "ad_id", "surface"], "left_semi"
    )
    conversions = narrow.where((F.col("event_type") == "conversion") & (F.col("ds") >= day))

    # Checkpointed: both are used twice, and the commits below must not re-trigger their plans.
    linked = link_clicks(clicks, impressions, cfg.click_window_minutes).localCheckpoint(eager=True)
    outcomes = attribute_conversions(conversions, linked, cfg.attribution_window_days).localCheckpoint(eager=True)
    attributed = outcomes.where(F.col("reason").isNull())

    day_impressions = bronze.where((F.col("ds") == day) & (F.col("event_type") == "impression"))
    feature_days = require_feature_days(commit, day_impressions)
    in_days = F.col("ds").isin([F.lit(d).cast("date") for d in feature_days]) if feature_days else F.lit(False)
    validated_days = feature_days or [ds]
    user_features, ad_features = (
        tables.read_table(spark, cfg, schema, version=commit.validated_version(
            schema, VALIDATE_SILVER_STAGE, validated_days)).where(in_days)
        for schema in (SILVER_USER_FEATURES, SILVER_AD_FEATURES))
    examples = assemble(
        day_impressions, linked, attributed, user_features, ad_features, ds, cfg.attribution_window_days
    ).localCheckpoint(eager=True)

    arrived_today = outcomes.where(F.col("ds") == day)
    quarantine = arrived_today.where(F.col("reason").isNotNull()).select(*SILVER_ATTRIBUTION_QUARANTINE.column_names)
    quarantined = {r["reason"]: int(r["n"]) for r in quarantine.groupBy("reason").agg(F.count("*").alias("n")).collect()}
    conversions_in = arrived_today.count()
    attributed_today = conversions_in - sum(quarantined.values())
    n_examples = examples.count()
    n_impressions = day_impressions.count()
    clicks_in = linked.where(F.col("click_ds") == day).count()
    orphans = orphan_clicks(linked, ds)
    n_orphans = orphans.count()
    if n_orphans:
        quarantined["no_impression_in_click_window"] = n_orphans

    commit.replace(examples, SILVER_TRAINING_EXAMPLES)
    commit.replace(quarantine, SILVER_ATTRIBUTION_QUARANTINE)
    commit.replace(orphans, SILVER_CLICK_QUARANTINE)
    # Reconciled with the commits: the examples' commit wrote one row per impression of ds, the
    # quarantine's the conversions counted by reason.
    if commit.committed_rows[SILVER_TRAINING_EXAMPLES.name] != n_examples:
        raise ReconciliationError(f"{STAGE} ds={ds}: the examples' commit wrote "
                                  f"{commit.committed_rows[SILVER_TRAINING_EXAMPLES.name]} rows, counted {n_examples}")
    commit.publish(
        rows_in=n_impressions + conversions_in + clicks_in,
        rows_written=n_examples + attributed_today + clicks_in - n_orphans,
        quarantined_by_reason=quarantined,
        quarantine_table=(SILVER_ATTRIBUTION_QUARANTINE, SILVER_CLICK_QUARANTINE),
    )
    return commit.result(t0, examples=n_examples, conversions_in=conversions_in, attributed=attributed_today,
                         clicks_in=clicks_in, orphan_clicks=n_orphans)


def main(argv: list[str] | None = None) -> int:
    args = examples_parser(__doc__.splitlines()[0]).parse_args(argv)
    cfg = load_config(args.config)
    ds = resolve_examples_day(cfg, args)
    if ds is None:
        print(f"{STAGE}: no impression day's window closes on {args.ready_on} (start_ds={cfg.start_ds}); nothing to do")
        return NOTHING_READY_EXIT
    result = run(StageContext(cfg), ds)
    details = result.details
    print(f"{result.summary()} (examples={details['examples']}, conversions arrived={details['conversions_in']}, "
          f"attributed={details['attributed']}, clicks arrived={details['clicks_in']}, "
          f"linking no impression={details['orphan_clicks']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

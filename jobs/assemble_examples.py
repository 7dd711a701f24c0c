"""Assemble silver.training_examples for the impressions of one day (or of a range of days), once their window has closed.

    python -m jobs.assemble_examples --ds D               # the impressions that arrived on D
    python -m jobs.assemble_examples --ready-on R         # the day whose window closes on R: D = R - window
    python -m jobs.assemble_examples --ds A --through B   # the impression days A..B in one pass

Runs once bronze is validated through D + attribution_window_days (the DAG runs it with
--ready-on; a day before start_ds + window has nothing ready and exits 99, which Airflow shows as
skipped). Definitions of every link and label: schemas/examples.py. Which bronze days a run reads,
and why a range decides exactly as the daily runs do: gem/silver/examples.py.

Flow (the pure transforms are in gem/silver/examples.py; this module is the thin I/O around them):
  gate: validate_events for every bronze day read, validate_silver for each day (sequences,
      features) and for the event days of late impressions;
  link_clicks(clicks, impressions) -> each click's candidate impressions;
  attribute_conversions(conversions, linked clicks) -> each conversion's click, impression, reason;
  assemble(impressions of the days, linked clicks, attributed conversions, features) -> examples;
  commit (gem.lakehouse.commit.StageCommit): withdraw the days' records; replace examples, the
  attribution quarantine (the conversions that arrived on the days and count nowhere) and the click
  quarantine (the clicks that arrived on the days and link to no impression) of the days, one Delta
  commit each; publish one record per day LAST, with
  rows_in = impressions(D) + conversions(D) + clicks(D)
          = examples + attributed + linked clicks + quarantined (conversions and clicks, by reason).
"""

from __future__ import annotations

import sys
import time

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from gem.config import GemConfig
from gem.days import day_range
from gem.lakehouse import tables
from gem.lakehouse.commit import ReconciliationError, StageCommit, StageContext, StageResult
from gem.pipeline.cli import StageCall, run_command, stage_command
from gem.silver.examples import (
    assemble,
    attribute_conversions,
    between_days,
    bronze_window,
    census,
    day_counts,
    link_clicks,
    orphan_clicks,
)
from schemas.events import BRONZE_AD_EVENTS
from schemas.examples import SILVER_ATTRIBUTION_QUARANTINE, SILVER_CLICK_QUARANTINE, SILVER_TRAINING_EXAMPLES
from schemas.features import SILVER_AD_FEATURES, SILVER_USER_FEATURES

STAGE = "assemble_examples"
VALIDATE_SILVER_STAGE = "validate_silver"
VALIDATE_EVENTS_STAGE = "validate_events"


# --------------------------------------------------------------------------------------------------
# Thin I/O.


def check_days(cfg: GemConfig, ds: str, through: str | None = None) -> tuple[str, str]:
    """The bronze window (first, last arrival day) the examples of ds..through read; ds must be a pipeline day."""
    if ds < cfg.start_ds:
        raise ValueError(f"{STAGE} ds={ds} is before the pipeline's start_ds={cfg.start_ds}")
    return bronze_window(cfg, ds, through)


def require_feature_days(commit: StageCommit, impressions: DataFrame) -> list[str]:
    """The features_ds values the impressions of the commit's days join (their event days; earlier
    than their arrival day only for impressions that arrived late), each validated. Days before
    start_ds have no features: the counters of such an impression are 0, as for an entity without
    history."""
    rows = impressions.select(F.to_date("event_time").alias("d")).distinct().collect()
    days = sorted(d for d in (r["d"].isoformat() for r in rows) if d >= commit.cfg.start_ds)
    for d in days:
        if d not in commit.days:  # the commit's own days are declared needs, checked when it began
            commit.also_needs(VALIDATE_SILVER_STAGE, d)
    return days


def run(ctx: StageContext, ds: str, through: str | None = None) -> StageResult:
    """Assemble impression day ds (or the days ds..through in one pass, one commit per table and one
    record per day, exactly as if assembled one by one); details: examples, conversions_in and
    clicks_in (arrived on the days), attributed, orphan_clicks (totals), days (the same per day)."""
    t0, cfg, window = time.time(), ctx.cfg, ctx.cfg.attribution_window_days
    first, last = check_days(cfg, ds, through)
    spark = ctx.spark_for(STAGE, ds)
    commit = StageCommit.begin(ctx, STAGE, ds, through)
    first_day, last_day = commit.days[0], commit.days[-1]

    # Each input at the version its validation saw (refused if rewritten since, naming the rerun).
    bronze_version = commit.validated_version(BRONZE_AD_EVENTS, VALIDATE_EVENTS_STAGE, day_range(first, last))
    bronze = tables.read_table(spark, cfg, BRONZE_AD_EVENTS, version=bronze_version).where(
        between_days("ds", first, last))
    narrow = bronze.select("event_id", "event_type", "user_id", "ad_id", "surface", "event_time", "ds", "conversion_type")
    clicks = narrow.where(F.col("event_type") == "click")
    clicked_keys = clicks.select("user_id", "ad_id", "surface").distinct()
    impressions = narrow.where(F.col("event_type") == "impression").join(
        clicked_keys, ["user_id", "ad_id", "surface"], "left_semi"
    )
    conversions = narrow.where((F.col("event_type") == "conversion") & (F.col("ds") >= F.lit(first_day).cast("date")))

    # Checkpointed: both are used several times, and the commits below must not re-trigger their plans.
    linked = link_clicks(clicks, impressions, cfg.click_window_minutes).localCheckpoint(eager=True)
    outcomes = attribute_conversions(conversions, linked, window).localCheckpoint(eager=True)
    attributed = outcomes.where(F.col("reason").isNull())

    days_impressions = bronze.where(between_days("ds", first_day, last_day) & (F.col("event_type") == "impression"))
    feature_days = require_feature_days(commit, days_impressions)
    in_days = F.col("ds").isin([F.lit(d).cast("date") for d in feature_days]) if feature_days else F.lit(False)
    validated_days = feature_days or list(commit.days)
    user_features, ad_features = (
        tables.read_table(spark, cfg, schema, version=commit.validated_version(
            schema, VALIDATE_SILVER_STAGE, validated_days)).where(in_days)
        for schema in (SILVER_USER_FEATURES, SILVER_AD_FEATURES))
    examples = assemble(
        days_impressions, linked, attributed, user_features, ad_features, first_day, last_day, window
    ).localCheckpoint(eager=True)

    quarantine = outcomes.where(between_days("ds", first_day, last_day) & F.col("reason").isNotNull()).select(
        *SILVER_ATTRIBUTION_QUARANTINE.column_names)
    orphans = orphan_clicks(linked, first_day, last_day, window)
    rows = census(days_impressions, examples, outcomes, linked, first_day, last_day, window).collect()
    per_day, figures = day_counts([r.asDict() for r in rows], commit.days)

    commit.replace(examples, SILVER_TRAINING_EXAMPLES)
    commit.replace(quarantine, SILVER_ATTRIBUTION_QUARANTINE)
    commit.replace(orphans, SILVER_CLICK_QUARANTINE)
    # Reconciled with the commits: the examples' commit wrote one row per impression of the days,
    # the quarantines' the conversions and clicks counted by reason (checked by publish).
    n_examples = sum(f["examples"] for f in figures.values())
    if commit.committed_rows[SILVER_TRAINING_EXAMPLES.name] != n_examples:
        raise ReconciliationError(f"{STAGE} ds={ds}: the examples' commit wrote "
                                  f"{commit.committed_rows[SILVER_TRAINING_EXAMPLES.name]} rows, counted {n_examples}")
    commit.publish(per_day=per_day, quarantine_table=(SILVER_ATTRIBUTION_QUARANTINE, SILVER_CLICK_QUARANTINE))
    totals = {name: sum(f[name] for f in figures.values()) for name in next(iter(figures.values()))}
    return commit.result(t0, **totals, days=figures)


def command_line(call: StageCall) -> int:
    """Assemble the examples of impression day --ds (or of the days --ds..--through, or of the day
    whose window closes on --ready-on); print the summary and its counts."""
    result = run(StageContext(call.cfg), call.ds, call.through)
    details = result.details
    print(f"{result.summary()} (examples={details['examples']}, conversions arrived={details['conversions_in']}, "
          f"attributed={details['attributed']}, clicks arrived={details['clicks_in']}, "
          f"linking no impression={details['orphan_clicks']})")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_command(stage_command("assemble_examples", command_line), argv)


if __name__ == "__main__":
    sys.exit(main())

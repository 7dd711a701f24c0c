"""Data-quality suites for the silver tables: sequences, features, training examples.

Each suite is a list of GX expectations over the ds partitions of its table one run validates (the
batch: one day, or a range of days at once, so every per-day rule groups by ds). Rules that span
columns or rows are `UnexpectedRowsExpectation` queries returning the offending rows with their ds
(Spark SQL, `{batch}` is the batch), so several per-column rules fold into one query and one Spark
job. The sequences and features suites validate a narrow batch computed in one pass over the table
(`sequence_checks`, `feature_checks`: the keys and a boolean per rule), not the wide rows. Critical
rules break a table's contract (the job fails, no completion record); warnings are reported in the
Data Docs only.

  silver.user_sequences: each sequence within its cap and as long as min(count, cap); elements
      strictly ordered by (event_time, event_id); last_event_time not before any element; one row
      per user. Warning: the cap margin (schemas/examples.py), as a statistic per day.
  silver.user_features / silver.ad_features: one row per entity; windows nested (1d <= 7d <= 28d);
      per-surface counts add up to the all-surfaces count; clicks_28d <= impressions_28d for at
      least `quality.min_clicks_within_impressions` of rows (window-edge clicks, see schemas/features.py).
  silver.training_examples: one row per impression; label rate per task within
      `quality.label_rates`; a conversion label implies the click label; every example's
      (user_id, sequence_ds) row exists in silver.user_sequences; features_ds is the impression's day;
      examples whose sequence prefix the cap cut short (schemas/examples.py) are counted (a warning
      listing them) and fail the day above `quality.max_sequence_cut_rate` of its examples.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from pyspark.sql import functions as F

from gem.config import GemConfig
from gem.quality.expectations import (
    bound_text,
    contract_setting,
    expect_between,
    expectation_severity,
    gx_expectations,
    rule_meta,
)
from schemas.examples import LABEL_COLUMNS, SILVER_TRAINING_EXAMPLES
from schemas.features import COUNT_METRICS, SILVER_AD_FEATURES, SILVER_USER_FEATURES, WINDOW_DAYS, counter_name
from schemas.sequences import SEQUENCE_COLUMNS, SILVER_USER_SEQUENCES
from schemas.tasks import SURFACES

if TYPE_CHECKING:
    from great_expectations.expectations import Expectation
    from pyspark.sql import DataFrame


def _rows_breaking(rule: str, where: str, setting: str, critical: bool = True, select: str = "*",
                   flagged: bool = False) -> Expectation:
    """An expectation that no row of the batch matches `where`. flagged: the batch carries `where`
    already computed as a boolean column named `rule` (its one pass over wide rows:
    `sequence_checks`, `feature_checks`) and the query reads that column. setting: what sets the rule."""
    return gx_expectations().UnexpectedRowsExpectation(
        unexpected_rows_query=f"SELECT {select} FROM {{batch}} WHERE {rule if flagged else where}",
        description=f"No row with: {where}",
        meta=rule_meta(rule, critical, setting=setting, bound=f"no row with {where}"),
        severity=expectation_severity(critical),
    )


def _groups_breaking(rule: str, query: str, setting: str, bound: str, measure: str | None = None,
                     critical: bool = True) -> Expectation:
    """An expectation that `query` returns no group (a day, a surface of a day); `measure`: its column
    holding the value found in each group (the query lists the worst group first)."""
    return gx_expectations().UnexpectedRowsExpectation(
        unexpected_rows_query=query, description=rule, severity=expectation_severity(critical),
        meta=rule_meta(rule, critical, setting=setting, bound=bound, measure=measure),
    )


def _unique(rule: str, key: str, setting: str) -> Expectation:
    """One row per `key` within each day of the batch (a batch may hold a range of days)."""
    return _groups_breaking(rule, f"SELECT ds, {key}, count(*) AS rows FROM {{batch}} GROUP BY ds, {key} "
                                  "HAVING count(*) > 1 ORDER BY rows DESC", setting, f"one row per {key} a day", "rows")


def _any_of(terms: list[str]) -> str:
    return " OR ".join(f"({t})" for t in terms)


# --------------------------------------------------------------------------------------------------
# silver.user_sequences


def _caps(cfg: GemConfig) -> dict[str, int]:
    """sequence column -> its cap."""
    return {seq: int(getattr(cfg.sequence_caps, t)) for t, (seq, _) in SEQUENCE_COLUMNS.items()}


def _sequence_rules(cfg: GemConfig) -> dict[str, str]:
    """rule -> the SQL condition (over a silver.user_sequences row) of a row that breaks it."""
    caps = _caps(cfg)
    counts = {seq: n for seq, n in SEQUENCE_COLUMNS.values()}
    # Consecutive pairs (a, b) of a sequence; structs compare field by field: (event_time, event_id, ...).
    pairs = "zip_with(slice({s}, 1, greatest(size({s}) - 1, 0)), slice({s}, 2, greatest(size({s}) - 1, 0)), (a, b) -> a < b)"
    return {
        "sequences_within_caps": _any_of([f"size({s}) > {cap}" for s, cap in caps.items()]),
        "sequence_length_is_min_count_cap": _any_of([f"size({s}) <> least({counts[s]}, {cap})" for s, cap in caps.items()]),
        "sequences_strictly_ordered": _any_of([f"NOT forall({pairs.format(s=s)}, x -> x)" for s in caps]),
        "last_event_time_is_latest": _any_of([f"exists({s}, e -> e.event_time > last_event_time)" for s in caps]),
    }


def day_events_column(seq: str) -> str:
    return f"max_user_day_events__{seq}"


def sequence_checks(sequences: DataFrame, cfg: GemConfig) -> DataFrame:
    """The batch the sequences suite validates, from ONE pass over `sequences` (silver.user_sequences
    rows): ds, user_id, a boolean per rule (named by the rule: the row breaks it) and, per sequence,
    the row's elements with event_time on its ds (`day_events_column`, for the cap margin). A range
    of days is hundreds of thousands of rows of arrays: cached whole it does not fit a 4 GB driver
    (200 MovieLens days failed), and each rule's query rescanning it decodes every array again;
    these few columns cache in kilobytes per day."""
    day_start = F.col("ds").cast("timestamp")  # midnight UTC: the session time zone (gem.lakehouse.spark)
    return sequences.select(
        "ds", "user_id",
        *[F.expr(where).alias(rule) for rule, where in _sequence_rules(cfg).items()],
        *[F.size(F.filter(F.col(seq), lambda e: e["event_time"] >= day_start)).alias(day_events_column(seq))
          for seq, _ in SEQUENCE_COLUMNS.values()],
    )


def sequence_expectations(cfg: GemConfig) -> list[Expectation]:
    """The sequences suite, over a batch of `sequence_checks(...)`."""
    contract = contract_setting(SILVER_USER_SEQUENCES)
    # The caps come from the config; a sequence over its cap is build_sequences breaking them.
    settings = {"sequences_within_caps": f"sequence_caps (as build_sequences applies them; {contract})",
                "sequence_length_is_min_count_cap": f"sequence_caps ({contract})"}
    return [*(_rows_breaking(rule, where, settings.get(rule, contract), select="ds, user_id", flagged=True)
              for rule, where in _sequence_rules(cfg).items()),
            _unique("one_row_per_user", "user_id", contract)]


def sequence_margin_statistics(checks: DataFrame, days: Sequence[str]) -> dict[str, dict[str, int]]:
    """day -> for each sequence: the most elements one user has with event_time on that day (the
    day's events that sit after any impression of that day in its snapshot); 0 for a day without
    rows. `checks` is `sequence_checks(...)`: one aggregation over its few columns."""
    names = [day_events_column(seq) for seq, _ in SEQUENCE_COLUMNS.values()]
    found = {str(r["ds"]): r.asDict() for r in checks.groupBy("ds").agg(*[F.max(n).alias(n) for n in names]).collect()}
    return {day: {n: int(found.get(day, {}).get(n) or 0) for n in names} for day in days}


def sequence_margin_expectations(cfg: GemConfig) -> list[Expectation]:
    """Warnings: the busiest user of the day leaves at least min_sequence_margin of each cap."""
    margin = cfg.quality.min_sequence_margin
    return [
        expect_between(day_events_column(seq), 0, int(cap * (1.0 - margin)), f"cap_margin:{seq}", False,
                       "quality.min_sequence_margin and sequence_caps")
        for seq, cap in _caps(cfg).items()
    ]


# --------------------------------------------------------------------------------------------------
# silver.user_features / silver.ad_features


def _feature_rules() -> dict[str, str]:
    """rule -> the SQL condition (over a features row) of a row that breaks it."""
    nested, added_up = [], []
    for metric in COUNT_METRICS.values():
        short, mid, long_ = (counter_name(metric, w) for w in WINDOW_DAYS)
        nested.append(f"{short} > {mid} OR {mid} > {long_}")
        for w in WINDOW_DAYS:
            per_surface = " + ".join(counter_name(metric, w, s) for s in SURFACES)
            added_up.append(f"{counter_name(metric, w)} <> {per_surface}")
    return {"windows_nested": _any_of(nested), "surfaces_add_up": _any_of(added_up)}


CLICKS_ABOVE_IMPRESSIONS = "clicks_above_impressions"


def feature_checks(features: DataFrame, key: str) -> DataFrame:
    """The batch the features suite validates, from one pass over `features` (silver.user_features
    or silver.ad_features rows, entity column `key`): ds, key, a boolean per rule and
    CLICKS_ABOVE_IMPRESSIONS (the 28-day clicks exceed the impressions). Sixty counters a row over a
    range of days cache heavy; these few columns do not (see `sequence_checks`)."""
    impressions, clicks = (counter_name(m, max(WINDOW_DAYS)) for m in ("impressions", "clicks"))
    return features.select(
        "ds", key, *[F.expr(where).alias(rule) for rule, where in _feature_rules().items()],
        (F.col(clicks) > F.col(impressions)).alias(CLICKS_ABOVE_IMPRESSIONS),
    )


def feature_expectations(cfg: GemConfig, key: str) -> list[Expectation]:
    """The features suite, over a batch of `feature_checks(..., key)`."""
    contract = contract_setting(SILVER_USER_FEATURES if key == "user_id" else SILVER_AD_FEATURES)
    least = cfg.quality.min_clicks_within_impressions
    return [
        _unique(f"one_row_per_{key}", key, contract),
        *(_rows_breaking(rule, where, contract, select=f"ds, {key}", flagged=True) for rule, where in _feature_rules().items()),
        # Per day, at least `min_clicks_within_impressions` of the rows have clicks <= impressions.
        _groups_breaking("clicks_within_impressions",
                         f"SELECT ds, count_if(NOT {CLICKS_ABOVE_IMPRESSIONS}) / count(*) AS within_rate, "
                         f"count_if({CLICKS_ABOVE_IMPRESSIONS}) AS {CLICKS_ABOVE_IMPRESSIONS}, count(*) AS rows "
                         f"FROM {{batch}} GROUP BY ds HAVING count_if(NOT {CLICKS_ABOVE_IMPRESSIONS}) < {least} * count(*) "
                         "ORDER BY within_rate",
                         "quality.min_clicks_within_impressions",
                         f"at least {least} of a day's rows with clicks_28d <= impressions_28d", "within_rate"),
    ]


# --------------------------------------------------------------------------------------------------
# silver.training_examples


def _prefix_cut(cfg: GemConfig) -> str:
    """SQL over examples `b` joined to their snapshot rows `s`: true when the cap cut the prefix the
    model reads. Of a sequence, the elements at or after the impression are `after`; those before it
    kept are size - after; the user had count - after before it; the model reads at most L of them
    (the loader's cut at what the model reads). Cut: kept < least(count - after, L)."""
    lengths = cfg.loader.capped(cfg.model.sequence_lengths())
    terms = []
    for event_type, (seq, count) in SEQUENCE_COLUMNS.items():
        after = f"size(filter(s.{seq}, e -> e.event_time >= b.impression_time))"
        terms.append(f"size(s.{seq}) - {after} < least(s.{count} - {after}, {lengths.max_length(event_type)})")
    return _any_of(terms)


def snapshot_days(examples: DataFrame) -> list[str]:
    """The sequence snapshot days (sequence_ds) the examples read, sorted: the partitions of
    silver.user_sequences `with_snapshot_checks` needs."""
    return sorted(str(r["sequence_ds"]) for r in examples.select("sequence_ds").distinct().collect())


# The examples columns the suite's rules read: the batch keeps only these (the ~120 feature columns
# of a range of days would dominate the cached batch and no rule reads them).
EXAMPLE_RULE_COLUMNS = ("ds", "surface", "impression_id", "impression_time", "user_id", "sequence_ds", "features_ds",
                        "attributed_conversions", *LABEL_COLUMNS.values())


def with_snapshot_checks(examples: DataFrame, sequences: DataFrame, cfg: GemConfig) -> DataFrame:
    """`examples`' EXAMPLE_RULE_COLUMNS with the two columns the snapshot rules read, from their
    snapshot rows in `sequences` (silver.user_sequences): `snapshot_found` (the (user_id,
    sequence_ds) row exists) and `prefix_cut` (the cap cut the prefix the model reads).

    `sequences` is read only at `snapshot_days(examples)`: a static partition filter, so a
    validation reads the day or two its examples point at, not every day of the pipeline's history.
    The snapshot rows stream past
    the examples' keys, broadcast (four narrow columns), so the arrays are never shuffled: a range
    of days reads GBs of them. The batch is validated cached, so the join and the per-element scans
    run once, not once per rule."""
    days = [F.lit(d).cast("date") for d in snapshot_days(examples)]
    columns = [c for pair in SEQUENCE_COLUMNS.values() for c in pair]
    s = sequences.where(F.col("ds").isin(days) if days else F.lit(False)).select("ds", "user_id", *columns).alias("s")
    b = examples.select("impression_id", "user_id", "sequence_ds", "impression_time").alias("b")
    matched = s.join(F.broadcast(b), (F.col("s.ds") == F.col("b.sequence_ds")) & (F.col("s.user_id") == F.col("b.user_id")))
    checks = matched.select(F.col("b.impression_id").alias("impression_id"), F.lit(True).alias("snapshot_found"),
                            F.coalesce(F.expr(_prefix_cut(cfg)), F.lit(False)).alias("prefix_cut"))
    return examples.select(*EXAMPLE_RULE_COLUMNS).join(checks, "impression_id", "left").select(
        *EXAMPLE_RULE_COLUMNS,
        F.coalesce("snapshot_found", F.lit(False)).alias("snapshot_found"),
        F.coalesce("prefix_cut", F.lit(False)).alias("prefix_cut"),
    )


def example_expectations(cfg: GemConfig) -> list[Expectation]:
    """The examples suite, over a batch of `with_snapshot_checks(examples, ...)`."""
    surfaces = ", ".join(f"'{s}'" for s in cfg.surfaces)
    contract = contract_setting(SILVER_TRAINING_EXAMPLES)
    out = [_unique("one_row_per_impression", "impression_id", contract)]
    for label_type in cfg.label_types:
        col, bounds = LABEL_COLUMNS[label_type], cfg.quality.label_rates[label_type]
        middle = (bounds.min + bounds.max) / 2  # the group furthest from the range first
        out.append(_groups_breaking(
            f"label_rate:{label_type}",
            f"SELECT ds, surface, avg({col}) AS rate, count(*) AS examples FROM {{batch}} "
            f"WHERE surface IN ({surfaces}) GROUP BY ds, surface "
            f"HAVING avg({col}) < {bounds.min} OR avg({col}) > {bounds.max} ORDER BY abs(avg({col}) - {middle}) DESC",
            f"quality.label_rates.{label_type}", f"a surface's {label_type} rate of a day {bound_text(bounds.min, bounds.max)}",
            "rate",
        ))
    click = LABEL_COLUMNS["click"]
    conversion_labels = [c for t, c in LABEL_COLUMNS.items() if t != "click"]
    snapshot_key = "impression_id, user_id, sequence_ds"
    rate = cfg.quality.max_sequence_cut_rate
    cut_setting = "quality.max_sequence_cut_rate (or raise sequence_caps, so fewer prefixes are cut)"
    out += [
        _rows_breaking("conversion_label_implies_click",
                       f"{click} = 0 AND ({' + '.join(conversion_labels)}) > 0", contract, select="impression_id"),
        _rows_breaking("attributed_at_least_labels",
                       f"attributed_conversions < {' + '.join(conversion_labels)}", contract, select="impression_id"),
        _rows_breaking("features_of_impression_day", "features_ds <> to_date(impression_time) OR features_ds > ds",
                       contract, select="impression_id"),
        _rows_breaking("sequence_snapshot_exists", "NOT snapshot_found", contract, select=snapshot_key),
        # Counted: every example whose prefix was cut, listed in the Data Docs.
        _rows_breaking("sequence_prefix_cut_by_cap", "prefix_cut", "sequence_caps", critical=False, select=snapshot_key),
        # Loud: a day where more than the allowed share was cut (raise sequence_caps).
        _groups_breaking("sequence_prefix_cut_rate",
                         "SELECT ds, count_if(prefix_cut) / count(*) AS cut_rate, count_if(prefix_cut) AS cut_examples, "
                         f"count(*) AS examples FROM {{batch}} GROUP BY ds HAVING count_if(prefix_cut) > {rate} * count(*) "
                         "ORDER BY cut_rate DESC",
                         cut_setting, f"at most {rate} of a day's examples with a prefix the cap cut", "cut_rate"),
    ]
    return out

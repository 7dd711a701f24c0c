"""silver.user_features and silver.ad_features: point-in-time engagement counters per user and per ad.

Point in time: partition ds=D holds counters AS OF THE END OF D-1. Nothing from day D is in it, so
day D's impressions can join their ds=D feature rows without leaking their own outcome.

Windows are by EVENT TIME: the w-day window of ds=D is event_time in [D-w 00:00 UTC, D 00:00 UTC),
for w in WINDOW_DAYS. An event counts only once it is KNOWN at the end of D-1, i.e. it arrived
(bronze `ds`, the arrival day) on or before D-1. A late event whose event_time is on D-1 but which
arrived on D does NOT count for ds=D (it counts from ds=D+1 on, while inside the window).

A lake younger than a window: no arrival day before the pipeline's start_ds is read, so the w-day
window of ds=D holds min(w, D - start_ds) days' events. The counts stay what they are, facts of the
lake; the model's encoder reads them as full-window estimates (gem.data.encode.dense_matrix).

Rows: one per user (per ad) with at least one event of any type in the 28-day window.

Per-surface counters are plain columns, one per (surface, metric, window), derived from the surface
vocabulary schemas.tasks.SURFACES (never from cfg.surfaces, so every config shares this one table
definition; surfaces a config does not train on are still counted, they are facts about the data).
Plain columns, unlike a map<surface, struct>, are typed one by one, read by name, and covered by the
table's CHECK (all counters >= 0).

Column names (see `counter_name`):
    impressions_7d            all surfaces, 7-day window
    reels_clicks_28d          surface "reels", 28-day window
    ctr_1d = clicks_1d / impressions_1d          (null when impressions_1d = 0)
    cvr_1d = conversions_1d / clicks_1d          (null when clicks_1d = 0)

Ratios are not capped at 1: a window starts at midnight, so a click just after the window start
can count while its impression, a second earlier, does not (clicks_7d > impressions_7d is possible
for a user with little traffic at the window's edge).

Example silver.ad_features row (most counter columns left out):
    {"ds": 2026-01-08, "ad_id": "a7", "advertiser_id": "adv3", "campaign_id": "c12",
     "objective": "sales", "creative_type": "video", "impressions_1d": 40, "clicks_1d": 2,
     "conversions_1d": 1, "ctr_1d": 0.05, "cvr_1d": 0.5, ..., "reels_impressions_28d": 310, ...}
"""

from __future__ import annotations

from schemas.table import Column, TableSchema
from schemas.tasks import CREATIVE_TYPES, OBJECTIVES, SURFACES

# Window lengths in days; each window ends at the start of the partition day ds.
WINDOW_DAYS: tuple[int, ...] = (1, 7, 28)

# bronze event_type -> the counter metric that counts it.
COUNT_METRICS: dict[str, str] = {"impression": "impressions", "click": "clicks", "conversion": "conversions"}

# ratio metric -> (numerator metric, denominator metric).
RATE_METRICS: dict[str, tuple[str, str]] = {"ctr": ("clicks", "impressions"), "cvr": ("conversions", "clicks")}

# None is the all-surfaces scope; then one scope per surface of the vocabulary.
SCOPES: tuple[str | None, ...] = (None,) + SURFACES

# Ad attributes carried on silver.ad_features: the latest value seen (by event_time) up to the end of ds-1.
AD_METADATA_COLUMNS: tuple[str, ...] = ("advertiser_id", "campaign_id", "objective", "creative_type")


def counter_name(metric: str, window_days: int, surface: str | None = None) -> str:
    """('clicks', 7) -> 'clicks_7d'; ('ctr', 28, 'reels') -> 'reels_ctr_28d'."""
    base = f"{metric}_{window_days}d"
    return base if surface is None else f"{surface}_{base}"


def _counter_columns() -> tuple[Column, ...]:
    """Every counter column, grouped by window, then scope (all first), then metric."""
    cols: list[Column] = []
    for w in WINDOW_DAYS:
        for surface in SCOPES:
            where = "all surfaces" if surface is None else f"surface {surface}"
            for metric in COUNT_METRICS.values():
                cols.append(
                    Column(counter_name(metric, w, surface), "long", nullable=False,
                           doc=f"{metric}, {where}, event_time in the {w} days before ds")
                )
            for rate, (num, den) in RATE_METRICS.items():
                cols.append(
                    Column(counter_name(rate, w, surface), "double",
                           doc=f"{num} / {den}, {where}, {w}-day window; null when {den} = 0")
                )
    return tuple(cols)


COUNTER_COLUMNS: tuple[Column, ...] = _counter_columns()


def _counters_non_negative() -> tuple[str, str]:
    """One table-level CHECK over every counter column, e.g. "impressions_1d >= 0 AND ... AND
    coalesce(ctr_1d, 0) >= 0 AND ...".

    Why one CHECK rather than `min=0` per column: Delta adds constraints one commit at a time, so
    ~100 per-column constraints make creating each table take minutes.
    """
    terms = [f"coalesce({c.name}, 0) >= 0" if c.nullable else f"{c.name} >= 0" for c in COUNTER_COLUMNS]
    return ("counters_non_negative", " AND ".join(terms))

SILVER_USER_FEATURES = TableSchema(
    name="silver.user_features",
    writer="spark",
    doc=(
        "Per-user impression/click/conversion counters and CTR/CVR over 1/7/28-day event-time windows, "
        "overall and per surface, as of the end of ds-1 (events arrived by then)."
    ),
    columns=(
        Column("ds", "date", nullable=False, doc="day these features serve; counters end at ds 00:00 UTC"),
        Column("user_id", "string", nullable=False, personal=True),
    )
    + COUNTER_COLUMNS,
    partition_by=("ds",),
    key=("ds", "user_id"),
    checks=(_counters_non_negative(),),
)

SILVER_AD_FEATURES = TableSchema(
    name="silver.ad_features",
    writer="spark",
    doc=(
        "Per-ad counters as in silver.user_features, plus the ad's latest attributes seen up to the end of ds-1."
    ),
    columns=(
        Column("ds", "date", nullable=False, doc="day these features serve; counters end at ds 00:00 UTC"),
        Column("ad_id", "string", nullable=False),
        Column("advertiser_id", "string", nullable=False, doc="latest seen by event_time before ds"),
        Column("campaign_id", "string", nullable=False, doc="latest seen by event_time before ds"),
        Column("objective", "string", nullable=False, allowed=OBJECTIVES, doc="latest seen before ds"),
        Column("creative_type", "string", nullable=False, allowed=CREATIVE_TYPES, doc="latest seen before ds"),
    )
    + COUNTER_COLUMNS,
    partition_by=("ds",),
    key=("ds", "ad_id"),
    checks=(_counters_non_negative(),),
)


# --------------------------------------------------------------------------------------------------
# Daily counts: build_features' own state, one partition per bronze arrival day. No CHECK
# constraints (each costs a commit at creation); the feature tables built from them carry them.
#
# Partition ds=A holds, per entity and EVENT day, the counts of the events that ARRIVED on A (late
# events keep their own event day, so a window by event time can still be cut exactly). Any window
# of silver.user_features / silver.ad_features is a sum of these rows, and a day's update is the
# previous day's counters plus the rows entering the windows minus the rows leaving them.


def daily_count_name(metric: str, surface: str) -> str:
    """('clicks', 'reels') -> 'reels_clicks'."""
    return f"{surface}_{metric}"


DAILY_COUNT_COLUMNS: tuple[Column, ...] = tuple(
    Column(daily_count_name(metric, surface), "long", nullable=False,
           doc=f"{metric} on surface {surface} with this event_day, arrived on ds")
    for surface in SURFACES
    for metric in COUNT_METRICS.values()
)

_DAILY_KEY_COLUMNS = (
    Column("ds", "date", nullable=False, doc="arrival day (bronze ds) of the events counted"),
    Column("event_day", "date", nullable=False, doc="UTC day of the events' event_time; <= ds"),
)

SILVER_USER_DAILY_COUNTS = TableSchema(
    name="silver.user_daily_counts",
    writer="spark",
    doc="Per user and event day, the events that arrived on ds, counted per surface and event type.",
    columns=_DAILY_KEY_COLUMNS[:1] + (Column("user_id", "string", nullable=False, personal=True),) + _DAILY_KEY_COLUMNS[1:]
    + DAILY_COUNT_COLUMNS,
    partition_by=("ds",),
    key=("ds", "user_id", "event_day"),
)

SILVER_AD_DAILY_COUNTS = TableSchema(
    name="silver.ad_daily_counts",
    writer="spark",
    doc=(
        "Per ad and event day, the events that arrived on ds, counted per surface and event type, with "
        "the attributes of the latest of them (by event_time, then event_id)."
    ),
    columns=_DAILY_KEY_COLUMNS[:1] + (Column("ad_id", "string", nullable=False),) + _DAILY_KEY_COLUMNS[1:]
    + (
        Column("latest_event_time", "timestamp", nullable=False, doc="event_time of the latest event counted"),
        Column("latest_event_id", "string", nullable=False, doc="its event_id (breaks event_time ties)"),
        Column("advertiser_id", "string", nullable=False, doc="on the latest event"),
        Column("campaign_id", "string", nullable=False, doc="on the latest event"),
        Column("objective", "string", nullable=False, doc="on the latest event"),
        Column("creative_type", "string", nullable=False, doc="on the latest event"),
    )
    + DAILY_COUNT_COLUMNS,
    partition_by=("ds",),
    key=("ds", "ad_id", "event_day"),
)

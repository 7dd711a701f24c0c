"""Ad events: the landing contract (JSON lines), bronze.ad_events, and bronze.quarantine.

Landing files hold one JSON object per line, gzip-compressed, one folder per arrival day:
`{landing_root}/ds=YYYY-MM-DD/*.json.gz`. `event_time` is epoch milliseconds (UTC). Bronze is the
typed, deduplicated copy, partitioned by arrival day `ds` and `surface`; every landing line that
does not make it into bronze is in bronze.quarantine with a reason.

Example landing line (an impression):
    {"event_id": "e-2026-01-01-000000000001", "event_type": "impression", "event_time": 1767225600000,
     "user_id": "u42", "ad_id": "a7", "advertiser_id": "adv3", "campaign_id": "c12",
     "objective": "sales", "creative_type": "video", "surface": "reels", "position": 2,
     "conversion_type": null, "user_attrs": {"age": "25-34"}}
"""

from __future__ import annotations

from schemas.table import Column, TableSchema
from schemas.tasks import CONVERSION_TYPES, CREATIVE_TYPES, EVENT_TYPES, OBJECTIVES, SURFACES

# Ids that must be present and non-empty in every valid row.
ID_COLUMNS: tuple[str, ...] = ("event_id", "user_id", "ad_id", "advertiser_id", "campaign_id")

LANDING_EVENTS = TableSchema(
    name="landing.ad_events",
    writer=None,  # JSON lines files the producers write, not a Delta table
    doc="One JSON object per line; nullable=False marks fields a valid row must carry.",
    columns=(
        Column("event_id", "string", nullable=False, doc="globally unique event id"),
        Column("event_type", "string", nullable=False, allowed=EVENT_TYPES),
        Column("event_time", "long", nullable=False, doc="epoch milliseconds, UTC"),
        Column("user_id", "string", nullable=False, personal=True),
        Column("ad_id", "string", nullable=False),
        Column("advertiser_id", "string", nullable=False),
        Column("campaign_id", "string", nullable=False),
        Column("objective", "string", nullable=False, allowed=OBJECTIVES),
        Column("creative_type", "string", nullable=False, allowed=CREATIVE_TYPES),
        Column("surface", "string", nullable=False, allowed=SURFACES),
        Column("position", "int", min=0, doc="slot position on the surface; null for conversions"),
        Column("conversion_type", "string", allowed=CONVERSION_TYPES, doc="set on conversions only"),
        Column("user_attrs", "map<string,string>", personal=True, doc="user demographics, free-form keys"),
    ),
)

_TYPED_OVERRIDES = {"event_time": Column("event_time", "timestamp", nullable=False, doc="UTC")}

BRONZE_AD_EVENTS = TableSchema(
    name="bronze.ad_events",
    writer="spark",
    doc="Typed, deduplicated landing events; ds is the arrival day.",
    columns=tuple(_TYPED_OVERRIDES.get(c.name, c) for c in LANDING_EVENTS.columns)
    + (Column("ds", "date", nullable=False, doc="arrival day (landing partition)"),),
    partition_by=("ds", "surface"),
    key=("event_id",),
    checks=(
        ("conversion_type_iff_conversion", "(event_type = 'conversion') = (conversion_type IS NOT NULL)"),
        ("ids_not_empty", " AND ".join(f"length({c}) > 0" for c in ID_COLUMNS)),
    ),
)

# Why every line of a landing file was quarantined, checked before any line rule: the file's gzip
# stream is damaged (its readable lines are kept; see gem.lakehouse.landing.gzip_problem), or its
# name does not match the landing contract's data-file pattern (gem.lakehouse.landing.DATA_FILE_PATTERN).
FILE_REASONS: tuple[str, ...] = ("unreadable_file", "unexpected_file_name")

# Why a landing line was quarantined, in the order ingest checks them (first failing rule wins).
LINE_REASONS: tuple[str, ...] = (
    "malformed_json",
    "unexpected_column",
    "wrong_type",  # incl. an id that is a JSON number, object or array instead of a string
    "missing_id",
    "missing_field",
    "unknown_surface",
    "invalid_value",
    "negative_timestamp",
    "stale_timestamp",  # more than ingest.max_event_lag_days before the arrival day (e.g. seconds, not ms)
    "far_future_timestamp",
    "event_after_arrival",
    "duplicate_event_id",
)

QUARANTINE_REASONS: tuple[str, ...] = FILE_REASONS + LINE_REASONS

BRONZE_QUARANTINE = TableSchema(
    name="bronze.quarantine",
    writer="spark",
    doc="Every landing line not written to bronze.ad_events, verbatim, with the first failed rule.",
    columns=(
        Column("ds", "date", nullable=False, doc="arrival day the line came in"),
        Column("reason", "string", nullable=False, allowed=QUARANTINE_REASONS),
        Column("detail", "string", doc="which field or value broke the rule"),
        Column("source_file", "string", nullable=False, doc="landing file name within the ds folder"),
        Column("raw_line", "string", nullable=False, personal=True, doc="verbatim; of an unreadable file, a line read before the damage"),
    ),
    partition_by=("ds",),
)

# Dirty-row kinds the synthetic generator plants, and the quarantine reason ingest must give each.
DIRTY_KIND_REASON: dict[str, str] = {
    "malformed_json": "malformed_json",
    "wrong_type": "wrong_type",
    "null_id": "missing_id",
    "empty_id": "missing_id",
    "unknown_surface": "unknown_surface",
    "negative_timestamp": "negative_timestamp",
    "far_future_timestamp": "far_future_timestamp",
    "event_after_arrival": "event_after_arrival",
    "duplicate_event_id": "duplicate_event_id",
}

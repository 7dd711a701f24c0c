"""silver.user_sequences: each user's recent ad events per event type, as capped, ordered arrays.

Layout ("unchanged users cost no work"): partition ds=D holds ONLY the users that had at least one
event in bronze.ad_events ds=D (arrival day), each with their full capped sequences as of the end
of D (every event that arrived on or before D). Users without events on D get no row in ds=D.

Reading a snapshot: a user's sequences as of day D are their row with the greatest ds <= D
(no such row: the user has no events up to D). In Spark:

    rows = spark.read.format("delta").load(path).where(f"ds <= DATE'{D}'")
    w = Window.partitionBy("user_id").orderBy(F.col("ds").desc())
    snapshot = rows.withColumn("_r", F.row_number().over(w)).where("_r = 1").drop("_r")

Each sequence is an array of structs ordered by (event_time, event_id) ascending, i.e. oldest
first, holding only the most recent `cfg.sequence_caps.<type>` events of that type. Example
element of `impressions` / `clicks`:

    {"event_time": 2026-01-01 01:00:00, "event_id": "e-2026-01-01-000000000001", "ad_id": "a7",
     "advertiser_id": "adv3", "campaign_id": "c12", "surface": "reels", "objective": "sales"}

`conversions` elements carry one more field, "conversion_type": "lead". Every element ends with
its ids hashed (schemas/ids.py): "ad_id_hash", "advertiser_id_hash", "campaign_id_hash". Events that arrive
late (event_time earlier than events already in a sequence) sit at their event_time position.

`n_impressions` / `n_clicks` / `n_conversions` count all of the user's events of that type up to
the end of ds (not capped), so size(impressions) = min(n_impressions, cap).
"""

from __future__ import annotations

from schemas.ids import hash_column
from schemas.table import Column, TableSchema

# event_time then event_id come first: Spark orders structs field by field, so sort_array over
# these structs sorts by event time with the event id as a deterministic tie-break.
_EVENT_FIELDS: tuple[tuple[str, str], ...] = (
    ("event_time", "timestamp"),
    ("event_id", "string"),
    ("ad_id", "string"),
    ("advertiser_id", "string"),
    ("campaign_id", "string"),
    ("surface", "string"),
    ("objective", "string"),
)
_CONVERSION_FIELDS: tuple[tuple[str, str], ...] = _EVENT_FIELDS + (("conversion_type", "string"),)
# Ids an element also carries hashed (schemas/ids.py), as the last fields of its struct: the loader
# reads these, never the strings.
ELEMENT_ID_HASHES: tuple[str, ...] = ("ad_id", "advertiser_id", "campaign_id")
_HASH_FIELDS: tuple[tuple[str, str], ...] = tuple((hash_column(c), "long") for c in ELEMENT_ID_HASHES)

# Field names of one sequence element per event type copied from bronze (bronze column names, in
# struct order); the struct then ends with the ELEMENT_ID_HASHES fields.
SEQUENCE_FIELDS: dict[str, tuple[str, ...]] = {
    "impression": tuple(name for name, _ in _EVENT_FIELDS),
    "click": tuple(name for name, _ in _EVENT_FIELDS),
    "conversion": tuple(name for name, _ in _CONVERSION_FIELDS),
}

# event type (bronze event_type value) -> (sequence column, count column).
SEQUENCE_COLUMNS: dict[str, tuple[str, str]] = {
    "impression": ("impressions", "n_impressions"),
    "click": ("clicks", "n_clicks"),
    "conversion": ("conversions", "n_conversions"),
}


def _array_of_struct(fields: tuple[tuple[str, str], ...]) -> str:
    return "array<struct<" + ",".join(f"{name}:{dtype}" for name, dtype in fields) + ">>"


_SEQUENCE_STATE_COLUMNS: tuple[Column, ...] = (
    Column("user_id", "string", nullable=False, personal=True),
    Column("impressions", _array_of_struct(_EVENT_FIELDS + _HASH_FIELDS), nullable=False, doc="oldest first, capped"),
    Column("clicks", _array_of_struct(_EVENT_FIELDS + _HASH_FIELDS), nullable=False, doc="oldest first, capped"),
    Column("conversions", _array_of_struct(_CONVERSION_FIELDS + _HASH_FIELDS), nullable=False,
           doc="oldest first, capped"),
    Column("n_impressions", "long", nullable=False, min=0, doc="all impressions up to ds, uncapped"),
    Column("n_clicks", "long", nullable=False, min=0, doc="all clicks up to ds, uncapped"),
    Column("n_conversions", "long", nullable=False, min=0, doc="all conversions up to ds, uncapped"),
    Column("last_event_time", "timestamp", nullable=False, doc="latest event_time of any type up to ds"),
)

SILVER_USER_SEQUENCES = TableSchema(
    name="silver.user_sequences",
    writer="spark",
    doc=(
        "Per-user capped event sequences; ds=D holds only users with events arriving on D, with "
        "their sequences as of the end of D. A user's snapshot for D is their row with the greatest ds <= D."
    ),
    columns=(
        Column("ds", "date", nullable=False, doc="arrival day whose events this row includes last"),
        *_SEQUENCE_STATE_COLUMNS,
    ),
    partition_by=("ds",),
    key=("ds", "user_id"),
)

# Compaction, so the daily build reads a bounded history: every `sequence_compaction_days` days
# build_sequences also writes ds=D here, EVERY user's snapshot as of the end of D (their
# user_sequences row with the greatest ds <= D, same columns). Day D's build then reads the last
# compaction before D plus the daily partitions after it, never the whole history: its lookup scans
# at most (users + compaction_days x daily active users) rows, however many days have passed.
# Readers of snapshots (the loader) keep reading user_sequences; this table only serves the build.
SILVER_USER_SEQUENCES_COMPACTED = TableSchema(
    name="silver.user_sequences_compacted",
    writer="spark",
    doc=(
        "Every user's silver.user_sequences snapshot as of the end of ds, written on compaction days; "
        "build_sequences reads the latest one before its day instead of every earlier partition."
    ),
    columns=(
        Column("ds", "date", nullable=False, doc="the compaction day: snapshots as of its end"),
        *_SEQUENCE_STATE_COLUMNS,
    ),
    partition_by=("ds",),
    key=("ds", "user_id"),
)

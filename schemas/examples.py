"""silver.training_examples, silver.attribution_quarantine and silver.click_quarantine: one row per
impression, labelled; the conversions and clicks that label nothing, each with its reason.

An example is an impression that arrived on day ds (bronze.ad_events ds), assembled on
ds + attribution_window_days, once every label it can get is known. It holds:

  * the impression: id, user, ad and its attributes, surface, position, impression_time;
  * labels per label type (schemas.tasks.LABEL_TYPES), 0 or 1:
      label_click             the impression was clicked: some click links to it (below);
      label_<conversion type> a conversion of that type is attributed to one of its clicks;
    the task of a label is (the row's surface, the label type);
  * point-in-time features: the user's and the ad's counters of silver.user_features /
    silver.ad_features at features_ds = the impression's event day, i.e. as of the end of the day
    BEFORE the impression (prefixed `user_` / `ad_`; an entity with no events in the 28 days
    before gets counters 0 and rates null);
  * where to read the user's sequences: (user_id, sequence_ds) in silver.user_sequences. Sequences
    are never copied here: the loader materializes them late (below).

Linking, by event time (gem/silver/examples.py holds the one implementation):
  click -> impression: the user's latest impression of the same ad on the same surface at or
      before the click and at most `click_window_minutes` before it, among impressions that had
      arrived by the click's arrival day.
  conversion -> click (last-click attribution): the user's latest click on the same ad at or before
      the conversion, on the conversion's day or up to `attribution_window_days` days earlier,
      among clicks that had arrived by the conversion's arrival day.
  A conversion labels the impression its click links to iff it ARRIVED by that impression's
  ds + attribution_window_days (so with a 7-day window a conversion arriving on D+7 counts for
  an impression of D, one arriving on D+8 counts nowhere).
  Each decision belongs to one day (an impression's labels to its arrival day, a conversion's
  outcome and a click's quarantine to theirs) and sees only impressions and clicks that arrived on
  or after that day - 2 * attribution_window_days - 1, the first day that day's own run reads; so a
  run over a range of days decides every event exactly as the runs of its days one by one would
  (it changes nothing for events that arrive on time; only very late ones meet the cut).

Every conversion is accounted for exactly once, by the assembly whose ds is the conversion's arrival
day: it is either attributed (to an impression of ds - window .. ds) or written to
silver.attribution_quarantine with one reason (ATTRIBUTION_REASONS, first matching wins).
Every click likewise, by the assembly whose ds is its arrival day: it links to an impression (and
labels it) or is written to silver.click_quarantine (CLICK_REASONS), never dropped uncounted.

Late materialization and caps. sequence_ds is the day of the impression's arrival: build_sequences
wrote a row for every user with an event arriving that day, holding the user's capped sequences as
of the END of that day. The loader keeps the elements with event_time strictly before
impression_time. Because the snapshot is taken after the impression, events of the same day that
come AFTER the impression occupy some of the cap: if the user had k events of a type after the
impression on that day, the snapshot keeps only cap - k of the events before it (when the user has
more than cap - k of them). The silver data-quality suites measure this two ways: a warning with
the margin per type (cap minus the most events of that type a user has in one day) when a day's
busiest user leaves less than `quality.min_sequence_margin` of a cap; and, on the examples, every
example whose prefix the cap actually cut below what the model reads is counted (a warning listing
them), and the day FAILS (no validate_examples record) when more than
`quality.max_sequence_cut_rate` of its examples were cut (gem/quality/silver.py).
"""

from __future__ import annotations

from schemas.events import BRONZE_AD_EVENTS
from schemas.features import COUNTER_COLUMNS
from schemas.ids import HASHED_IDS, hash_column
from schemas.table import Column, TableSchema
from schemas.tasks import CONVERSION_TYPES, LABEL_TYPES, SURFACES

# Label type -> its 0/1 column.
LABEL_COLUMNS: dict[str, str] = {label_type: f"label_{label_type}" for label_type in LABEL_TYPES}

# Why a conversion is not attributed, in the order they are checked (first matching wins).
ATTRIBUTION_REASONS: tuple[str, ...] = (
    # arrived more than the window after its own event day: no impression's window can include it.
    "arrived_after_window",
    # the user has no click on the ad at or before it within the window.
    "no_click_in_window",
    # its last click links to no impression (none within click_window_minutes before the click).
    "click_without_impression",
    # its click's impression arrived earlier than the conversion's arrival day minus the window.
    "after_impression_window",
)

# Why a click labels no impression.
CLICK_REASONS: tuple[str, ...] = (
    # no impression of the ad to the user on the surface within click_window_minutes before it,
    # among the impressions that had arrived by the click's arrival day.
    "no_impression_in_click_window",
)

IMPRESSION_ATTRIBUTES: tuple[str, ...] = (
    "user_id", "ad_id", "advertiser_id", "campaign_id", "objective", "creative_type", "position",
)
USER_FEATURE_PREFIX = "user_"
AD_FEATURE_PREFIX = "ad_"


def _prefixed(prefix: str, owner: str) -> tuple[Column, ...]:
    return tuple(
        Column(f"{prefix}{c.name}", c.dtype, c.nullable, doc=f"{owner} {c.doc}") for c in COUNTER_COLUMNS
    )


def _labels_are_binary() -> tuple[str, str]:
    return ("labels_binary", " AND ".join(f"{c} IN (0, 1)" for c in LABEL_COLUMNS.values()))


SILVER_TRAINING_EXAMPLES = TableSchema(
    name="silver.training_examples",
    writer="spark",
    doc="One row per impression with labels per label type, point-in-time features and its sequence snapshot key.",
    columns=(
        Column("ds", "date", nullable=False, doc="arrival day of the impression"),
        Column("surface", "string", nullable=False, allowed=SURFACES),
        Column("impression_id", "string", nullable=False, doc="bronze event_id of the impression"),
        Column("impression_time", "timestamp", nullable=False, doc="UTC; sequences are cut strictly before it"),
        # The impression's own attributes, defined once in the event contract.
        *(BRONZE_AD_EVENTS.column(c) for c in IMPRESSION_ATTRIBUTES),
        # What the model embeds of each free-form id, hashed where the row is written (schemas/ids.py).
        *(Column(hash_column(c), "long", nullable=False, min=0, personal=BRONZE_AD_EVENTS.column(c).personal,
                 doc=f"id_hash({c}), schemas/ids.py") for c in HASHED_IDS),
        Column("sequence_ds", "date", nullable=False, doc="silver.user_sequences partition holding the user's row"),
        Column("features_ds", "date", nullable=False, doc="silver.*_features partition joined: the impression's day"),
    )
    + tuple(Column(c, "int", nullable=False, doc=f"1 iff the impression got a {t}") for t, c in LABEL_COLUMNS.items())
    + (
        Column("attributed_conversions", "int", nullable=False, min=0, doc="conversions attributed, all types"),
    )
    + _prefixed(USER_FEATURE_PREFIX, "user's")
    + _prefixed(AD_FEATURE_PREFIX, "ad's"),
    partition_by=("ds", "surface"),
    key=("impression_id",),
    checks=(_labels_are_binary(),),
)

SILVER_ATTRIBUTION_QUARANTINE = TableSchema(
    name="silver.attribution_quarantine",
    writer="spark",
    doc="Conversions no impression's label counts, with the reason; ds is the conversion's arrival day.",
    columns=(
        Column("ds", "date", nullable=False, doc="arrival day of the conversion"),
        Column("reason", "string", nullable=False, allowed=ATTRIBUTION_REASONS),
        Column("conversion_id", "string", nullable=False),
        Column("conversion_time", "timestamp", nullable=False),
        Column("conversion_type", "string", nullable=False, allowed=CONVERSION_TYPES),
        Column("user_id", "string", nullable=False, personal=True),
        Column("ad_id", "string", nullable=False),
        Column("click_id", "string", doc="the last click found, if any"),
        Column("impression_id", "string", doc="the click's impression, if any"),
    ),
    partition_by=("ds",),
    key=("conversion_id",),
)

SILVER_CLICK_QUARANTINE = TableSchema(
    name="silver.click_quarantine",
    writer="spark",
    doc="Clicks no impression's label counts, with the reason; ds is the click's arrival day.",
    columns=(
        Column("ds", "date", nullable=False, doc="arrival day of the click"),
        Column("reason", "string", nullable=False, allowed=CLICK_REASONS),
        Column("click_id", "string", nullable=False),
        Column("click_time", "timestamp", nullable=False),
        Column("user_id", "string", nullable=False, personal=True),
        Column("ad_id", "string", nullable=False),
    ),
    partition_by=("ds",),
    key=("click_id",),
)

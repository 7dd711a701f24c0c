"""Landing lines -> each line's typed fields and the first quarantine rule it breaks (or none)."""

from __future__ import annotations

from pyspark.sql import Column as SparkColumn
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from gem.config import GemConfig
from schemas.events import FILE_REASONS, ID_COLUMNS, LANDING_EVENTS
from schemas.table import Column

DAY_MS = 86_400_000


def _variant_schema() -> str:
    # Every landing field as a VARIANT: it keeps the JSON type of the value (a string field's typed
    # parse turns the number 12345 and the object {"id": 7} into the strings "12345" and '{"id":7}').
    return ", ".join(f"`{c.name}` VARIANT" for c in LANDING_EVENTS.columns)


def _typed_schema() -> str:
    return ", ".join(f"`{c.name}` {c.sql_type}" for c in LANDING_EVENTS.columns)


def _violates_domain(col: Column) -> SparkColumn | None:
    """True where a non-null value breaks the column's allowed set or range."""
    v = F.col(f"t.{col.name}")
    bad = None
    if col.allowed is not None:
        bad = ~v.isin(list(col.allowed))
    if col.min is not None:
        bad = (v < col.min) if bad is None else (bad | (v < col.min))
    if col.max is not None:
        bad = (v > col.max) if bad is None else (bad | (v > col.max))
    return None if bad is None else (v.isNotNull() & bad)


def _first_name(conditions: list[tuple[str, SparkColumn]]) -> SparkColumn:
    """Comma-joined names whose condition holds (null when none): the `detail` of a rule."""
    names = F.array(*[F.when(cond, F.lit(name)) for name, cond in conditions])
    hits = F.filter(names, lambda x: x.isNotNull())
    return F.when(F.size(hits) > 0, F.array_join(hits, ","))


def classify(lines: DataFrame, cfg: GemConfig) -> DataFrame:
    """(value, source_file, ds) -> one row per line with `reason`/`detail` (null when the line is good),
    the typed landing fields under struct `t`, and `unexpected_keys` / `wrong_type_cols` for drift.

    Rules, first failing wins (schemas.events.QUARANTINE_REASONS order): the file's own reason
    (`file_reason`, set by read_days for a damaged or misnamed file; optional column), then per line:
    malformed_json, unexpected_column, wrong_type (a value of another JSON type, e.g. an id that is
    a number, object or array), missing_id, missing_field, unknown_surface, invalid_value,
    negative_timestamp, stale_timestamp (more than ingest.max_event_lag_days before ds, e.g. epoch
    seconds read as milliseconds), far_future_timestamp, event_after_arrival. The time rules
    read each line's own arrival day `ds`, so one expression classifies any number of days.
    Duplicates need every copy of an id and come after, in `mark_duplicates`.
    """
    known = [c.name for c in LANDING_EVENTS.columns]
    day_start_ms = F.unix_date(F.col("ds")).cast("long") * DAY_MS  # 00:00 UTC of the arrival day
    day_end_ms = day_start_ms + DAY_MS
    far_future_ms = day_end_ms + cfg.ingest.far_future_days * DAY_MS
    stale_ms = day_start_ms - cfg.ingest.max_event_lag_days * DAY_MS

    if "file_reason" not in lines.columns:
        lines = lines.select("*", *[F.lit(None).cast("string").alias(c) for c in ("file_reason", "file_detail")])
    df = lines.select(
        "value",
        "source_file",
        "ds",
        "file_reason",
        "file_detail",
        F.expr("json_object_keys(value)").alias("keys"),
        F.from_json("value", _variant_schema()).alias("v"),
        F.from_json("value", _typed_schema()).alias("t"),
    )
    df = df.withColumn("unexpected_keys", F.filter("keys", lambda k: ~k.isin(known)))

    def wrong_type(c: Column) -> SparkColumn:
        v = F.col(f"v.{c.name}")
        present = v.isNotNull() & ~F.is_variant_null(v)
        if c.dtype == "string":  # the typed parse would accept any JSON value as its text
            return present & (F.schema_of_variant(v) != F.lit("STRING"))
        return present & F.col(f"t.{c.name}").isNull()

    df = df.withColumn(
        "wrong_type_cols",
        F.filter(
            F.array(*[F.when(wrong_type(c), F.lit(c.name)) for c in LANDING_EVENTS.columns]),
            lambda x: x.isNotNull(),
        ),
    )

    t = lambda name: F.col(f"t.{name}")  # a short accessor keeps the rules readable
    missing_ids = [(c, t(c).isNull() | (F.length(F.trim(t(c))) == 0)) for c in ID_COLUMNS]
    required_other = [c.name for c in LANDING_EVENTS.columns if not c.nullable and c.name not in ID_COLUMNS]
    missing_fields = [(c, t(c).isNull()) for c in required_other]
    domain = [
        (c.name, F.coalesce(cond, F.lit(False)))
        for c in LANDING_EVENTS.columns
        if c.name != "surface" and (cond := _violates_domain(c)) is not None
    ]
    # A conversion must say which conversion it is; other events must not.
    iff = (t("event_type") == "conversion") != t("conversion_type").isNotNull()
    domain.append(("conversion_type", F.coalesce(iff, F.lit(False))))
    surface_bad = ~t("surface").isin(list(LANDING_EVENTS.column("surface").allowed or ()))

    # (reason, condition, detail); the conditions are evaluated once, as columns, before the
    # CASE chains read them (inlining them twice makes the plan much slower).
    event_time = t("event_time")
    stale_detail = F.concat(event_time.cast("string"), F.lit(" ms = "), F.timestamp_millis(event_time).cast("string"),
                            F.lit(f" UTC, more than ingest.max_event_lag_days={cfg.ingest.max_event_lag_days} "
                                  "days before ds="), F.col("ds").cast("string"))
    rules: list[tuple[str, SparkColumn, SparkColumn]] = [
        *[(reason, F.col("file_reason") == reason, F.col("file_detail")) for reason in FILE_REASONS],
        ("malformed_json", F.col("keys").isNull(), F.lit("not a JSON object")),
        ("unexpected_column", F.size("unexpected_keys") > 0, F.array_join("unexpected_keys", ",")),
        ("wrong_type", F.size("wrong_type_cols") > 0, F.array_join("wrong_type_cols", ",")),
        ("missing_id", F.exists(F.array(*[c for _, c in missing_ids]), lambda x: x), _first_name(missing_ids)),
        ("missing_field", F.exists(F.array(*[c for _, c in missing_fields]), lambda x: x), _first_name(missing_fields)),
        ("unknown_surface", surface_bad, t("surface")),
        ("invalid_value", F.exists(F.array(*[c for _, c in domain]), lambda x: x), _first_name(domain)),
        ("negative_timestamp", t("event_time") < 0, t("event_time").cast("string")),
        ("stale_timestamp", event_time < stale_ms, stale_detail),
        ("far_future_timestamp", t("event_time") >= far_future_ms, t("event_time").cast("string")),
        ("event_after_arrival", t("event_time") >= day_end_ms, t("event_time").cast("string")),
    ]
    df = df.select("*", *[F.coalesce(cond, F.lit(False)).alias(f"_is_{name}") for name, cond, _ in rules])
    reason = F.lit(None).cast("string")
    for name, _, _ in reversed(rules):
        reason = F.when(F.col(f"_is_{name}"), F.lit(name)).otherwise(reason)
    df = df.withColumn("reason", reason)
    detail = F.lit(None).cast("string")
    for name, _, why in reversed(rules):
        detail = F.when(F.col("reason") == name, why).otherwise(detail)
    df = df.withColumn("detail", detail)
    return df.drop("keys", "v", "file_reason", "file_detail", *[f"_is_{name}" for name, _, _ in rules])

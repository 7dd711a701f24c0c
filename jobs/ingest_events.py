"""Ingest arrival days of landing events into bronze.ad_events and bronze.quarantine.

`python -m jobs.ingest_events --ds YYYY-MM-DD [--through YYYY-MM-DD] [--config FILE]`

Flow (the transforms are pure; I/O is the thin shell around them), for the days ds..through (one day
without --through) in ONE pass, a constant number of Spark jobs however many days:
  landing/ds=D/* for every day --read_days--> (value, source_file, ds, file_reason, file_detail):
      every file's lines, each with its arrival day; a file whose gzip stream is damaged contributes
      the lines read before the damage (reason unreadable_file, the rest of the day is ingested), a
      file not named *.json.gz all its lines (reason unexpected_file_name) - none is skipped unseen
      --classify--> every line with its typed fields and the first rule it breaks (or none)
      --mark_duplicates--> repeated event ids (within a day, across the days, against bronze)
      --check_drift (per day)--> fail the job if a column's type or the key set changed for many rows
      --validate (Great Expectations, before any commit)-->
  commit (gem.lakehouse.commit.StageCommit): withdraw the (ingest_events, D) completion records;
  replace bronze's partitions of the days in one commit; the quarantine's in one commit; publish
  one record per day, reconciled with the commits' row counts, LAST.

A crash between commits leaves no completion record, so no downstream stage reads the days; a
rerun rewrites the partitions with identical contents and converges. A range has the same contents
and per-day records as ingesting its days one by one, in order (tests/spark/test_ingest_events.py).
Counts reconcile per file too: the result's details["files"][ds][file] = {in, written, quarantined}.

Duplicates (same event_id): caught within the day, and against the good events of the
`ingest.dedup_lookback_days` days before AND after the day, so a day ingested out of order (day 2
before day 1) is checked against the later day already in bronze: the copy being ingested is the
duplicate (bronze never holds both; which copy stays depends on the order days were ingested in).
Limit, by choice: an id repeated further apart than the lookback is not caught (no all-time
event-id index is kept; a lookup over all of bronze per day would grow without bound); so the
schema suite checks event_id unique per ds, as a daily run's one-day batch does. In a range, each
day is checked against the range's earlier days as if they were in bronze already, by one window
over every copy of an id (`mark_duplicates`); bronze's old partitions of the range's own days are
being replaced and are not consulted.
"""

from __future__ import annotations

import datetime as dt
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from gem.config import GemConfig
from gem.days import shift_day
from gem.faults import crash_point
from gem.lakehouse.commit import DayCounts, StageCommit, StageContext, StageResult
from gem.lakehouse.landing import DATA_FILE_PATTERN, gzip_problem, lines_before_damage, list_partition
from gem.pipeline.cli import StageCall, run_command, stage_command
from schemas.events import BRONZE_AD_EVENTS, BRONZE_QUARANTINE, FILE_REASONS, ID_COLUMNS, LANDING_EVENTS
from schemas.table import Column

if TYPE_CHECKING:
    from pyspark.sql import Column as SparkColumn
    from pyspark.sql import DataFrame, SparkSession

STAGE = "ingest_events"
DAY_MS = 86_400_000


class SchemaDriftError(RuntimeError):
    """The landing data no longer matches the landing contract in schemas/events.py."""


# --------------------------------------------------------------------------------------------------
# Pure transforms.


LINES_SCHEMA = "value STRING, source_file STRING, ds DATE, file_reason STRING, file_detail STRING"


def read_landing(spark: SparkSession, landing_root: str, files: list[str]) -> DataFrame:
    """Landing files -> DataFrame(value: raw line, source_file: file name within its ds folder,
    ds: the arrival day, from the file's partition folder `ds=YYYY-MM-DD`), in one read."""
    from pyspark.sql import functions as F

    # Spark lists more than `threshold` named paths in a Spark job of one task per path, far slower
    # for hundreds of landing days' files than listing them here in the driver. The listing is
    # done when the DataFrame is made, so the setting is restored right after.
    threshold = "spark.sql.sources.parallelPartitionDiscovery.threshold"
    before = spark.conf.get(threshold)
    spark.conf.set(threshold, str(max(len(files), int(before))))
    try:
        read = spark.read.option("basePath", landing_root).text(files)
    finally:
        spark.conf.set(threshold, before)
    return read.select("value", F.col("_metadata.file_name").alias("source_file"), F.col("ds").cast("date"))


def _variant_schema() -> str:
    # Every landing field as a VARIANT: it keeps the JSON type of the value (a string field's typed
    # parse turns the number 12345 and the object {"id": 7} into the strings "12345" and '{"id":7}').
    return ", ".join(f"`{c.name}` VARIANT" for c in LANDING_EVENTS.columns)


def _typed_schema() -> str:
    return ", ".join(f"`{c.name}` {c.sql_type}" for c in LANDING_EVENTS.columns)


def _violates_domain(col: Column) -> SparkColumn | None:
    """True where a non-null value breaks the column's allowed set or range."""
    from pyspark.sql import functions as F

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
    from pyspark.sql import functions as F

    names = F.array(*[F.when(cond, F.lit(name)) for name, cond in conditions])
    hits = F.filter(names, lambda x: x.isNotNull())
    return F.when(F.size(hits) > 0, F.array_join(hits, ","))


def classify(lines: DataFrame, cfg: GemConfig) -> DataFrame:
    """(value, source_file, ds) -> one row per line with `reason`/`detail` (null when the line is good),
    the typed landing fields under struct `t`, and `unexpected_keys` / `wrong_type_cols` for drift.

    Rules, first failing wins (schemas.events.QUARANTINE_REASONS order): the file's own reason
    (`file_reason`, set by the I/O for a damaged or misnamed file; optional column), then per line:
    malformed_json, unexpected_column, wrong_type (a value of another JSON type, e.g. an id that is
    a number, object or array), missing_id, missing_field, unknown_surface, invalid_value,
    negative_timestamp, stale_timestamp (more than ingest.max_event_lag_days before ds, e.g. epoch
    seconds read as milliseconds), far_future_timestamp, event_after_arrival. The time rules
    read each line's own arrival day `ds`, so one expression classifies any number of days.
    Duplicates need every copy of an id and come after, in `mark_duplicates`.
    """
    from pyspark.sql import functions as F

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


def mark_duplicates(parsed: DataFrame, lookback_days: int, outside_ids: DataFrame | None = None) -> DataFrame:
    """Good lines (no reason yet) whose event id repeats become `duplicate_event_id`, exactly as if
    the days in `parsed` were ingested one by one, in order:

    - a copy whose day has a good copy of the id within `lookback_days` before it, among the earlier
      days in `parsed` or in `outside_ids` (event_id, ds: bronze's good events outside these days),
      or within `lookback_days` after it in `outside_ids` (days ingested out of order), is a duplicate
      with detail "already in bronze ds=<the earliest such day>";
    - otherwise the day's first copy (ordered by raw line, then file) is good and the others are
      "repeated within this ds".

    Which earlier copies are good depends on the rule itself: with a 7-day lookback and copies on
    Jan 1, Jan 8 and Jan 15, Jan 8's is a duplicate of Jan 1's and Jan 15's is good (no GOOD copy
    within 7 days before it). So per id the good days are found by one fold over its sorted days
    (`aggregate`), not by comparing each copy with every earlier copy. One shuffle by event id
    serves the bronze join and the window; the lines that broke a rule keep their own reason.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    lookback = max(lookback_days, 0)
    candidate = F.col("reason").isNull()
    df = parsed.withColumn("_event_id", F.col("t.event_id"))
    if outside_ids is not None:
        seen = outside_ids.groupBy("event_id").agg(F.collect_set("ds").alias("_outside_days"))
        df = df.join(seen, df["_event_id"] == seen["event_id"], "left").drop(seen["event_id"])
        outside = F.coalesce(F.col("_outside_days"), F.array().cast("array<date>"))
    else:
        outside = F.array().cast("array<date>")
    # Candidates first, so a candidate's preceding rows are the earlier copies that compete with it.
    copies = Window.partitionBy("_event_id").orderBy(~candidate, "ds", "value", "source_file")
    days_so_far = F.array_sort(F.collect_set(F.when(candidate, F.col("ds"))).over(
        copies.rowsBetween(Window.unboundedPreceding, Window.currentRow)))

    def near(day: SparkColumn, other: SparkColumn) -> SparkColumn:
        return F.abs(F.datediff(other, day)) <= lookback

    def blocked(good: SparkColumn, day: SparkColumn) -> SparkColumn:
        """day has a good copy within the lookback: outside, or the last good day before it."""
        last_good = F.element_at(good, -1)
        return F.exists(outside, lambda o: near(day, o)) | ((F.size(good) > 0) & near(day, last_good))

    good_days = F.aggregate(days_so_far, F.array().cast("array<date>"),
                            lambda good, day: F.when(blocked(good, day), good).otherwise(F.array_append(good, day)))
    df = df.select("*", F.when(candidate, good_days).alias("_good_days"),
                   F.coalesce(F.lag("ds").over(copies) != F.col("ds"), F.lit(True)).alias("_first_of_day"))
    seen_ds = F.array_min(F.filter(F.concat(outside, F.col("_good_days")),
                                   lambda d: near(F.col("ds"), d)))
    day_is_good = F.array_contains("_good_days", F.col("ds"))
    duplicate = candidate & ~(day_is_good & F.col("_first_of_day"))
    return (
        df.withColumn(
            "detail",
            F.when(candidate & ~day_is_good, F.concat(F.lit("already in bronze ds="), seen_ds.cast("string")))
            .when(duplicate, F.lit("repeated within this ds"))
            .otherwise(F.col("detail")),
        )
        .withColumn("reason", F.when(duplicate, F.lit("duplicate_event_id")).otherwise(F.col("reason")))
        .drop("_event_id", "_outside_days", "_good_days", "_first_of_day")
    )


def good_rows(classified: DataFrame) -> DataFrame:
    """Lines with no reason -> bronze.ad_events rows (typed, event_time as timestamp, ds)."""
    from pyspark.sql import functions as F

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
    from pyspark.sql import functions as F

    return classified.where(F.col("reason").isNotNull()).select(
        "ds",
        "reason",
        "detail",
        "source_file",
        F.col("value").alias("raw_line"),
    )


@dataclass(frozen=True)
class LineCensus:
    """What the classified lines of one arrival day say: counts by reason (overall and per file)
    and, over the lines of readable, expected files, per-column type errors."""

    by_reason: dict[str, int]  # "" = good lines
    wrong_type: dict[str, int]  # landing column -> lines whose value has the wrong JSON type
    unexpected: dict[str, int]  # unknown key -> lines carrying it
    by_file: dict[str, dict[str, int]]  # source file -> reason ("" = good) -> lines

    @property
    def rows_in(self) -> int:
        return sum(self.by_reason.values())

    @property
    def parsed(self) -> int:
        """Lines of readable, expected files that are JSON objects: the base of the drift rates."""
        return self.rows_in - sum(self.by_reason.get(r, 0) for r in ("malformed_json", *FILE_REASONS))

    def file_counts(self) -> dict[str, dict[str, object]]:
        """file -> {"in", "written", "quarantined": {reason: n}}; in = written + quarantined."""
        out: dict[str, dict[str, object]] = {}
        for name, reasons in sorted(self.by_file.items()):
            quarantined = {r: n for r, n in sorted(reasons.items()) if r}
            out[name] = {"in": sum(reasons.values()), "written": reasons.get("", 0), "quarantined": quarantined}
        return out


def take_census(classified: DataFrame) -> dict[str, LineCensus]:
    """Each arrival day's LineCensus ("YYYY-MM-DD" -> census), in two collects for all the days."""
    from pyspark.sql import functions as F

    known = LANDING_EVENTS.column_names
    rows = (
        classified.groupBy("ds", "source_file", "reason")
        .agg(
            F.count(F.lit(1)).alias("n"),
            *[F.sum(F.array_contains("wrong_type_cols", c).cast("long")).alias(c) for c in known],
        )
        .collect()
    )
    # A damaged or misnamed file is not the producer's contract changing: its lines count for no drift.
    unexpected_rows = (
        classified.where((F.size("unexpected_keys") > 0) & ~F.coalesce(F.col("reason").isin(list(FILE_REASONS)), F.lit(False)))
        .select("ds", F.explode("unexpected_keys").alias("key"))
        .groupBy("ds", "key")
        .count()
        .collect()
    )
    by_reason: dict[str, dict[str, int]] = {}
    by_file: dict[str, dict[str, dict[str, int]]] = {}
    wrong_type: dict[str, dict[str, int]] = {}
    for r in rows:
        day, reason, n = r["ds"].isoformat(), r["reason"] or "", int(r["n"])
        by_reason.setdefault(day, {})[reason] = by_reason.get(day, {}).get(reason, 0) + n
        by_file.setdefault(day, {}).setdefault(r["source_file"], {})[reason] = n
        if r["reason"] not in FILE_REASONS:
            for c in known:
                if r[c]:
                    wrong_type.setdefault(day, {})[c] = wrong_type.get(day, {}).get(c, 0) + int(r[c])
    unexpected: dict[str, dict[str, int]] = {}
    for r in unexpected_rows:
        unexpected.setdefault(r["ds"].isoformat(), {})[r["key"]] = int(r["count"])
    return {day: LineCensus(by_reason[day], wrong_type.get(day, {}), unexpected.get(day, {}), by_file[day])
            for day in sorted(by_reason)}


def check_drift(census: LineCensus, cfg: GemConfig, where: str) -> None:
    """Fail when a column's type or the key set changed for more than the configured share of rows.

    A few bad rows are dirty data (quarantined); a column that is wrong in many rows is a producer
    that changed the contract, and quarantining the whole day would hide it.
    """
    total = census.parsed
    if total == 0:
        return
    limit = cfg.ingest.drift_max_type_error_rate
    problems = []
    for label, counts in (("unexpected column", census.unexpected), ("wrong type in column", census.wrong_type)):
        for name, n in sorted(counts.items()):
            if n / total > limit:
                problems.append(f"{label} {name!r} in {n} of {total} rows ({n / total:.1%})")
    if problems:
        expected = ", ".join(f"{c.name}: {c.dtype}" for c in LANDING_EVENTS.columns)
        raise SchemaDriftError(
            f"schema drift in {where}: " + "; ".join(problems)
            + f". The landing contract (schemas/events.py LANDING_EVENTS) is {{{expected}}}; "
            f"rates above ingest.drift_max_type_error_rate={limit} fail the job."
        )


# --------------------------------------------------------------------------------------------------
# Thin I/O.


def _outside_event_ids(spark: SparkSession, cfg: GemConfig, days: tuple[str, ...]) -> DataFrame | None:
    """(event_id, ds) of bronze's good events within the dedup lookback before the first day and
    after the last (days ingested out of order); bronze's partitions of the days themselves are being
    replaced, so a rerun does not count its own earlier output as duplicates."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    from gem.lakehouse.tables import table_path

    lookback, path = cfg.ingest.dedup_lookback_days, table_path(cfg, BRONZE_AD_EVENTS)
    if lookback <= 0 or not DeltaTable.isDeltaTable(spark, path):
        return None
    lo, first, last, hi = (F.lit(d).cast("date") for d in (shift_day(days[0], -lookback), days[0], days[-1],
                                                            shift_day(days[-1], lookback)))
    before = (F.col("ds") >= lo) & (F.col("ds") < first)
    after = (F.col("ds") > last) & (F.col("ds") <= hi)
    return spark.read.format("delta").load(path).where(before | after).select("event_id", "ds")


def read_days(spark: SparkSession, landing_root: str, days: tuple[str, ...]) -> DataFrame:
    """Every line of every file of the landing days (LINES_SCHEMA), each with its day: the readable
    files in one Spark read; a file whose gzip stream is damaged (checked first, in one streaming
    pass per file) gives the lines read before the damage, or one empty line when none could be,
    with file_reason unreadable_file; a file not named DATA_FILE_PATTERN gives all its lines with
    unexpected_file_name. A marker over no data file is refused (gem.lakehouse.landing)."""
    from pyspark.sql import functions as F

    damaged_rows, readable, misnamed = [], [], []
    for day in days:
        listing = list_partition(landing_root, day)
        misnamed += [f"{day}/{Path(p).name}" for p in listing.unexpected_files]
        for path in listing.all_files:
            name = Path(path).name
            problem = gzip_problem(path) if name.endswith(".gz") else None
            if problem is None:
                readable.append(path)
                continue
            recovered = lines_before_damage(path) or [""]
            for i, raw in enumerate(recovered, start=1):
                why = (f"{name}: not a readable gzip file ({problem}); line {i} of the {len(recovered)} "
                       "read before the damage, the rest of the file could not be read")
                damaged_rows.append((raw, name, dt.date.fromisoformat(day), "unreadable_file", why))
    lines = spark.createDataFrame(damaged_rows, LINES_SCHEMA)
    if readable:
        is_misnamed = F.concat_ws("/", F.col("ds").cast("string"), "source_file").isin(misnamed)
        read = read_landing(spark, landing_root, readable).select(
            "value", "source_file", "ds",
            F.when(is_misnamed, F.lit("unexpected_file_name")).alias("file_reason"),
            F.when(is_misnamed, F.lit(f"file name does not match the landing pattern {DATA_FILE_PATTERN}"))
            .alias("file_detail"))
        lines = read.unionByName(lines)
    return lines


def run(ctx: StageContext, ds: str, through: str | None = None) -> StageResult:
    """Ingest landing day ds (or the days ds..through, in one commit per table with one record per
    day, exactly as if ingested one by one) in one pass: a constant number of Spark jobs."""
    from pyspark import StorageLevel

    from gem.quality import expectations, runner

    t0, cfg = time.time(), ctx.cfg
    # The registry's landing need (each day's _SUCCESS marker) is checked, and the old records
    # withdrawn, before anything is read: a failing rerun leaves no record claiming a day.
    commit = StageCommit.begin(ctx, STAGE, ds, through)
    crash_point(f"{STAGE}:after_withdraw")
    spark = ctx.spark_for(STAGE, ds)
    classified = good = None
    try:
        lines = read_days(spark, cfg.landing_root, commit.days)
        # gzip is not splittable: spread the lines over the cores before the per-line parsing.
        lines = lines.repartition(max(spark.sparkContext.defaultParallelism, 2))
        outside = _outside_event_ids(spark, cfg, commit.days)
        # A local checkpoint, not persist(): the plan reads bronze (the neighbouring days' ids), and a
        # cached plan over bronze would be recomputed in full when this job's own bronze commit
        # invalidates it.
        classified = mark_duplicates(classify(lines, cfg), cfg.ingest.dedup_lookback_days, outside) \
            .localCheckpoint(eager=True)
        census = take_census(classified)
        empty = LineCensus({}, {}, {}, {})  # a day whose files hold no line
        per_day: dict[str, DayCounts] = {}
        for day in commit.days:
            check_drift(census.get(day, empty), cfg, where=f"landing ds={day}")
            by_reason = dict(census.get(day, empty).by_reason)
            rows_written = by_reason.pop("", 0)
            per_day[day] = DayCounts(rows_written + sum(by_reason.values()), rows_written, dict(sorted(by_reason.items())))
        # The typed rows GX scans ~50 times and the bronze write reads: cache them compactly.
        good = good_rows(classified).persist(StorageLevel.MEMORY_AND_DISK)
        label = commit.label
        # The key is checked per arrival day, as a daily run's batch checks it: an id repeated
        # further apart than the dedup lookback is kept on both days, by choice (module docstring).
        per_day_key = replace(BRONZE_AD_EVENTS, key=("ds", *BRONZE_AD_EVENTS.key))
        runner.validate(
            cfg,
            good,
            suite_name=f"{BRONZE_AD_EVENTS.name}.schema",
            expectations=expectations.schema_expectations(per_day_key),
            batch_label=f"{STAGE}:{label}",
        )
        commit.replace(good, BRONZE_AD_EVENTS)
        crash_point(f"{STAGE}:after_bronze")
        commit.replace(quarantined_rows(classified), BRONZE_QUARANTINE)
        crash_point(f"{STAGE}:after_quarantine")
        # Reconciled against what the commits say they wrote, not only what we counted.
        commit.publish(per_day=per_day, written_tables=(BRONZE_AD_EVENTS,), quarantine_table=BRONZE_QUARANTINE)
    finally:
        for cached in (good, classified):
            if cached is not None:
                cached.unpersist()
    per_file = {day: census.get(day, empty).file_counts() for day in commit.days}
    return commit.result(t0, files=per_file)


def command_line(call: StageCall) -> int:
    """Ingest landing day --ds (or the days --ds..--through) into bronze; print the summary and
    each file's counts."""
    result = run(StageContext(call.cfg), call.ds, call.through)
    print(f"{result.summary()} ({result.rows_in / max(result.seconds, 1e-9):,.0f} events/s)")
    for day, files in result.details["files"].items():
        for name, counts in files.items():
            print(f"  ds={day} {name}: in={counts['in']} written={counts['written']} quarantined={counts['quarantined']}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_command(stage_command("ingest_events", command_line), argv)


if __name__ == "__main__":
    sys.exit(main())

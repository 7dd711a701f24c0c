"""Ingest one arrival day of landing events into bronze.ad_events and bronze.quarantine.

`python -m jobs.ingest_events --ds YYYY-MM-DD [--through YYYY-MM-DD] [--config FILE]`

Flow (the transform is pure; I/O is the thin shell around it):
  landing/ds=D/* --read_day--> (value, source_file, file_reason, file_detail): every file's lines;
      a file whose gzip stream is damaged contributes the lines read before the damage (reason
      unreadable_file, the rest of the day is ingested), a file not named *.json.gz all its lines
      (reason unexpected_file_name) - none is skipped unseen
      --classify--> every line with its typed fields and the first rule it breaks (or none)
      --check_drift--> fail the job if a column's type or the key set changed for many rows
      --validate (Great Expectations, before any commit)-->
  commit (gem.lakehouse.commit.StageCommit): withdraw the (ingest_events, D) completion record; replace
  bronze ds=D; replace quarantine ds=D; publish the record, reconciled with the commits' row
  counts, LAST.

A crash between commits leaves no completion record, so no downstream stage reads the day; a rerun
rewrites both partitions with identical contents and converges. `--through D2` ingests D..D2 in one
commit per table with one record per day, with the same contents as ingesting the days one by one.
Counts reconcile per file too: the result's details["files"][ds][file] = {in, written, quarantined}.

Duplicates (same event_id): caught within the day, and against bronze's good events of the
`ingest.dedup_lookback_days` days before AND after the day, so a day ingested out of order (day 2
before day 1) is checked against the later day already in bronze: the copy being ingested is the
duplicate (bronze never holds both; which copy stays depends on the order days were ingested in).
Limit, by choice: an id repeated further apart than the lookback is not caught (no all-time
event-id index is kept; a lookup over all of bronze per day would grow without bound).
"""

from __future__ import annotations

import datetime as dt
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gem.cli import iso_day, job_parser, shift_day
from gem.config import GemConfig, load_config
from gem.faults import crash_point
from gem.lakehouse.commit import DayCounts, StageCommit, StageContext, StageResult
from gem.lakehouse.landing import DATA_FILE_PATTERN, gzip_problem, lines_before_damage, list_partition
from schemas.events import BRONZE_AD_EVENTS, BRONZE_QUARANTINE, FILE_REASONS, ID_COLUMNS, LANDING_EVENTS
from schemas.table import Column

if TYPE_CHECKING:
    from pyspark.sql import Column as SparkColumn
    from pyspark.sql import DataFrame, SparkSession

STAGE = "ingest_events"


class SchemaDriftError(RuntimeError):
    """The landing data no longer matches the landing contract in schemas/events.py."""


# --------------------------------------------------------------------------------------------------
# Pure transforms.


LINES_SCHEMA = "value STRING, source_file STRING, file_reason STRING, file_detail STRING"


def read_landing(spark: "SparkSession", files: list[str]) -> "DataFrame":
    """Landing files -> DataFrame(value: raw line, source_file: file name within the ds folder)."""
    from pyspark.sql import functions as F

    return spark.read.text(files).select("value", F.col("_metadata.file_name").alias("source_file"))


def _variant_schema() -> str:
    # Every landing field as a VARIANT: it keeps the JSON type of the value (a string field's typed
    # parse turns the number 12345 and the object {"id": 7} into the strings "12345" and '{"id":7}').
    return ", ".join(f"`{c.name}` VARIANT" for c in LANDING_EVENTS.columns)


def _typed_schema() -> str:
    return ", ".join(f"`{c.name}` {c.sql_type}" for c in LANDING_EVENTS.columns)


def _violates_domain(col: Column) -> "SparkColumn | None":
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


def _first_name(conditions: list[tuple[str, "SparkColumn"]]) -> "SparkColumn":
    """Comma-joined names whose condition holds (null when none): the `detail` of a rule."""
    from pyspark.sql import functions as F

    names = F.array(*[F.when(cond, F.lit(name)) for name, cond in conditions])
    hits = F.filter(names, lambda x: x.isNotNull())
    return F.when(F.size(hits) > 0, F.array_join(hits, ","))


def classify(lines: "DataFrame", ds: str, cfg: GemConfig) -> "DataFrame":
    """(value, source_file) -> one row per line with `reason`/`detail` (null when the line is good),
    the typed landing fields under struct `t`, and `unexpected_keys` / `wrong_type_cols` for drift.

    Rules, first failing wins (schemas.events.QUARANTINE_REASONS order): the file's own reason
    (`file_reason`, set by the I/O for a damaged or misnamed file; optional column), then per line:
    malformed_json, unexpected_column, wrong_type (a value of another JSON type, e.g. an id that is
    a number, object or array), missing_id, missing_field, unknown_surface, invalid_value,
    negative_timestamp, stale_timestamp (more than ingest.max_event_lag_days before ds, e.g. epoch
    seconds read as milliseconds), far_future_timestamp, event_after_arrival. Duplicates need the
    whole day and come after, in `mark_duplicates`.
    """
    from pyspark.sql import functions as F

    known = [c.name for c in LANDING_EVENTS.columns]
    day_start_ms = int(dt.datetime.fromisoformat(ds).replace(tzinfo=dt.timezone.utc).timestamp() * 1000)
    day_end_ms = day_start_ms + 86_400_000
    far_future_ms = day_end_ms + cfg.ingest.far_future_days * 86_400_000
    stale_ms = day_start_ms - cfg.ingest.max_event_lag_days * 86_400_000

    if "file_reason" not in lines.columns:
        lines = lines.select("*", *[F.lit(None).cast("string").alias(c) for c in ("file_reason", "file_detail")])
    df = lines.select(
        "value",
        "source_file",
        "file_reason",
        "file_detail",
        F.expr("json_object_keys(value)").alias("keys"),
        F.from_json("value", _variant_schema()).alias("v"),
        F.from_json("value", _typed_schema()).alias("t"),
    )
    df = df.withColumn("unexpected_keys", F.filter("keys", lambda k: ~k.isin(known)))

    def wrong_type(c: Column) -> "SparkColumn":
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

    t = lambda name: F.col(f"t.{name}")  # noqa: E731 - short accessor keeps the rules readable
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
    # CASE chains read them (inlining them twice made the plan much slower).
    event_time = t("event_time")
    stale_detail = F.concat(event_time.cast("string"), F.lit(" ms = "), F.timestamp_millis(event_time).cast("string"),
                            F.lit(f" UTC, more than ingest.max_event_lag_days={cfg.ingest.max_event_lag_days} "
                                  f"days before ds={ds}"))
    rules: list[tuple[str, "SparkColumn", "SparkColumn"]] = [
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


def mark_duplicates(parsed: "DataFrame", prior_ids: "DataFrame | None") -> "DataFrame":
    """Good lines whose event id repeats within the day (all but the first copy, ordered by raw line
    then file) or already sits in bronze for an earlier ds become `duplicate_event_id`.

    One shuffle by event id serves both: the window ranks copies, and the join with earlier days'
    ids reuses the same partitioning.
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    # Only lines that passed the row rules compete for an id; the others keep their own reason.
    df = parsed.withColumn("_event_id", F.when(F.col("reason").isNull(), F.col("t.event_id")))
    w = Window.partitionBy("_event_id").orderBy("value", "source_file")
    df = df.withColumn("_rank", F.when(F.col("_event_id").isNotNull(), F.row_number().over(w)))
    if prior_ids is not None:
        seen = prior_ids.groupBy("event_id").agg(F.min("ds").alias("_seen_ds"))
        df = df.join(seen, df["_event_id"] == seen["event_id"], "left").drop(seen["event_id"])
    else:
        df = df.withColumn("_seen_ds", F.lit(None).cast("date"))

    seen_before = F.col("_seen_ds").isNotNull()
    repeated = F.coalesce(F.col("_rank") > 1, F.lit(False))
    return (
        df.withColumn(
            "detail",
            F.when(seen_before, F.concat(F.lit("already in bronze ds="), F.col("_seen_ds").cast("string")))
            .when(repeated, F.lit("repeated within this ds"))
            .otherwise(F.col("detail")),
        )
        .withColumn("reason", F.when(seen_before | repeated, F.lit("duplicate_event_id")).otherwise(F.col("reason")))
        .drop("_event_id", "_rank", "_seen_ds")
    )


def good_rows(classified: "DataFrame", ds: str) -> "DataFrame":
    """Lines with no reason -> bronze.ad_events rows (typed, event_time as timestamp, ds)."""
    from pyspark.sql import functions as F

    cols = []
    for c in BRONZE_AD_EVENTS.columns:
        if c.name == "ds":
            cols.append(F.lit(ds).cast("date").alias("ds"))
        elif c.name == "event_time":
            cols.append(F.timestamp_millis(F.col("t.event_time")).alias("event_time"))
        else:
            cols.append(F.col(f"t.{c.name}").alias(c.name))
    return classified.where(F.col("reason").isNull()).select(*cols)


def quarantined_rows(classified: "DataFrame", ds: str) -> "DataFrame":
    """Lines with a reason -> bronze.quarantine rows (the raw line verbatim)."""
    from pyspark.sql import functions as F

    return classified.where(F.col("reason").isNotNull()).select(
        F.lit(ds).cast("date").alias("ds"),
        "reason",
        "detail",
        "source_file",
        F.col("value").alias("raw_line"),
    )


@dataclass(frozen=True)
class LineCensus:
    """What one pass over the classified lines says: counts by reason (overall and per file) and,
    over the lines of readable, expected files, per-column type errors."""

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


def take_census(classified: "DataFrame") -> LineCensus:
    from pyspark.sql import functions as F

    known = LANDING_EVENTS.column_names
    rows = (
        classified.groupBy("source_file", "reason")
        .agg(
            F.count(F.lit(1)).alias("n"),
            *[F.sum(F.array_contains("wrong_type_cols", c).cast("long")).alias(c) for c in known],
        )
        .collect()
    )
    by_reason: dict[str, int] = {}
    by_file: dict[str, dict[str, int]] = {}
    for r in rows:
        reason = r["reason"] or ""
        by_reason[reason] = by_reason.get(reason, 0) + int(r["n"])
        by_file.setdefault(r["source_file"], {})[reason] = int(r["n"])
    # A damaged or misnamed file is not the producer's contract changing: its lines count for no drift.
    contract = [r for r in rows if r["reason"] not in FILE_REASONS]
    wrong_type = {c: sum(int(r[c] or 0) for r in contract) for c in known}
    unexpected_rows = (
        classified.where((F.size("unexpected_keys") > 0) & ~F.coalesce(F.col("reason").isin(list(FILE_REASONS)), F.lit(False)))
        .select(F.explode("unexpected_keys").alias("key"))
        .groupBy("key")
        .count()
        .collect()
    )
    unexpected = {r["key"]: int(r["count"]) for r in unexpected_rows}
    return LineCensus(by_reason, {c: n for c, n in wrong_type.items() if n}, unexpected, by_file)


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


def _prior_event_ids(spark: "SparkSession", cfg: GemConfig, ds: str, first_day: str, last_day: str,
                     earlier_in_range: "DataFrame | None") -> "DataFrame | None":
    """(event_id, ds) of the good events within the dedup lookback around ds: bronze's before the
    first day of this run and after its last (days ingested out of order; a rerun of a range
    replaces the range's own), plus those of the range's earlier days ingested by this run."""
    from delta.tables import DeltaTable
    from pyspark.sql import functions as F

    from gem.lakehouse.tables import table_path

    if cfg.ingest.dedup_lookback_days <= 0:
        return None
    lo = F.lit(shift_day(ds, -cfg.ingest.dedup_lookback_days)).cast("date")
    hi = F.lit(shift_day(ds, cfg.ingest.dedup_lookback_days)).cast("date")
    path = table_path(cfg, BRONZE_AD_EVENTS)
    prior = None
    if DeltaTable.isDeltaTable(spark, path):
        before = (F.col("ds") >= lo) & (F.col("ds") < F.lit(first_day).cast("date"))
        after = (F.col("ds") > F.lit(last_day).cast("date")) & (F.col("ds") <= hi)
        prior = spark.read.format("delta").load(path).where(before | after).select("event_id", "ds")
    if earlier_in_range is not None:
        earlier = earlier_in_range.where(F.col("ds") >= lo)
        prior = earlier if prior is None else prior.unionByName(earlier)
    return prior


def read_day(spark: "SparkSession", landing_root: str, day: str) -> "DataFrame":
    """Every line of every file of landing day `day` (LINES_SCHEMA): data files read by Spark;
    a file whose gzip stream is damaged (checked first, in one streaming pass per file) gives the
    lines read before the damage, or one empty line when none could be, with file_reason
    unreadable_file; a file not named DATA_FILE_PATTERN gives all its lines with
    unexpected_file_name. A marker over no data file is refused (gem.lakehouse.landing)."""
    from pyspark.sql import functions as F

    listing = list_partition(landing_root, day)
    damaged_rows, readable = [], []
    for path in listing.all_files:
        name = Path(path).name
        problem = gzip_problem(path) if name.endswith(".gz") else None
        if problem is None:
            readable.append(path)
            continue
        recovered = lines_before_damage(path) or [""]
        for i, raw in enumerate(recovered, start=1):
            damaged_rows.append((raw, name, "unreadable_file",
                                 f"{name}: not a readable gzip file ({problem}); line {i} of the {len(recovered)} "
                                 f"read before the damage, the rest of the file could not be read"))
    misnamed = [Path(p).name for p in listing.unexpected_files]
    lines = spark.createDataFrame(damaged_rows, LINES_SCHEMA)
    if readable:
        read = read_landing(spark, readable).select(
            "value", "source_file",
            F.when(F.col("source_file").isin(misnamed), F.lit("unexpected_file_name")).alias("file_reason"),
            F.when(F.col("source_file").isin(misnamed),
                   F.lit(f"file name does not match the landing pattern {DATA_FILE_PATTERN}")).alias("file_detail"))
        lines = read.unionByName(lines)
    return lines


def _ingest_day(spark: "SparkSession", cfg: GemConfig, day: str, first_day: str, last_day: str,
                earlier_in_range: "DataFrame | None") -> tuple["DataFrame", DayCounts, LineCensus]:
    """One landing day -> its classified lines (checkpointed), counts and census, duplicates marked
    against the lookback's good events."""
    lines = read_day(spark, cfg.landing_root, day)
    # gzip is not splittable: spread the lines over the cores before the per-line parsing.
    lines = lines.repartition(max(spark.sparkContext.defaultParallelism, 2))
    prior = _prior_event_ids(spark, cfg, day, first_day, last_day, earlier_in_range)
    # A local checkpoint, not persist(): the plan reads bronze (earlier days' ids), and a cached plan
    # over bronze would be recomputed in full when this job's own bronze commit invalidates it.
    classified = mark_duplicates(classify(lines, day, cfg), prior).localCheckpoint(eager=True)
    census = take_census(classified)
    check_drift(census, cfg, where=f"landing ds={day}")
    by_reason = dict(census.by_reason)
    rows_written = by_reason.pop("", 0)
    counts = DayCounts(rows_written + sum(by_reason.values()), rows_written, dict(sorted(by_reason.items())))
    return classified, counts, census


def run(ctx: StageContext, ds: str, through: str | None = None) -> StageResult:
    """Ingest landing day ds (or the days ds..through, in one commit per table with one record per
    day, exactly as if ingested one by one)."""
    from functools import reduce

    from pyspark import StorageLevel
    from pyspark.sql import DataFrame

    from gem.quality import expectations, runner

    t0, cfg = time.time(), ctx.cfg
    # The registry's landing need (each day's _SUCCESS marker) is checked, and the old records
    # withdrawn, before anything is read: a failing rerun leaves no record claiming a day.
    commit = StageCommit.begin(ctx, STAGE, ds, through)
    crash_point(f"{STAGE}:after_withdraw")
    spark = ctx.spark_for(STAGE, ds)
    per_day: dict[str, DayCounts] = {}
    per_file: dict[str, dict[str, dict[str, object]]] = {}
    classified_days: list[DataFrame] = []
    good = None
    try:
        goods, quarantines, earlier = [], [], None
        for day in commit.days:
            classified, per_day[day], census = _ingest_day(spark, cfg, day, commit.days[0], commit.days[-1], earlier)
            per_file[day] = census.file_counts()
            classified_days.append(classified)
            goods.append(good_rows(classified, day))
            quarantines.append(quarantined_rows(classified, day))
            ids = goods[-1].select("event_id", "ds")
            earlier = ids if earlier is None else earlier.unionByName(ids)
        # The typed rows GX scans ~50 times and the bronze write reads: cache them compactly.
        good = reduce(DataFrame.unionByName, goods).persist(StorageLevel.MEMORY_AND_DISK)
        label = ds if len(commit.days) == 1 else f"{commit.days[0]}..{commit.days[-1]}"
        runner.validate(
            cfg,
            good,
            suite_name=f"{BRONZE_AD_EVENTS.name}.schema",
            expectations=expectations.schema_expectations(BRONZE_AD_EVENTS),
            batch_label=f"{STAGE}:{label}",
        )
        commit.replace(good, BRONZE_AD_EVENTS)
        crash_point(f"{STAGE}:after_bronze")
        commit.replace(reduce(DataFrame.unionByName, quarantines), BRONZE_QUARANTINE)
        crash_point(f"{STAGE}:after_quarantine")
        # Reconciled against what the commits say they wrote, not only what we counted.
        commit.publish(per_day=per_day, written_tables=(BRONZE_AD_EVENTS,), quarantine_table=BRONZE_QUARANTINE)
    finally:
        for cached in (good, *classified_days):
            if cached is not None:
                cached.unpersist()
    return commit.result(t0, files=per_file)


def main(argv: list[str] | None = None) -> int:
    parser = job_parser(__doc__.splitlines()[0])
    parser.add_argument("--through", type=iso_day, default=None,
                        help="ingest the days --ds..--through in one commit (one record per day), e.g. a backfill")
    args = parser.parse_args(argv)
    cfg = load_config(args.config)
    result = run(StageContext(cfg), args.ds, args.through)
    print(f"{result.summary()} ({result.rows_in / max(result.seconds, 1e-9):,.0f} events/s)")
    for day, files in result.details["files"].items():
        for name, counts in files.items():
            print(f"  ds={day} {name}: in={counts['in']} written={counts['written']} quarantined={counts['quarantined']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

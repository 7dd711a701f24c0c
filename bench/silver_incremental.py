"""Silver build cost: the incremental day-N update vs a full recompute of day N, and Spark vs DuckDB.

    python -m bench.silver_incremental [--events-per-day 2000000] [--days 30] [--users 1000000]
                                       [--root /tmp/gem-bench-silver] [--master local[2]]

One run, side by side, on this machine:
  1. bronze.ad_events for `days` days is synthesized straight into Delta with Spark (ingest has its
     own benchmark): skewed user activity (user = floor(U * r^3): a few heavy users, a long tail
     seen rarely), 95.5% impressions / 3% clicks / 1.5% conversions, 6 surfaces, 2,000 ads.
     validate_events records are written for every day (the silver jobs gate on them).
  2. Spark, the production jobs: build_sequences for days 1..N-1 (the incremental chain, timed per
     day, compactions every `sequence_compaction_days` included), then day N (the incremental
     update; the latest compaction spread over its period is added: "amortized"). build_features
     for day N-1 in full (it writes the daily counts of its window: the state a daily chain leaves,
     as tests/spark/test_build_features.py checks), then day N incrementally (from N-1's counters).
  3. Spark full recompute of day N: every user's sequences from all N days of bronze with the same
     merge logic (gem.silver.sequences.merge_sequences over all events at once), written to a
     separate Delta table; build_features day N with full=True (the daily counts of its 28-day
     window rebuilt from bronze, then summed). Both are checked equal to the incremental results.
  4. DuckDB, the same logic in SQL over the same Parquet files (listed from the Delta log with the
     `deltalake` package), 2 threads: the full sequences recompute of day N and the features of
     day N, written to Parquet. Outputs are checked against Spark's (rows, summed lengths, summed
     counters) before any figure is printed.

Ratios are of wall-clock seconds from this one run; the seconds and ratios are published through
bench.results (silver_incremental), except a --duckdb-only run's (its Spark half is an earlier
run's). Not a test: nothing here gates CI.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import duckdb
import typer
from pyspark.sql import functions as F

from bench.results import RESULTS_DIR, Figure, ResultsDirOption, record
from gem.command_line import job_app, run_command
from gem.config import GemConfig, load_config
from gem.data.delta_log import logged_files, table_version
from gem.days import day_range, shift_day
from gem.lakehouse import tables
from gem.lakehouse.commit import StageContext
from gem.lakehouse.spark import get_spark
from gem.silver.sequences import merge_sequences
from jobs import build_features, build_sequences
from schemas.events import BRONZE_AD_EVENTS
from schemas.features import COUNT_METRICS, RATE_METRICS, SCOPES, WINDOW_DAYS, counter_name
from schemas.ops import COMPLETIONS
from schemas.sequences import SEQUENCE_COLUMNS, SEQUENCE_FIELDS, SILVER_USER_SEQUENCES
from schemas.tasks import CREATIVE_TYPES, OBJECTIVES, SURFACES

START = "2026-01-01"
ADS = 2_000


def bench_config(root: Path, master: str) -> GemConfig:
    return load_config(
        overrides={
            "lakehouse_uri": str(root / "lakehouse"),
            "start_ds": START,
            "spark": {"master": master, "driver_memory": "10g", "shuffle_partitions": 8},
        },
        environ={},
    )


# --------------------------------------------------------------------------------------------------
# 1. Synthetic bronze.


def synth_bronze(spark: Any, cfg: GemConfig, days: list[str], events_per_day: int, users: int, seed: int = 3) -> int:
    def pick(values: tuple[str, ...], index: Any) -> Any:
        return F.element_at(F.array(*[F.lit(v) for v in values]), (index % len(values) + 1).cast("int"))

    n = events_per_day * len(days)
    ids = spark.range(0, n, 1, numPartitions=max(2, len(days)))
    day_idx = (F.col("id") / F.lit(events_per_day)).cast("int")
    ds = F.date_add(F.lit(START).cast("date"), day_idx)
    kind = F.rand(seed + 1)
    event_type = F.when(kind < 0.955, "impression").when(kind < 0.985, "click").otherwise("conversion")
    ad = F.floor(F.lit(ADS) * F.pow(F.rand(seed + 2), 2)).cast("long")
    rows = ids.select(
        F.concat(F.lit("b-"), F.col("id").cast("string")).alias("event_id"),
        event_type.alias("event_type"),
        (ds.cast("timestamp") + F.make_dt_interval(secs=F.rand(seed + 3) * 86_399)).alias("event_time"),
        F.concat(F.lit("u"), F.floor(F.lit(users) * F.pow(F.rand(seed), 3)).cast("long").cast("string")).alias("user_id"),
        F.concat(F.lit("a"), ad.cast("string")).alias("ad_id"),
        F.concat(F.lit("adv"), (ad % 200).cast("string")).alias("advertiser_id"),
        F.concat(F.lit("c"), (ad % 600).cast("string")).alias("campaign_id"),
        pick(OBJECTIVES, ad).alias("objective"),
        pick(CREATIVE_TYPES, ad).alias("creative_type"),
        pick(SURFACES, F.floor(F.rand(seed + 4) * 6)).alias("surface"),
        F.floor(F.rand(seed + 5) * 10).cast("int").alias("position"),
        F.lit(None).cast("string").alias("conversion_type"),
        F.lit(None).cast("map<string,string>").alias("user_attrs"),
        ds.alias("ds"),
    )
    rows = rows.withColumn("position", F.when(F.col("event_type") != "conversion", F.col("position"))).withColumn(
        "conversion_type", F.when(F.col("event_type") == "conversion", F.lit("offsite_purchase"))
    )
    path = tables.ensure_table(spark, cfg, BRONZE_AD_EVENTS)
    rows.select(*BRONZE_AD_EVENTS.column_names).write.format("delta").mode("append").save(path)
    now = dt.datetime.now()
    records = [{"stage": "validate_events", "ds": dt.date.fromisoformat(d), "run_id": f"bench:{d}",
                "rows_in": events_per_day, "rows_written": events_per_day, "rows_quarantined": 0,
                "quarantined_by_reason": {}, "table_versions": {}, "completed_at": now} for d in days]
    completions = tables.ensure_table(spark, cfg, COMPLETIONS)
    spark.createDataFrame(records, COMPLETIONS.spark_schema()).write.format("delta").mode("append").save(completions)
    return n


# --------------------------------------------------------------------------------------------------
# 3. Spark full recompute.


def spark_full_sequences(spark: Any, cfg: GemConfig, ds: str, out: str) -> dict[str, int]:
    """Every user's sequences as of the end of ds from all bronze up to ds, written to `out`."""
    events = tables.read_table(spark, cfg, BRONZE_AD_EVENTS).where(F.col("ds") <= F.lit(ds).cast("date"))
    empty = spark.createDataFrame([], SILVER_USER_SEQUENCES.spark_schema())
    rows = merge_sequences(empty, events.withColumn("ds", F.lit(ds).cast("date")), cfg.sequence_caps)
    rows.write.format("delta").mode("overwrite").save(out)
    return _sequence_totals(spark.read.format("delta").load(out))


def _sequence_totals(rows: Any) -> dict[str, int]:
    aggs = [F.count("*").alias("rows")]
    for seq, n in SEQUENCE_COLUMNS.values():
        aggs += [F.sum(F.size(seq)).alias(f"len_{seq}"), F.sum(n).alias(n)]
    return {k: int(v) for k, v in rows.agg(*aggs).collect()[0].asDict().items()}


def _feature_totals_of_day(spark: Any, cfg: GemConfig, ds: str) -> dict[str, int]:
    """silver.user_features ds: its row count and the sum of each all-surfaces counter."""
    rows = tables.read_table(spark, cfg, build_features.SILVER_USER_FEATURES).where(F.col("ds") == F.lit(ds).cast("date"))
    cols = [counter_name(m, w) for w in WINDOW_DAYS for m in COUNT_METRICS.values()]
    r = rows.agg(F.count("*").alias("rows"), *[F.sum(c).alias(c) for c in cols]).collect()[0].asDict()
    return {k: int(v) for k, v in r.items()}


# --------------------------------------------------------------------------------------------------
# 4. DuckDB: the same logic over the same files.


def bronze_files(cfg: GemConfig, first: str, last: str) -> list[str]:
    """Parquet files of bronze arrival days first..last, from the Delta log (not a folder listing)."""
    path = tables.table_path(cfg, BRONZE_AD_EVENTS)
    return [f.path for f in logged_files(path, table_version(path)) if first <= f.partition["ds"] <= last]


DUCKDB_MEMORY = {"limit": "8GB"}  # --duckdb-memory sets it


def _duck(threads: int, spill_dir: str) -> Any:
    """2 threads, and a memory cap with a spill folder: at DuckDB's default limit (80% of RAM) the
    list aggregation over millions of users can take the machine's memory and get the process
    killed. The ordered list() aggregation of the full sequences cannot spill, so a large run needs
    a higher cap (--duckdb-memory); Spark is stopped before DuckDB runs, so it can have more."""
    con = duckdb.connect()
    con.execute(f"SET threads = {threads}; SET preserve_insertion_order = false; SET TimeZone = 'UTC'; "
                f"SET memory_limit = '{DUCKDB_MEMORY['limit']}'; SET temp_directory = '{spill_dir}'")
    return con


def _files_sql(files: list[str]) -> str:
    quoted = ", ".join(f"'{f}'" for f in files)
    return f"read_parquet([{quoted}], hive_partitioning = true)"


def duck_full_sequences(cfg: GemConfig, ds: str, out: str, threads: int) -> dict[str, int]:
    """The build_sequences merge from an empty state: per user and type, events deduplicated on
    event_id, ordered by (event_time, event_id), the last `cap` kept, uncapped counts."""
    con = _duck(threads, f"{out}.spill")
    parts = []
    for event_type, (seq, n) in SEQUENCE_COLUMNS.items():
        cap = int(getattr(cfg.sequence_caps, event_type))
        fields = ", ".join(f"{f} := {f}" for f in SEQUENCE_FIELDS[event_type])
        ordered = f"list(struct_pack({fields}) ORDER BY event_time, event_id) FILTER (WHERE event_type = '{event_type}')"
        parts.append(f"coalesce(({ordered})[-{cap}:], []) AS {seq}")
        parts.append(f"count(*) FILTER (WHERE event_type = '{event_type}') AS {n}")
    sql = f"""
        COPY (
          SELECT DATE '{ds}' AS ds, user_id, {", ".join(parts)}, max(event_time) AS last_event_time
          FROM (SELECT DISTINCT ON (event_id) * FROM {_files_sql(bronze_files(cfg, START, ds))})
          GROUP BY user_id
        ) TO '{out}' (FORMAT parquet)
    """
    con.execute(sql)
    aggs = ["count(*)"] + [f"sum(len({seq})), sum({n})" for seq, n in SEQUENCE_COLUMNS.values()]
    row = con.execute(f"SELECT {', '.join(aggs)} FROM read_parquet('{out}')").fetchone()
    keys = ["rows"] + [k for seq, n in SEQUENCE_COLUMNS.values() for k in (f"len_{seq}", n)]
    return dict(zip(keys, (int(v) for v in row), strict=True))


def duck_features(cfg: GemConfig, ds: str, out: str, threads: int) -> dict[str, int]:
    """silver.user_features of ds: the build_features counters as FILTERed counts, then the rates."""
    con = _duck(threads, f"{out}.spill")
    first = max(shift_day(ds, -max(WINDOW_DAYS)), cfg.start_ds)
    counts, rates = [], []
    for w in WINDOW_DAYS:
        since = f"TIMESTAMP '{shift_day(ds, -w)} 00:00:00'"
        for s in SCOPES:
            where_surface = "" if s is None else f" AND surface = '{s}'"
            for event_type, metric in COUNT_METRICS.items():
                counts.append(
                    f"count(*) FILTER (WHERE event_type = '{event_type}' AND event_time >= {since}{where_surface}) "
                    f"AS {counter_name(metric, w, s)}"
                )
            for rate, (num, den) in RATE_METRICS.items():
                n, d = counter_name(num, w, s), counter_name(den, w, s)
                rates.append(f"CASE WHEN {d} > 0 THEN {n}::DOUBLE / {d} END AS {counter_name(rate, w, s)}")
    window = (
        f"event_time >= TIMESTAMP '{shift_day(ds, -max(WINDOW_DAYS))} 00:00:00' "
        f"AND event_time < TIMESTAMP '{ds} 00:00:00'"
    )
    sql = f"""
        COPY (
          SELECT DATE '{ds}' AS ds, *, {", ".join(rates)} FROM (
            SELECT user_id, {", ".join(counts)}
            FROM {_files_sql(bronze_files(cfg, first, shift_day(ds, -1)))} WHERE {window}
            GROUP BY user_id)
        ) TO '{out}' (FORMAT parquet)
    """
    con.execute(sql)
    cols = [counter_name(m, w) for w in WINDOW_DAYS for m in COUNT_METRICS.values()]
    row = con.execute(f"SELECT count(*), {', '.join(f'sum({c})' for c in cols)} FROM read_parquet('{out}')").fetchone()
    return dict(zip(["rows", *cols], (int(v) for v in row), strict=True))


# --------------------------------------------------------------------------------------------------


def _timed(fn: Any, *args: Any, **kwargs: Any) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - t0


@dataclass(frozen=True)
class Setup:
    """One run's world and machine: bronze's volume, the folder it writes under, the Spark master and
    DuckDB's threads, and whether DuckDB's full sequences recompute is skipped."""

    events_per_day: int
    days: int
    users: int
    root: Path
    master: str
    threads: int
    skip_duckdb_sequences: bool


def duckdb_only(setup: Setup) -> dict[str, Any]:
    """--duckdb-only: the DuckDB half over the bronze files and Spark outputs an earlier run of this
    benchmark left in --root (its Spark figures are in that run's output); the outputs are checked
    against Spark's tables before any figure is printed."""
    root = setup.root
    cfg = bench_config(root, setup.master)
    last = shift_day(START, setup.days - 1)
    spark = get_spark(cfg, app_name="bench-silver-check")
    full_totals = _sequence_totals(spark.read.format("delta").load(str(root / "full_sequences")))
    spark_features = _feature_totals_of_day(spark, cfg, last)
    spark.stop()
    return {"days": setup.days, "users_total": full_totals["rows"],
            **_duckdb_half(setup, cfg, last, full_totals, spark_features)}


def _duckdb_half(setup: Setup, cfg: GemConfig, last: str, full_totals: dict[str, int],
                 spark_features: dict[str, int]) -> dict[str, Any]:
    """DuckDB's full sequences and features of day N, checked against Spark's totals, timed."""
    root = setup.root
    out: dict[str, Any] = {"duckdb_memory_limit": DUCKDB_MEMORY["limit"]}
    if setup.skip_duckdb_sequences:
        out["duckdb_sequences_full_s"] = None
        out["duckdb_sequences_full_error"] = "not run (--skip-duckdb-sequences)"
    else:
        try:
            duck_seq, duck_seq_s = _timed(duck_full_sequences, cfg, last, str(root / "duck_sequences.parquet"),
                                          setup.threads)
            assert duck_seq == full_totals, (duck_seq, full_totals)
            out |= {"duckdb_sequences_full_s": duck_seq_s,
                    "duckdb_full_sequences_events_per_s": setup.events_per_day * setup.days / duck_seq_s}
        except duckdb.OutOfMemoryException as e:
            # Its ordered list() aggregation cannot spill: running out of memory is an outcome, reported.
            out["duckdb_sequences_full_s"] = None
            out["duckdb_sequences_full_error"] = f"out of memory at memory_limit={DUCKDB_MEMORY['limit']}: {e}"[:300]
            print(out["duckdb_sequences_full_error"], flush=True)
    duck_feat, duck_feat_s = _timed(duck_features, cfg, last, str(root / "duck_features.parquet"), setup.threads)
    assert duck_feat == spark_features, (duck_feat, spark_features)
    feature_events = setup.events_per_day * min(setup.days - 1, max(WINDOW_DAYS))
    return out | {"duckdb_features_s": duck_feat_s, "duckdb_features_events_per_s": feature_events / duck_feat_s}


def run(setup: Setup) -> dict[str, Any]:
    root = setup.root
    shutil.rmtree(root, ignore_errors=True)
    cfg = bench_config(root, setup.master)
    spark = get_spark(cfg, app_name="bench-silver")
    days = day_range(START, shift_day(START, setup.days - 1))
    last = days[-1]
    n_events, synth_s = _timed(synth_bronze, spark, cfg, days, setup.events_per_day, setup.users)
    print(f"synthesized {n_events:,} bronze events over {len(days)} days in {synth_s:.0f}s", flush=True)

    chain_s, compaction_s = [], []
    for d in days[:-1]:
        built, s = _timed(build_sequences.run, StageContext(cfg, spark), d)
        chain_s.append(s)
        if built.details["compacted_users"] is not None:
            compaction_s.append(built.details["compaction_seconds"])
        compacted = (f" (of which compaction of {built.details['compacted_users']:,} users {built.details['compaction_seconds']:.1f}s)"
                     if built.details["compacted_users"] is not None else "")
        print(f"  build_sequences {d}: {s:.1f}s{compacted}", flush=True)
    seq_inc, seq_inc_s = _timed(build_sequences.run, StageContext(cfg, spark), last)
    # A compaction day pays for the next `sequence_compaction_days` days' bounded lookups: its cost
    # spread over them is added to the day-N update (the figure the goal is checked against).
    period = cfg.sequence_compaction_days
    # The latest compaction (the one day N reads; each costs more as users accumulate) sets the share.
    compaction_share_s = compaction_s[-1] / period if compaction_s else 0.0
    if seq_inc.details["compacted_users"] is not None:  # day N itself compacted: count its share, not all of it
        seq_inc_s -= seq_inc.details["compaction_seconds"] - seq_inc.details["compaction_seconds"] / period
    seq_amortized_s = seq_inc_s + (compaction_share_s if seq_inc.details["compacted_users"] is None else 0.0)
    prep, prep_s = _timed(build_features.run, StageContext(cfg, spark), shift_day(last, -1))
    print(f"  build_features {prep.ds} (full: the state day N advances from): {prep_s:.1f}s", flush=True)
    feats, feat_s = _timed(build_features.run, StageContext(cfg, spark), last)
    assert feats.details["incremental"], "build_features day N should advance from day N-1"
    print(f"incremental {last}: sequences {seq_inc_s:.1f}s ({seq_inc.details['users']:,} active users), "
          f"features {feat_s:.1f}s ({feats.details['users']:,} users)", flush=True)
    inc_features = _feature_totals_of_day(spark, cfg, last)

    full_path = str(root / "full_sequences")
    full_totals, seq_full_s = _timed(spark_full_sequences, spark, cfg, last, full_path)
    feats_full, feat_full_s = _timed(build_features.run, StageContext(cfg, spark), last, full=True)
    print(f"full recompute {last}: sequences {seq_full_s:.1f}s ({full_totals['rows']:,} users), "
          f"features {feat_full_s:.1f}s", flush=True)

    # Correctness before figures: the incremental day-N rows equal the full recompute's for those users.
    inc_rows = tables.read_table(spark, cfg, SILVER_USER_SEQUENCES).where(F.col("ds") == F.lit(last).cast("date"))
    full_active = spark.read.format("delta").load(full_path).join(inc_rows.select("user_id"), "user_id", "left_semi")
    inc_totals, full_active_totals = _sequence_totals(inc_rows), _sequence_totals(full_active)
    assert inc_totals == full_active_totals, (inc_totals, full_active_totals)
    spark_features = _feature_totals_of_day(spark, cfg, last)
    assert not feats_full.details["incremental"] and spark_features == inc_features, (spark_features, inc_features)
    spark.stop()  # DuckDB gets the machine to itself
    spark_result = {
        "events_per_day": setup.events_per_day, "days": setup.days, "users": setup.users, "bronze_events": n_events,
        "active_users_day_n": seq_inc.details["users"], "users_total": full_totals["rows"],
        "spark_sequences_chain_mean_s": sum(chain_s) / len(chain_s) if chain_s else None,
        "spark_sequences_chain_s": chain_s,
        "spark_sequences_compaction_s": compaction_s, "sequence_compaction_days": period,
        "spark_sequences_incremental_s": seq_inc_s,
        "spark_sequences_incremental_amortized_s": seq_amortized_s, "spark_sequences_full_s": seq_full_s,
        "spark_features_prep_full_day_n_minus_1_s": prep_s,
        "spark_features_incremental_s": feat_s, "spark_features_full_s": feat_full_s,
        "incremental_over_full_features": feat_s / feat_full_s,
        "incremental_over_full_sequences": seq_inc_s / seq_full_s,
        "incremental_amortized_over_full_sequences": seq_amortized_s / seq_full_s,
        "incremental_over_full_sequences_plus_features": (seq_amortized_s + feat_s) / (seq_full_s + feat_full_s),
        "spark_full_sequences_events_per_s": n_events / seq_full_s,
        "spark_features_events_per_s": setup.events_per_day * min(setup.days - 1, max(WINDOW_DAYS)) / feat_full_s,
    }
    print(json.dumps(spark_result), flush=True)  # kept even if the DuckDB half fails
    result = {**spark_result, **_duckdb_half(setup, cfg, last, full_totals, spark_features)}
    if result["duckdb_sequences_full_s"] is not None:
        result["spark_over_duckdb_speed_sequences"] = result["duckdb_sequences_full_s"] / seq_full_s
    result["spark_over_duckdb_speed_features"] = result["duckdb_features_s"] / feat_full_s
    return result


def command_line(
    events_per_day: Annotated[int, typer.Option()] = 2_000_000,
    days: Annotated[int, typer.Option()] = 30,
    users: Annotated[int, typer.Option()] = 1_000_000,
    root: Annotated[Path, typer.Option()] = Path("/tmp/gem-bench-silver"),
    master: Annotated[str, typer.Option()] = "local[2]",
    threads: Annotated[int, typer.Option(help="DuckDB threads (match the Spark cores)")] = 2,
    json_file: Annotated[Path | None, typer.Option("--json", help="also write the result to this file")] = None,
    duckdb_memory: Annotated[str, typer.Option(help="DuckDB memory_limit (Spark is stopped by then)")] = "8GB",
    skip_duckdb_sequences: Annotated[bool, typer.Option(
        "--skip-duckdb-sequences", help="skip DuckDB's full sequences recompute (its ordered aggregation cannot spill)")
    ] = False,
    only_duckdb: Annotated[bool, typer.Option(
        "--duckdb-only", help="only the DuckDB half, over what an earlier run left in --root (printed, not published)")
    ] = False,
    results_dir: ResultsDirOption = RESULTS_DIR,
) -> None:
    setup = Setup(events_per_day, days, users, root, master, threads, skip_duckdb_sequences)
    DUCKDB_MEMORY["limit"] = duckdb_memory
    result = duckdb_only(setup) if only_duckdb else run(setup)
    print(json.dumps(result, indent=2))
    if json_file is not None:
        json_file.write_text(json.dumps(result, indent=2))
    if not only_duckdb:
        publish(result, setup, results_dir)


def main(argv: list[str] | None = None) -> int:
    app = job_app("python -m bench.silver_incremental")
    app.command(help=__doc__.splitlines()[0])(command_line)
    return run_command(app, argv)


def publish(r: dict[str, Any], setup: Setup, results_dir: Path) -> None:
    """The headline seconds and ratios of a full run as the `silver_incremental` result."""
    def seconds(key: str, label: str) -> Figure:
        return Figure(key, label, round(r[key], 1), "s")

    def ratio(key: str, label: str) -> Figure:
        return Figure(key, label, round(r[key], 3), "x")

    figures = [
        Figure("bronze_events", "bronze events synthesized", r["bronze_events"]),
        Figure("users_total", "users with sequences on day N", r["users_total"]),
        seconds("spark_sequences_incremental_s", "Spark: build_sequences day N, incremental"),
        seconds("spark_sequences_incremental_amortized_s",
                "Spark: build_sequences day N, incremental, with the latest compaction's share"),
        seconds("spark_sequences_full_s", "Spark: day N's sequences recomputed from all bronze"),
        ratio("incremental_amortized_over_full_sequences", "sequences: incremental (amortized) / full recompute"),
        seconds("spark_features_incremental_s", "Spark: build_features day N, incremental"),
        seconds("spark_features_full_s", "Spark: build_features day N, full (window rebuilt from bronze)"),
        ratio("incremental_over_full_features", "features: incremental / full recompute"),
        ratio("incremental_over_full_sequences_plus_features", "sequences + features: incremental / full recompute"),
        seconds("duckdb_features_s", "DuckDB: the features of day N"),
        ratio("spark_over_duckdb_speed_features", "features: DuckDB seconds / Spark seconds (Spark's speed-up)"),
    ]
    if r["duckdb_sequences_full_s"] is not None:
        figures += [seconds("duckdb_sequences_full_s", "DuckDB: day N's sequences recomputed from all bronze"),
                    ratio("spark_over_duckdb_speed_sequences",
                          "full sequences: DuckDB seconds / Spark seconds (Spark's speed-up)")]
    record("silver_incremental", "Silver build: the incremental day N against a full recompute, Spark against DuckDB",
           figures, notes=f"{r['events_per_day']:,} events a day for {r['days']} days, {r['users']:,} users; Spark "
                          f"master {setup.master}; DuckDB with {setup.threads} threads and memory_limit "
                          f"{r['duckdb_memory_limit']}."
                          + (f" DuckDB's full sequences: {r['duckdb_sequences_full_error']}"
                             if r.get("duckdb_sequences_full_error") else ""),
           extra={"spark_sequences_chain_mean_s": round(r["spark_sequences_chain_mean_s"] or 0.0, 1),
                  "spark_sequences_compaction_s": [round(x, 1) for x in r["spark_sequences_compaction_s"]],
                  "sequence_compaction_days": r["sequence_compaction_days"],
                  "active_users_day_n": r["active_users_day_n"]},
           results_dir=results_dir)


if __name__ == "__main__":
    sys.exit(main())

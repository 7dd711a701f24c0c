"""silver.user_features / silver.ad_features: point in time (nothing from ds, nothing that arrived on
ds), event-time window edges, hand-checked CTR/CVR and per-surface split, agreement with a plain
Python recount on generated-like data, idempotent reruns, gated inputs, ranges (`--through`) equal to
their days built one by one."""

from __future__ import annotations

import datetime as dt
import random
import subprocess
from typing import Any

import pytest

from gem.days import day_range, shift_day
from gem.lakehouse import completions, tables
from gem.lakehouse.commit import StageContext
from gem.silver.features import bronze_days
from jobs import build_features
from schemas import TABLES
from schemas.events import BRONZE_AD_EVENTS
from schemas.features import (
    AD_METADATA_COLUMNS,
    COUNT_METRICS,
    RATE_METRICS,
    SCOPES,
    SILVER_AD_FEATURES,
    SILVER_USER_FEATURES,
    WINDOW_DAYS,
    counter_name,
)
from schemas.ops import COMPLETIONS
from schemas.tasks import SURFACES
from tests.landing_lines import bronze_event
from tests.support import PYTHON, REPO, lakehouse_rows, make_config, stand_in_records, subprocess_env

START = "2026-01-01"
D = "2026-01-10"  # the feature day under test: counters as of the end of 2026-01-09
BRONZE_DAYS = [shift_day(START, i) for i in range(10)]  # 2026-01-01 .. D (D's events must be ignored)
MS = dt.timedelta(milliseconds=1)


def _at(day: str, hours: float = 0.0) -> dt.datetime:
    return dt.datetime.fromisoformat(day) + dt.timedelta(hours=hours)


def _event(
    event_id: str, arrived: str, user_id: str, event_type: str, event_time: dt.datetime,
    ad_id: str = "a1", surface: str = "reels", campaign_id: str = "c1",
) -> dict[str, Any]:
    """A bronze.ad_events row that arrived on `arrived`."""
    return bronze_event(
        event_id, arrived, event_type, event_time=event_time, user_id=user_id, ad_id=ad_id,
        surface=surface, campaign_id=campaign_id, user_attrs=None,
    )


def _hand_events() -> list[dict[str, Any]]:
    """u_hand on ad a_hand, checked by hand in test_ctr_cvr_and_per_surface_split_by_hand."""
    d1, d3, d5 = shift_day(D, -1), shift_day(D, -3), shift_day(D, -5)
    hand = {"user_id": "u_hand", "ad_id": "a_hand"}
    rows = [
        # D-1: reels 4 impressions, 2 clicks, 1 conversion; fb_feed 2 impressions.
        *[_event(f"h-imp-{k}", d1, event_type="impression", event_time=_at(d1, 1 + k), **hand) for k in range(4)],
        *[_event(f"h-clk-{k}", d1, event_type="click", event_time=_at(d1, 1.5 + k), **hand) for k in range(2)],
        _event("h-conv", d1, event_type="conversion", event_time=_at(d1, 8), **hand),
        *[_event(f"h-fb-{k}", d1, event_type="impression", event_time=_at(d1, 9 + k), surface="fb_feed",
                 campaign_id="c_new", **hand) for k in range(2)],
        # D-3: ig_feed 1 impression + 1 click, under an older campaign.
        *[_event(f"h-ig-{event_type}", d3, event_type=event_type, event_time=_at(d3, hour), surface="ig_feed",
                 campaign_id="c_old", **hand) for event_type, hour in (("impression", 2), ("click", 2.1))],
        # Late, but known by the end of D-1: happened on D-5, arrived on D-1. Counts in 7d/28d.
        _event("h-late-known", d1, event_type="conversion", event_time=_at(d5, 3), surface="ig_feed", **hand),
        # Day D itself: must not count.
        *[_event(f"h-on-d-{k}", D, event_type="impression", event_time=_at(D, 1 + k), **hand) for k in range(3)],
        # Happened on D-1 (the latest event_time of all) but arrived on D: not known at the end of D-1.
        _event("h-late-unknown", D, event_type="click", event_time=_at(d1, 23.5), campaign_id="c_future", **hand),
        # A user and an ad seen only on D get no row.
        _event("f-1", D, "u_future", "impression", _at(D, 2), ad_id="a_future"),
    ]
    return rows


def _edge_events() -> list[dict[str, Any]]:
    """u_edge on a_edge: one impression exactly at D-7 00:00, one a millisecond earlier."""
    d7 = shift_day(D, -7)
    return [
        _event("edge-in", d7, "u_edge", "impression", _at(d7), ad_id="a_edge"),
        _event("edge-out", shift_day(d7, -1), "u_edge", "impression", _at(d7) - MS, ad_id="a_edge"),
    ]


def _generated_events(seed: int = 5) -> list[dict[str, Any]]:
    """Generated-like traffic on every bronze day: impressions, clicks seconds after some of them,
    conversions an hour after some clicks, all within the impression's day; a few arrive a day late."""
    rng = random.Random(seed)
    rows = []
    for day in BRONZE_DAYS:
        for n in range(40):
            user, ad, surface = f"g{rng.randint(0, 7)}", f"ga{rng.randint(0, 4)}", rng.choice(SURFACES)
            t = _at(day, rng.uniform(0, 20))
            late = shift_day(day, 1) if rng.random() < 0.1 else day
            arrived = min(late, D)
            chain = [("impression", t)]
            if rng.random() < 0.3:
                chain.append(("click", t + dt.timedelta(seconds=10)))
                if rng.random() < 0.4:
                    chain.append(("conversion", t + dt.timedelta(hours=1)))
            for event_type, when in chain:
                rows.append(_event(f"g-{day}-{n}-{event_type}", arrived, user, event_type, when, ad, surface,
                                   campaign_id=f"c{rng.randint(0, 2)}"))
    return rows


def _load_bronze(spark, cfg, rows: list[dict[str, Any]], days: list[str] = BRONZE_DAYS) -> None:
    """All bronze days in one append, then the validate_events records build_features gates on (one
    per day in `days`), in one append too (two commits rather than two per day keep the fixture fast)."""
    bronze_path = tables.ensure_table(spark, cfg, BRONZE_AD_EVENTS)
    spark.createDataFrame(rows, BRONZE_AD_EVENTS.spark_schema()).write.format("delta").mode("append").save(bronze_path)
    records = stand_in_records("validate_events", days,
                               rows_written={d: sum(r["ds"].isoformat() == d for r in rows) for d in days},
                               table_versions={BRONZE_AD_EVENTS.name: tables.latest_version(bronze_path)})
    completions_path = tables.ensure_table(spark, cfg, COMPLETIONS)
    completions = spark.createDataFrame(records, COMPLETIONS.spark_schema())
    completions.write.format("delta").mode("append").save(completions_path)


def _reference_row(events: list[dict[str, Any]], ds: str) -> dict[str, Any]:
    """One entity's counters recomputed plainly from its bronze rows, as build_features defines them."""
    end = _at(ds)
    known = [e for e in events if e["ds"].isoformat() < ds and e["event_time"] < end]
    out: dict[str, Any] = {}
    for w in WINDOW_DAYS:
        start = _at(shift_day(ds, -w))
        for surface in SCOPES:
            in_scope = [e for e in known if e["event_time"] >= start and surface in (None, e["surface"])]
            for event_type, metric in COUNT_METRICS.items():
                out[counter_name(metric, w, surface)] = sum(e["event_type"] == event_type for e in in_scope)
            for rate, (num, den) in RATE_METRICS.items():
                n, d = out[counter_name(num, w, surface)], out[counter_name(den, w, surface)]
                out[counter_name(rate, w, surface)] = n / d if d else None
    return out


def _rounded(row: dict[str, Any]) -> dict[str, Any]:
    """Ratios rounded so that Spark's and Python's float division compare equal; None stays None."""
    return {k: round(v, 12) if isinstance(v, float) else v for k, v in row.items()}


def _partition(spark, cfg, schema, key: str, ds: str = D) -> dict[str, dict[str, Any]]:
    rows = tables.read_table(spark, cfg, schema).where(f"ds = DATE'{ds}'").collect()
    return {r[key]: r.asDict() for r in rows}


@pytest.fixture(scope="module")
def built(spark, tmp_path_factory):
    cfg = make_config(tmp_path_factory.mktemp("features"), start_ds=START)
    events = _hand_events() + _edge_events() + _generated_events()
    start_result = build_features.run(StageContext(cfg, spark), START)  # no bronze read at all on the first day
    _load_bronze(spark, cfg, events)
    result = build_features.run(StageContext(cfg, spark), D)
    return cfg, events, result, start_result


def test_nothing_from_day_d_or_arrived_on_d_counts(spark, built):
    cfg, _, _, _ = built
    users = _partition(spark, cfg, SILVER_USER_FEATURES, "user_id")
    ads = _partition(spark, cfg, SILVER_AD_FEATURES, "ad_id")
    hand = users["u_hand"]
    # D-1's 6 impressions count; D's 3 do not.
    assert hand["impressions_1d"] == 6 and hand["reels_impressions_1d"] == 4
    # The click that happened on D-1 but arrived on D does not count in any window.
    assert hand["clicks_1d"] == 2 and hand["clicks_28d"] == 3
    # ... nor does it make the ad's latest attributes (its campaign c_future is the latest by event_time).
    assert ads["a_hand"]["campaign_id"] == "c_new"
    assert "u_future" not in users and "a_future" not in ads


def test_window_edges_are_inclusive_at_the_start_by_event_time(spark, built):
    cfg, _, _, _ = built
    for table, key, entity in ((SILVER_USER_FEATURES, "user_id", "u_edge"), (SILVER_AD_FEATURES, "ad_id", "a_edge")):
        row = _partition(spark, cfg, table, key)[entity]
        assert (row["impressions_1d"], row["impressions_7d"], row["impressions_28d"]) == (0, 1, 2)
        assert row["clicks_7d"] == 0 and row["ctr_7d"] == 0.0 and row["cvr_7d"] is None
        assert row["ctr_1d"] is None


def test_ctr_cvr_and_per_surface_split_by_hand(spark, built):
    cfg, _, _, _ = built
    row = _partition(spark, cfg, SILVER_USER_FEATURES, "user_id")["u_hand"]
    got = lambda metric, w, s=None: row[counter_name(metric, w, s)]
    # 1 day: reels 4/2/1, fb_feed 2/0/0, nothing else.
    assert (got("impressions", 1), got("clicks", 1), got("conversions", 1)) == (6, 2, 1)
    assert got("ctr", 1) == pytest.approx(2 / 6) and got("cvr", 1) == pytest.approx(0.5)
    assert (got("ctr", 1, "reels"), got("cvr", 1, "reels")) == (0.5, 0.5)
    assert (got("impressions", 1, "fb_feed"), got("ctr", 1, "fb_feed"), got("cvr", 1, "fb_feed")) == (2, 0.0, None)
    assert (got("impressions", 1, "ig_feed"), got("ctr", 1, "ig_feed")) == (0, None)
    # 7 days add D-3's ig_feed impression and click and the late (arrived by D-1) ig_feed conversion.
    assert (got("impressions", 7), got("clicks", 7), got("conversions", 7)) == (7, 3, 2)
    assert got("ctr", 7) == pytest.approx(3 / 7) and got("cvr", 7) == pytest.approx(2 / 3)
    assert [got(m, 7, "ig_feed") for m in ("impressions", "clicks", "conversions")] == [1, 1, 1]
    assert got("ctr", 28) == got("ctr", 7)
    for w in WINDOW_DAYS:
        for metric in COUNT_METRICS.values():
            assert got(metric, w) == sum(got(metric, w, s) for s in SURFACES)
    ad = _partition(spark, cfg, SILVER_AD_FEATURES, "ad_id")["a_hand"]
    assert {c: ad[c] for c in AD_METADATA_COLUMNS} == {
        "advertiser_id": "adv1", "campaign_id": "c_new", "objective": "sales", "creative_type": "video",
    }
    assert all(ad[c] == row[c] for c in row if c not in ("user_id", "ds"))  # a_hand has only u_hand's events


def test_every_row_matches_a_plain_recount_and_clicks_never_exceed_impressions(spark, built):
    cfg, events, result, _ = built
    for table, key in ((SILVER_USER_FEATURES, "user_id"), (SILVER_AD_FEATURES, "ad_id")):
        rows = _partition(spark, cfg, table, key)
        seen = {e[key] for e in events if e["ds"].isoformat() < D and e["event_time"] >= _at(shift_day(D, -28))}
        assert set(rows) == seen
        for entity, row in rows.items():
            expected = _reference_row([e for e in events if e[key] == entity], D)
            assert _rounded({c: row[c] for c in expected}) == _rounded(expected), entity
            if entity.startswith("g"):  # generated chains stay within one day: no window splits them
                for w in WINDOW_DAYS:
                    for s in SCOPES:
                        imps, clicks, convs = (row[counter_name(m, w, s)] for m in COUNT_METRICS.values())
                        assert convs <= clicks <= imps, (entity, w, s)
    assert (result.details["users"], result.details["ads"]) == (len(_partition(spark, cfg, SILVER_USER_FEATURES, "user_id")),
                                          len(_partition(spark, cfg, SILVER_AD_FEATURES, "ad_id")))


def test_first_day_has_empty_partitions_and_a_record(spark, built):
    cfg, _, _, start_result = built
    assert (start_result.details["users"], start_result.details["ads"]) == (0, 0)
    record = completions.require_completed(cfg, "build_features", START)
    assert record["rows_written"] == 0
    assert set(record["table_versions"]) == {SILVER_USER_FEATURES.name, SILVER_AD_FEATURES.name}


def test_rerun_rewrites_identical_partitions(spark, built):
    cfg, _, result, _ = built

    def snapshot() -> list[Any]:
        return [sorted(repr(sorted(r.items())) for r in _partition(spark, cfg, t, k).values())
                for t, k in ((SILVER_USER_FEATURES, "user_id"), (SILVER_AD_FEATURES, "ad_id"))]

    before = snapshot()
    again = build_features.run(StageContext(cfg, spark), D)
    assert snapshot() == before
    assert (again.details["users"], again.details["ads"]) == (result.details["users"], result.details["ads"])
    records = tables.read_table(spark, cfg, COMPLETIONS).where(
        f"stage = 'build_features' AND ds = DATE'{D}'"
    ).collect()
    assert len(records) == 1 and records[0]["rows_written"] == result.details["users"] + result.details["ads"]


def test_missing_validate_events_record_fails_naming_the_day(spark, built):
    cfg, _, _, _ = built
    gap_day, day = shift_day(D, 1), shift_day(D, 2)  # bronze gap_day was never validated
    with pytest.raises(
        completions.MissingInputError,
        match=f"needs records that do not exist yet: validate_events ds={gap_day}.*jobs.validate_events --ds {gap_day}",
    ):
        build_features.run(StageContext(cfg, spark), day)
    assert completions.completion(cfg, "build_features", day) is None


def test_bronze_days_read_are_the_longest_window_clipped_at_start_ds(tmp_path):
    cfg = make_config(tmp_path, start_ds=START)
    assert bronze_days(cfg, START) == []
    assert bronze_days(cfg, "2026-01-03") == ["2026-01-01", "2026-01-02"]
    days = bronze_days(cfg, "2026-03-01")
    assert (days[0], days[-1], len(days)) == ("2026-02-01", "2026-02-28", 28)


def test_cli_rejects_a_malformed_day():
    proc = subprocess.run(
        [PYTHON, "-m", "jobs.build_features", "--ds", "2026-02-30"], check=False, cwd=REPO, env=subprocess_env(),
        capture_output=True, text=True,
    )
    assert proc.returncode == 2 and "YYYY-MM-DD" in proc.stderr


# --------------------------------------------------------------------------------------------------
# Incremental (advance from ds-1) == full (sum the whole window), over days where every window loses days.

CHAIN_DAYS = [shift_day("2026-01-29", i) for i in range(4)]  # 01-29 (full: no 01-28) .. 02-01 (incremental)


def _chain_events(seed: int = 11) -> list[dict[str, Any]]:
    """Traffic on every arrival day up to the last chain day, with late arrivals (1-3 days) and
    planted edge cases: an event that arrives already older than the 28-day window, and events
    whose event day is exactly the one leaving the 7- and 28-day windows of a chain day."""
    rng = random.Random(seed)
    rows = []
    for day in [shift_day(START, i) for i in range(32)]:  # 01-01 .. 02-01 (the last chain day's own events)
        for n in range(15):
            user, ad, surface = f"c{rng.randint(0, 9)}", f"ca{rng.randint(0, 3)}", rng.choice(SURFACES)
            event_type = rng.choice(("impression", "impression", "impression", "click", "conversion"))
            lateness = rng.choice((0, 0, 0, 0, 1, 2, 3))
            rows.append(_event(f"c-{day}-{n}", shift_day(day, lateness), user, event_type,
                               _at(day, rng.uniform(0, 23.9)), ad, surface, campaign_id=f"c{rng.randint(0, 2)}"))
    d = CHAIN_DAYS[2]
    rows += [
        _event("c-too-old", shift_day(d, -1), "c_old", "click", _at(shift_day(d, -29), 5)),  # never counts
        _event("c-leaves-28", shift_day(d, -27), "c_edge", "impression", _at(shift_day(d, -29), 23)),
        _event("c-leaves-7", shift_day(d, -7), "c_edge", "click", _at(shift_day(d, -8), 0)),
    ]
    return rows


@pytest.fixture(scope="module")
def chain(spark, tmp_path_factory):
    """Build the chain incrementally, snapshot it, rebuild every day with full=True, snapshot again."""
    cfg = make_config(tmp_path_factory.mktemp("features_chain"), start_ds=START)
    events = [e for e in _chain_events() if e["ds"].isoformat() <= CHAIN_DAYS[-1]]
    _load_bronze(spark, cfg, events, days=sorted({e["ds"].isoformat() for e in events}))

    def snapshot(ds: str) -> dict[str, Any]:
        return {t.name: _partition(spark, cfg, t, k, ds) for t, k in
                ((SILVER_USER_FEATURES, "user_id"), (SILVER_AD_FEATURES, "ad_id"))}

    results = [build_features.run(StageContext(cfg, spark), ds) for ds in CHAIN_DAYS]
    incremental = {ds: snapshot(ds) for ds in CHAIN_DAYS}
    rerun = build_features.run(StageContext(cfg, spark), CHAIN_DAYS[2])
    rerun_rows = snapshot(CHAIN_DAYS[2])
    full_results = [build_features.run(StageContext(cfg, spark), ds, full=True) for ds in CHAIN_DAYS]
    full = {ds: snapshot(ds) for ds in CHAIN_DAYS}
    return cfg, events, results, incremental, rerun, rerun_rows, full_results, full


@pytest.mark.slow  # the chain fixture builds 8 days twice (minutes on 2 cores)
def test_chain_runs_incrementally_after_its_first_day(chain):
    _, _, results, _, rerun, _, full_results, _ = chain
    assert [r.details["incremental"] for r in results] == [False, True, True, True]
    # The first day rewrote the daily counts of its whole window; the others only their newest day.
    assert results[0].details["daily_count_days"] == bronze_days(chain[0], CHAIN_DAYS[0])
    assert [r.details["daily_count_days"] for r in results[1:]] == [[shift_day(d, -1)] for d in CHAIN_DAYS[1:]]
    assert rerun.details["incremental"] and not any(r.details["incremental"] for r in full_results)


@pytest.mark.slow  # the chain fixture builds 8 days twice (minutes on 2 cores)
def test_incremental_equals_full_recompute_and_a_plain_recount(chain):
    _, events, _, incremental, _, _, _, full = chain
    for ds in CHAIN_DAYS:
        assert incremental[ds] == full[ds], ds
        for table, key in ((SILVER_USER_FEATURES.name, "user_id"), (SILVER_AD_FEATURES.name, "ad_id")):
            rows = incremental[ds][table]
            assert rows, (ds, table)
            for entity, row in rows.items():
                expected = _reference_row([e for e in events if e[key] == entity], ds)
                assert _rounded({c: row[c] for c in expected}) == _rounded(expected), (ds, entity)
    # The planted edges, on the day they leave: c_edge's 28-day impression and 7-day click.
    d, before = CHAIN_DAYS[2], CHAIN_DAYS[1]
    edge_before = incremental[before][SILVER_USER_FEATURES.name]["c_edge"]
    assert (edge_before["impressions_28d"], edge_before["clicks_7d"]) == (1, 1)
    edge = incremental[d][SILVER_USER_FEATURES.name]["c_edge"]
    assert (edge["impressions_28d"], edge["clicks_7d"], edge["clicks_28d"]) == (0, 0, 1)
    assert "c_old" not in incremental[d][SILVER_USER_FEATURES.name]


@pytest.mark.slow  # the chain fixture builds 8 days twice (minutes on 2 cores)
def test_incremental_rerun_is_identical(chain):
    _, _, _, incremental, _, rerun_rows, _, _ = chain
    assert rerun_rows == incremental[CHAIN_DAYS[2]]


# --------------------------------------------------------------------------------------------------
# A range (`--through`) == its days built one by one, and == a plain recount over a whole month.

# One range from start_ds (its first day empty); one later, whose window reaches back to start_ds:
# the chain's events leave the 7- and 28-day windows on its second day (without 29 daily runs).
RANGES = [(START, "2026-01-02"), ("2026-01-30", "2026-01-31")]
MONTH = (START, RANGES[-1][-1])
FEATURE_TABLES = ("silver.user_daily_counts", "silver.ad_daily_counts", SILVER_USER_FEATURES.name, SILVER_AD_FEATURES.name)


def _record_counts(record: dict[str, Any]) -> tuple[Any, ...]:
    return record["rows_in"], record["rows_written"], record["quarantined_by_reason"]


@pytest.fixture(scope="module")
def ranged(spark, tmp_path_factory):
    """Two lakehouses on the chain's bronze up to the last range day (late arrivals of 1-3 days; a
    click arriving just after its day left the 28-day window): one builds each of RANGES in one run,
    the other their days one by one (each range's first day in full, its second incrementally)."""
    root = tmp_path_factory.mktemp("features_ranges")
    one_by_one, ranged = (make_config(root / name, start_ds=START) for name in ("daily", "range"))
    events = [e for e in _chain_events() if e["ds"].isoformat() <= MONTH[-1]]  # the last day's arrivals: never read
    for cfg in (one_by_one, ranged):
        _load_bronze(spark, cfg, events, days=sorted({e["ds"].isoformat() for e in events}))
    days = [d for first, through in RANGES for d in day_range(first, through)]
    daily = {d: build_features.run(StageContext(one_by_one, spark), d) for d in days}
    results = [build_features.run(StageContext(ranged, spark), first, through) for first, through in RANGES]
    return one_by_one, ranged, events, daily, results


def test_a_range_equals_its_days_built_one_by_one(spark, ranged):
    """Equal tables (daily counts and features), equal per-day records, one commit per table per range."""
    from deltalake import DeltaTable

    one_by_one, cfg, _, daily, results = ranged
    assert [r.details["incremental"] for r in daily.values()] == [False, True, False, True]
    for name in FEATURE_TABLES:
        assert lakehouse_rows(cfg, name) == lakehouse_rows(one_by_one, name), name
    records = {d: completions.completion(cfg, "build_features", d) for d in daily}
    assert {d: _record_counts(r) for d, r in records.items()} == {d: _record_counts(r.record) for d, r in daily.items()}
    assert records[START]["rows_written"] == 0 and all(r["rows_written"] for d, r in records.items() if d != START)
    for result, (first, through) in zip(results, RANGES, strict=True):
        assert [r["ds"] for r in result.records] == day_range(first, through) and not result.details["incremental"]
        assert result.details["daily_count_days"] == bronze_days(cfg, first, through)
        for name in FEATURE_TABLES:
            writes = [c for c in DeltaTable(tables.table_path(cfg, TABLES[name])).history()
                      if result.records[0]["run_id"] in (c.get("userMetadata") or "")]
            assert len(writes) == 1, name
    # The planted edges were crossed inside the second range: c_edge's 28-day impression and 7-day click.
    edge = {d: _partition(spark, cfg, SILVER_USER_FEATURES, "user_id", d)["c_edge"] for d in RANGES[-1]}
    assert (edge[RANGES[-1][0]]["impressions_28d"], edge[RANGES[-1][0]]["clicks_7d"]) == (1, 1)
    assert [edge[RANGES[-1][1]][c] for c in ("impressions_28d", "clicks_7d", "clicks_28d")] == [0, 0, 1]


@pytest.mark.slow  # a third lakehouse and a 31-day range on top of the `ranged` fixture
def test_a_month_in_one_range_equals_the_daily_runs_and_a_plain_recount(spark, ranged, tmp_path):
    """01-01..01-31 in one run, in a lakehouse of its own (every window edge inside the range): each
    day's rows are those of a plain recount, and the days the daily runs built are theirs, records included."""
    one_by_one, _, events, daily, _ = ranged
    cfg = make_config(tmp_path, start_ds=START)
    _load_bronze(spark, cfg, events, days=sorted({e["ds"].isoformat() for e in events}))
    result = build_features.run(StageContext(cfg, spark), *MONTH)
    assert [r["ds"] for r in result.records] == day_range(*MONTH)
    for name in FEATURE_TABLES[:2]:  # the same arrival days, 01-01..01-30
        assert lakehouse_rows(cfg, name) == lakehouse_rows(one_by_one, name), name
    for d, run in daily.items():
        assert _record_counts(completions.completion(cfg, "build_features", d)) == _record_counts(run.record)
        for table, key in ((SILVER_USER_FEATURES, "user_id"), (SILVER_AD_FEATURES, "ad_id")):
            assert _partition(spark, cfg, table, key, d) == _partition(spark, one_by_one, table, key, d), (d, table)
    for table, key in ((SILVER_USER_FEATURES, "user_id"), (SILVER_AD_FEATURES, "ad_id")):
        rows = tables.read_table(spark, cfg, table).collect()
        for d in day_range(*MONTH):
            got = {r[key]: r.asDict() for r in rows if r["ds"].isoformat() == d}
            known = {e[key] for e in events if e["ds"].isoformat() < d and _at(shift_day(d, -28)) <= e["event_time"] < _at(d)}
            assert set(got) == known, (d, table.name)
            for entity, row in got.items():
                expected = _reference_row([e for e in events if e[key] == entity], d)
                assert _rounded({c: row[c] for c in expected}) == _rounded(expected), (d, entity)

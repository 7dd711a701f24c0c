"""silver.user_sequences: capped per-type sequences, incremental build equal to a full recompute,
only active users written per day, late events in place, idempotent reruns, gated inputs; the
compaction every 2 days holds every user's snapshot, and a build reads it instead of older days."""

from __future__ import annotations

import datetime as dt
import random
import subprocess
from typing import Any

import pytest

from gem.days import shift_day
from gem.lakehouse import completions, tables
from gem.lakehouse.commit import StageContext
from gem.lakehouse.staleness import DONE, STALE, Ledger, all_records
from gem.silver.sequences import advance_sequences
from jobs import build_sequences
from schemas.events import BRONZE_AD_EVENTS
from schemas.ops import COMPLETIONS
from schemas.sequences import (
    SEQUENCE_COLUMNS,
    SEQUENCE_FIELDS,
    SILVER_USER_SEQUENCES,
    SILVER_USER_SEQUENCES_COMPACTED,
)
from tests.landing_lines import bronze_event
from tests.support import PYTHON, REPO, STAND_IN, lakehouse_rows, make_config, subprocess_env

START = "2026-01-01"
DAYS = [shift_day(START, i) for i in range(5)]
CAPS = {"impression": 4, "click": 2, "conversion": 2}
HEAVY_USER = "u0"  # many events every day: its sequences overflow every cap
LATE_USER = "u6"  # a conversion arriving on day 2 that happened between its two day-1 conversions
# Its day-1 click arrives again on day 4, after two newer clicks pushed it out of the capped sequence
# (a repeat further apart than ingest's dedup lookback): the daily merge counts the copy again.
REPEAT_USER = "u7"
USERS = [f"u{i}" for i in range(8)]
COMPACTION_DAYS = 2  # compactions on DAYS[1] and DAYS[3]: the 5-day chain reads through both


def _event(
    event_id: str, ds: str, user_id: str, event_type: str, event_time: dt.datetime, ad: int = 1
) -> dict[str, Any]:
    """A bronze.ad_events row arriving on `ds`."""
    return bronze_event(
        event_id, ds, event_type, event_time=event_time, user_id=user_id, ad_id=f"a{ad}",
        advertiser_id=f"adv{ad % 3}", campaign_id=f"c{ad % 5}", user_attrs=None,
    )


def _random_days(seed: int = 11) -> dict[str, list[dict[str, Any]]]:
    """Five arrival days of events: a random subset of users each day (u5 only on day 1), equal event
    times (ties), and late events (arriving days after they happened)."""
    rng = random.Random(seed)
    days: dict[str, list[dict[str, Any]]] = {}
    for d, ds in enumerate(DAYS):
        day_start = dt.datetime.fromisoformat(ds)
        active = [HEAVY_USER] + [u for u in ("u1", "u2", "u3", "u4") if rng.random() < 0.5] + (["u5"] if d == 0 else [])
        rows = []
        for user in active:
            for k in range(8 if user == HEAVY_USER else rng.randint(1, 4)):
                event_type = rng.choice(["impression", "impression", "click", "conversion"])
                # Whole hours only, so several events share an event_time and event_id must break the tie.
                event_time = day_start + dt.timedelta(hours=rng.randint(0, 3))
                rows.append(_event(f"e{d}-{user}-{k:02d}", ds, user, event_type, event_time, ad=rng.randint(1, 9)))
        days[ds] = rows
    t0 = dt.datetime.fromisoformat(DAYS[0])
    days[DAYS[0]] += [
        _event("c1", DAYS[0], LATE_USER, "conversion", t0 + dt.timedelta(hours=1)),
        _event("c3", DAYS[0], LATE_USER, "conversion", t0 + dt.timedelta(hours=3)),
    ]
    days[DAYS[1]].append(_event("c2", DAYS[1], LATE_USER, "conversion", t0 + dt.timedelta(hours=2)))
    # The heavy user's conversion that happened on day 1 arrives on day 4, older than all it kept.
    days[DAYS[3]].append(_event("late-conv", DAYS[3], HEAVY_USER, "conversion", t0 + dt.timedelta(minutes=30)))
    repeated = _event("r1", DAYS[0], REPEAT_USER, "click", t0)
    days[DAYS[0]].append(repeated)
    days[DAYS[1]] += [_event(f"r{i}", DAYS[1], REPEAT_USER, "click", t0 + dt.timedelta(hours=i)) for i in (2, 3)]
    days[DAYS[3]].append({**repeated, "ds": dt.date.fromisoformat(DAYS[3])})
    return days


def _load_bronze_day(spark, cfg, ds: str, rows: list[dict[str, Any]]) -> None:
    """Bronze ds rows plus the validate_events record build_sequences gates on."""
    df = spark.createDataFrame(rows, BRONZE_AD_EVENTS.spark_schema())
    version = tables.replace_partition(df, cfg, BRONZE_AD_EVENTS, {"ds": ds}).version
    completions.publish_completion(cfg, "validate_events", ds, f"test:{ds}", None, len(rows), {},
                                 {BRONZE_AD_EVENTS.name: version}, reconciliation=STAND_IN)


def _reference_snapshot(events: list[dict[str, Any]]) -> dict[str, Any]:
    """One user's sequences recomputed from scratch, in the shape `_snapshot_of` returns."""
    out: dict[str, Any] = {}
    for event_type, (seq, n) in SEQUENCE_COLUMNS.items():
        of_type = sorted(
            (e for e in events if e["event_type"] == event_type), key=lambda e: (e["event_time"], e["event_id"])
        )
        out[seq] = [tuple(e[f] for f in SEQUENCE_FIELDS[event_type]) for e in of_type[-CAPS[event_type] :]]
        out[n] = len(of_type)
    out["last_event_time"] = max(e["event_time"] for e in events)
    return out


def _snapshot_of(row) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for event_type, (seq, n) in SEQUENCE_COLUMNS.items():
        out[seq] = [tuple(el[f] for f in SEQUENCE_FIELDS[event_type]) for el in row[seq]]
        out[n] = row[n]
    out["last_event_time"] = row["last_event_time"]
    return out


def _silver_rows(spark, cfg) -> dict[tuple[str, str], Any]:
    """(ds, user_id) -> row of silver.user_sequences."""
    rows = tables.read_table(spark, cfg, SILVER_USER_SEQUENCES).collect()
    return {(r["ds"].isoformat(), r["user_id"]): r for r in rows}


def _snapshot_on(silver: dict[tuple[str, str], Any], user: str, ds: str) -> Any:
    """The user's row with the greatest ds <= `ds` (the documented read rule), or None."""
    days = [d for (d, u) in silver if u == user and d <= ds]
    return silver[(max(days), user)] if days else None


def _user_snapshots(spark, cfg, table, user: str) -> dict[str, dict[str, Any]]:
    """ds -> the user's row of `table` (silver or its compaction), as `_snapshot_of` shapes it."""
    rows = tables.read_table(spark, cfg, table).where(f"user_id = '{user}'").collect()
    return {r["ds"].isoformat(): _snapshot_of(r) for r in rows}


@pytest.fixture(scope="module")
def built(spark, tmp_path_factory):
    """Five days loaded into bronze and built incrementally, one build per day."""
    cfg = make_config(tmp_path_factory.mktemp("sequences"), start_ds=START, sequence_caps=CAPS,
                      sequence_compaction_days=COMPACTION_DAYS)
    days = _random_days()
    results = {}
    for ds in DAYS:
        _load_bronze_day(spark, cfg, ds, days[ds])
        results[ds] = build_sequences.run(StageContext(cfg, spark), ds)
    return cfg, days, results


@pytest.mark.parametrize(("ranges", "repeat_counted_again"), [
    # From start_ds through the first compaction, then a range starting later: its previous rows come
    # from the compaction of DAYS[1] (u5's only row) and the daily partition after it. The repeated
    # click's first copy arrived before the second range and had left the cap: counted again, as daily.
    pytest.param([(0, 2), (3, 4)], True, id="two-ranges"),
    # Everything at once: two compaction days in the range; the repeated click's first copy arrived
    # inside the range, so the range counts it once (the documented difference from the daily runs).
    pytest.param([(0, 4)], False, id="one-range"),
])
def test_a_range_writes_what_the_daily_runs_write(spark, built, tmp_path, ranges, repeat_counted_again):
    """The days built as ranges (`run(ctx, ds, through)`, one call each) leave the same sequences,
    compactions and per-day records as the daily chain of `built`: users active on some days only,
    late events, a user seen only before the range; REPEAT_USER's click count is the one exception."""
    cfg_daily, days, _ = built
    cfg = make_config(tmp_path, start_ds=START, sequence_caps=CAPS, sequence_compaction_days=COMPACTION_DAYS)
    for ds in DAYS:
        _load_bronze_day(spark, cfg, ds, days[ds])
    for first, last in ranges:
        result = build_sequences.run(StageContext(cfg, spark), DAYS[first], DAYS[last])
        assert [str(r["ds"]) for r in result.records] == DAYS[first : last + 1]

    for table in (SILVER_USER_SEQUENCES, SILVER_USER_SEQUENCES_COMPACTED):
        others = [[row for row in lakehouse_rows(c, table.name) if repr(REPEAT_USER) not in row] for c in (cfg, cfg_daily)]
        assert others[0] == others[1] != [], table.name
        ranged, daily = (_user_snapshots(spark, c, table, REPEAT_USER) for c in (cfg, cfg_daily))
        for ds, row in daily.items():
            if ds >= DAYS[3] and not repeat_counted_again:
                row = {**row, "n_clicks": row["n_clicks"] - 1}  # the repeat arrived on DAYS[3]
            assert ranged[ds] == row, (table.name, ds)
        assert set(ranged) == set(daily) and daily, table.name
    for ds in DAYS:
        counts = [{k: record[k] for k in ("rows_in", "rows_written", "quarantined_by_reason", "reconciliation")}
                  for record in (completions.completion(c, "build_sequences", ds) for c in (cfg, cfg_daily))]
        assert counts[0] == counts[1], ds


def test_the_block_size_of_a_range_does_not_change_its_rows(spark, built):
    """advance_sequences over the five days from no previous rows: blocks of 2 or 4 days (the range's
    two-step merge, blocks cut mid-range) give the rows of blocks of one day (each day merged alone),
    late events and the heavy user's overflowing caps included."""
    cfg, days, _ = built
    events = spark.createDataFrame([e for ds in DAYS for e in days[ds]], BRONZE_AD_EVENTS.spark_schema())
    empty = spark.createDataFrame([], SILVER_USER_SEQUENCES.spark_schema())

    def rows(block_days: int) -> list[Any]:
        out = advance_sequences(empty, events, cfg.sequence_caps, block_days)
        return sorted(out.collect(), key=lambda r: (r["ds"], r["user_id"]))

    one_day = rows(1)
    assert len(one_day) > len(DAYS)
    for block_days in (2, 4):
        assert rows(block_days) == one_day, block_days


def test_incremental_build_equals_full_recompute_every_user_every_day(spark, built):
    cfg, days, _ = built
    silver = _silver_rows(spark, cfg)
    for i, ds in enumerate(DAYS):
        seen = [e for d in DAYS[: i + 1] for e in days[d]]
        for user in USERS:
            events = [e for e in seen if e["user_id"] == user]
            row = _snapshot_on(silver, user, ds)
            if not events:
                assert row is None, (user, ds)
                continue
            assert _snapshot_of(row) == _reference_snapshot(events), (user, ds)


def test_compaction_holds_every_users_snapshot(spark, built):
    cfg, _, results = built
    silver = _silver_rows(spark, cfg)
    compacted = tables.read_table(spark, cfg, SILVER_USER_SEQUENCES_COMPACTED).collect()
    assert sorted({r["ds"].isoformat() for r in compacted}) == [DAYS[1], DAYS[3]]
    for ds in (DAYS[1], DAYS[3]):
        rows = {r["user_id"]: r for r in compacted if r["ds"].isoformat() == ds}
        expected = {u: _snapshot_on(silver, u, ds) for u in USERS if _snapshot_on(silver, u, ds) is not None}
        assert set(rows) == set(expected), ds
        for user, row in rows.items():
            assert _snapshot_of(row) == _snapshot_of(expected[user]), (user, ds)
        assert results[ds].details["compacted_users"] == len(expected)
        # The day's record names the compaction's version: readers use a compaction only then.
        record = completions.require_completed(cfg, "build_sequences", ds)
        assert SILVER_USER_SEQUENCES_COMPACTED.name in record["table_versions"]
        assert record["reconciliation"] == "checked"
    assert all(results[d].details["compacted_users"] is None for d in (DAYS[0], DAYS[2], DAYS[4]))


def test_a_build_reads_the_last_compaction_not_the_days_before_it(spark, built, tmp_path):
    """Day 5 built after every daily partition up to the day-4 compaction is deleted equals day 5 of the
    full chain: its lookup reads the compaction (and the days after it) only."""
    cfg_full, days, _ = built
    cfg = make_config(tmp_path, start_ds=START, sequence_caps=CAPS, sequence_compaction_days=COMPACTION_DAYS)
    for ds in DAYS[:4]:
        _load_bronze_day(spark, cfg, ds, days[ds])
        build_sequences.run(StageContext(cfg, spark), ds)
    from delta.tables import DeltaTable

    DeltaTable.forPath(spark, tables.table_path(cfg, SILVER_USER_SEQUENCES)).delete(f"ds <= DATE'{DAYS[3]}'")
    _load_bronze_day(spark, cfg, DAYS[4], days[DAYS[4]])
    build_sequences.run(StageContext(cfg, spark), DAYS[4])

    def day5(c) -> dict[str, Any]:
        rows = tables.read_table(spark, c, SILVER_USER_SEQUENCES).where(f"ds = DATE'{DAYS[4]}'").collect()
        return {r["user_id"]: _snapshot_of(r) for r in rows}

    assert day5(cfg) == day5(cfg_full) and day5(cfg)


def test_caps_keep_the_most_recent_events_per_type(spark, built):
    cfg, days, _ = built
    row = _silver_rows(spark, cfg)[(DAYS[-1], HEAVY_USER)]
    everything = [e for ds in DAYS for e in days[ds] if e["user_id"] == HEAVY_USER]
    for event_type, (seq, n) in SEQUENCE_COLUMNS.items():
        of_type = sorted(
            (e for e in everything if e["event_type"] == event_type), key=lambda e: (e["event_time"], e["event_id"])
        )
        assert len(of_type) > CAPS[event_type]  # the fixture really overflows every cap
        assert [el["event_id"] for el in row[seq]] == [e["event_id"] for e in of_type[-CAPS[event_type] :]]
        assert row[n] == len(of_type)
        times = [(el["event_time"], el["event_id"]) for el in row[seq]]
        assert times == sorted(times)


def test_only_users_with_events_get_a_row_and_others_keep_their_snapshot(spark, built):
    cfg, days, results = built
    silver = _silver_rows(spark, cfg)
    for i, ds in enumerate(DAYS):
        active = {e["user_id"] for e in days[ds]}
        assert {u for (d, u) in silver if d == ds} == active, ds
        assert results[ds].details["users"] == len(active)
        record = completions.require_completed(cfg, "build_sequences", ds)
        assert (record["rows_in"], record["rows_written"], record["rows_quarantined"]) == (len(active), len(active), 0)
        if i == 0:
            continue
        for user in set(USERS) - active:
            assert _snapshot_on(silver, user, ds) == _snapshot_on(silver, user, DAYS[i - 1]), (user, ds)
    assert any(set(USERS) - {e["user_id"] for e in days[ds]} for ds in DAYS[1:])  # some user was idle
    assert [d for (d, u) in silver if u == "u5"] == [DAYS[0]]  # active on day 1 only


def test_a_late_event_is_placed_by_event_time(spark, built):
    cfg, _, _ = built
    silver = _silver_rows(spark, cfg)
    assert [el["event_id"] for el in silver[(DAYS[0], LATE_USER)]["conversions"]] == ["c1", "c3"]
    # c2 arrived a day later than c3 but happened before it; with a cap of 2, c1 (the oldest) goes.
    row = silver[(DAYS[1], LATE_USER)]
    assert [el["event_id"] for el in row["conversions"]] == ["c2", "c3"]
    assert row["n_conversions"] == 3
    assert row["last_event_time"] == dt.datetime.fromisoformat(DAYS[0]) + dt.timedelta(hours=3)


def test_rerun_rewrites_identical_partition_contents(spark, built):
    cfg, _, _ = built
    ds = DAYS[2]  # a middle day: later days exist already and must not matter

    def partition() -> list[tuple]:
        rows = tables.read_table(spark, cfg, SILVER_USER_SEQUENCES).where(f"ds = DATE'{ds}'").collect()
        return sorted((r["user_id"], repr(r.asDict(recursive=True))) for r in rows)

    before, record = partition(), completions.completion(cfg, "build_sequences", ds)
    build_sequences.run(StageContext(cfg, spark), ds)
    assert partition() == before
    # The rerun committed a new version of ds with the same rows: its record names the fingerprint
    # the later days' records read, so none of them is stale, and the next day builds on it.
    rerun = completions.completion(cfg, "build_sequences", ds)
    assert rerun["table_versions"] != record["table_versions"]
    assert rerun["table_fingerprints"] == record["table_fingerprints"]
    assert {Ledger(all_records(cfg)).status("build_sequences", d).state for d in DAYS} == {DONE}

    def compaction(day: str) -> list[tuple]:
        rows = tables.read_table(spark, cfg, SILVER_USER_SEQUENCES_COMPACTED).where(f"ds = DATE'{day}'").collect()
        return sorted((r["user_id"], repr(r.asDict(recursive=True))) for r in rows)

    compacted = compaction(DAYS[3])
    build_sequences.run(StageContext(cfg, spark), DAYS[3])  # a compaction day: its compaction is rewritten too
    assert compaction(DAYS[3]) == compacted and compacted
    build_sequences.run(StageContext(cfg, spark), DAYS[4])
    ledger = Ledger(all_records(cfg))
    assert {ledger.status("build_sequences", d).state for d in DAYS} == {DONE}
    records = tables.read_table(spark, cfg, COMPLETIONS).where(
        f"stage = 'build_sequences' AND ds = DATE'{ds}'"
    ).count()
    assert records == 1


def test_a_day_rebuilt_from_other_rows_makes_the_later_days_stale(spark, built):
    cfg, days, _ = built
    ds = DAYS[2]
    try:
        # Bronze of ds with the heavy user's first event of another type: its counts change.
        first = days[ds][0]
        other = "click" if first["event_type"] == "impression" else "impression"
        changed = _event(first["event_id"], ds, first["user_id"], other, first["event_time"])
        _load_bronze_day(spark, cfg, ds, [changed, *days[ds][1:]])
        build_sequences.run(StageContext(cfg, spark), ds)
        ledger = Ledger(all_records(cfg))
        assert [ledger.status("build_sequences", d).state for d in DAYS] == [DONE, DONE, DONE, STALE, STALE]
        assert ledger.status("build_sequences", DAYS[4]).rerun_first == ("build_sequences", DAYS[3])
        with pytest.raises(completions.StaleInputError, match=rf"needs build_sequences ds={DAYS[3]}, which is stale.*"
                           rf"rerun `python -m jobs.build_sequences --ds {DAYS[3]}` first"):
            build_sequences.run(StageContext(cfg, spark), DAYS[4])
    finally:  # the module's other tests read the days as `built` made them
        _load_bronze_day(spark, cfg, ds, days[ds])
        for d in DAYS[2:]:
            build_sequences.run(StageContext(cfg, spark), d)
    assert {Ledger(all_records(cfg)).status("build_sequences", d).state for d in DAYS} == {DONE}


def test_missing_inputs_fail_with_a_clear_message(spark, built):
    # (The start day of `built` was built without any previous build_sequences record.)
    cfg, _, _ = built
    gap_day, day = shift_day(DAYS[-1], 1), shift_day(DAYS[-1], 2)  # gap_day is never built
    with pytest.raises(
        completions.MissingInputError,
        match=f"build_sequences ds={day} needs records that do not exist yet: validate_events ds={day}, "
              f"build_sequences ds={gap_day}; run `python -m jobs.validate_events --ds {day}` first",
    ):
        build_sequences.run(StageContext(cfg, spark), day)

    completions.publish_completion(cfg, "validate_events", day, "test", 0, 0, {}, {})
    with pytest.raises(
        completions.MissingInputError,
        match=f"needs records that do not exist yet: build_sequences ds={gap_day}; "
              f"run `python -m jobs.build_sequences --ds {gap_day}` first",
    ):
        build_sequences.run(StageContext(cfg, spark), day)
    assert completions.completion(cfg, "build_sequences", day) is None


def test_cli_rejects_a_malformed_day():
    proc = subprocess.run(
        [PYTHON, "-m", "jobs.build_sequences", "--ds", "2026-02-30"], check=False, cwd=REPO, env=subprocess_env(),
        capture_output=True, text=True,
    )
    assert proc.returncode == 2 and "YYYY-MM-DD" in proc.stderr

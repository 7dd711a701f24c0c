"""silver.training_examples: click and conversion links, the attribution window's edge, quarantine
reasons and reconciliation, point-in-time features, late-materialized sequences cut strictly before
the impression, agreement with a plain Python implementation of the rules on random traffic,
idempotent reruns, gated inputs, and ranges of days assembled in one run equal to the daily runs."""

from __future__ import annotations

import datetime as dt
import random
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from gem.config import GemConfig
from gem.data.sequences import cut_before
from gem.days import day_range, shift_day
from gem.lakehouse import completions, tables
from gem.lakehouse.commit import StageContext
from gem.pipeline.airflow.orchestration import NOTHING_READY_EXIT
from jobs import assemble_examples, build_features, build_sequences
from schemas.events import BRONZE_AD_EVENTS
from schemas.examples import (
    ATTRIBUTION_REASONS,
    LABEL_COLUMNS,
    SILVER_ATTRIBUTION_QUARANTINE,
    SILVER_CLICK_QUARANTINE,
    SILVER_TRAINING_EXAMPLES,
)
from schemas.features import SILVER_AD_FEATURES, SILVER_USER_FEATURES
from schemas.ops import COMPLETIONS
from schemas.sequences import SEQUENCE_COLUMNS, SILVER_USER_SEQUENCES
from tests.landing_lines import bronze_event
from tests.support import PYTHON, REPO, lakehouse_rows, make_config, stand_in_records, subprocess_env

W = 2  # attribution window (days) of these tests
S = "2026-01-01"  # start_ds
D = "2026-01-03"  # the impression day most rules are checked on
LAST = shift_day(S, 7)  # bronze and validate_events records exist for S..LAST
ASSEMBLED = day_range(S, shift_day(LAST, -W))  # every day whose window closes by LAST
MS = dt.timedelta(milliseconds=1)


def _at(day: str, hours: float = 0.0, seconds: float = 0.0) -> dt.datetime:
    return dt.datetime.fromisoformat(day) + dt.timedelta(hours=hours, seconds=seconds)


def _ev(event_id: str, arrived: str, event_type: str, when: dt.datetime, user: str, ad: str,
        surface: str = "reels", conversion_type: str = "lead") -> dict[str, Any]:
    extra = {"conversion_type": conversion_type} if event_type == "conversion" else {}
    return bronze_event(event_id, arrived, event_type, event_time=when, user_id=user, ad_id=ad, surface=surface,
                        user_attrs=None, **extra)


T = _at(D, 12)  # the impression whose sequence is materialized


def _planted() -> list[dict[str, Any]]:
    d1, dw, dw1 = shift_day(D, 1), shift_day(D, W), shift_day(D, W + 1)
    return [
        # --- late materialization: u_seq's events on earlier days, just before, at and after T.
        _ev("s-old-imp", S, "impression", _at(S, 5), "u_seq", "a_x"),
        _ev("s-old-clk", S, "click", _at(S, 5, 30), "u_seq", "a_x"),
        _ev("s-prev-imp", shift_day(D, -1), "impression", _at(shift_day(D, -1), 23), "u_seq", "a_y"),
        _ev("s-before", D, "click", T - MS, "u_seq", "a_y"),
        _ev("s-target", D, "impression", T, "u_seq", "a_z"),
        _ev("s-same-ms", D, "impression", T, "u_seq", "a_w"),
        _ev("s-after", D, "impression", T + MS, "u_seq", "a_z"),
        _ev("s-after-clk", D, "click", T + dt.timedelta(seconds=5), "u_seq", "a_z"),
        # --- attribution edge: a click on D; a lead on D+W arriving D+W counts; an app install on D+W
        # arriving D+W+1 and an offsite purchase on D+W+1 do not.
        _ev("e-imp", D, "impression", _at(D, 10), "u_edge", "a_edge"),
        _ev("e-clk", D, "click", _at(D, 10, 20), "u_edge", "a_edge"),
        _ev("e-conv-in", dw, "conversion", _at(dw, 23.9), "u_edge", "a_edge", conversion_type="lead"),
        _ev("e-conv-late", dw1, "conversion", _at(dw, 23.95), "u_edge", "a_edge", conversion_type="app_install"),
        _ev("e-conv-out", dw1, "conversion", _at(dw1, 1), "u_edge", "a_edge", conversion_type="offsite_purchase"),
        # --- last click wins: clicks on D and D+1 on the same ad; the conversion goes to D+1's impression.
        _ev("l-imp-a", D, "impression", _at(D, 8), "u_last", "a_last"),
        _ev("l-clk-a", D, "click", _at(D, 8, 10), "u_last", "a_last"),
        _ev("l-imp-b", d1, "impression", _at(d1, 8), "u_last", "a_last"),
        _ev("l-clk-b", d1, "click", _at(d1, 8, 10), "u_last", "a_last"),
        _ev("l-conv", d1, "conversion", _at(d1, 12), "u_last", "a_last"),
        # --- a click just after midnight labels the impression of D it follows.
        _ev("m-imp", D, "impression", _at(D, 23, 3590), "u_mid", "a_mid"),
        _ev("m-clk", d1, "click", _at(d1, 0, 20), "u_mid", "a_mid"),
        # --- quarantine: a conversion without any click; one whose click has no impression (the
        # impression is 2 hours before the click, outside the 60-minute click window).
        _ev("o-conv", D, "conversion", _at(D, 15), "u_orphan", "a_orphan"),
        _ev("n-imp", D, "impression", _at(D, 1), "u_noimp", "a_noimp"),
        _ev("n-clk", D, "click", _at(D, 3), "u_noimp", "a_noimp"),
        _ev("n-conv", D, "conversion", _at(D, 4), "u_noimp", "a_noimp"),
    ]


W1 = 1  # the range tests' window: each day's reads (D-3 .. D+1) overlap its neighbours'
RANGES = ((S, shift_day(S, 2)), (shift_day(S, 3), shift_day(S, 4)))  # the first starts at start_ds
RANGE_DAYS = day_range(RANGES[0][0], RANGES[-1][1])


def _range_edges() -> list[dict[str, Any]]:
    """Decisions a range run could get wrong by seeing further back than the daily run of the day
    that owns them (the run of D reads from D-3 with W1 = 1), and late impressions."""
    s1, s2, s4 = (shift_day(S, n) for n in (1, 2, 4))
    return [
        # A conversion 3 days late (arrived_after_window): its click on S is before what the run of
        # its arrival day S+4 reads, so the quarantine names no click.
        _ev("x-imp", S, "impression", _at(S, 9.9), "u_range_x", "a_range_x"),
        _ev("x-clk", S, "click", _at(S, 10), "u_range_x", "a_range_x"),
        _ev("x-conv", s4, "conversion", _at(s1, 10), "u_range_x", "a_range_x"),
        # A click 3 days late whose only impression arrived on S: a click linking no impression.
        _ev("y-imp", S, "impression", _at(S, 23.8), "u_range_y", "a_range_y"),
        _ev("y-clk", s4, "click", _at(s1, 0.2), "u_range_y", "a_range_y"),
        # A late impression (event day S, arrived S+4: features of S, outside the second range) that
        # its late click labels, though an impression that arrived on S is newer.
        _ev("z-new", S, "impression", _at(S, 23.7), "u_range_z", "a_range_z"),
        _ev("z-late", s4, "impression", _at(S, 23.5), "u_range_z", "a_range_z"),
        _ev("z-clk", s4, "click", _at(s1, 0.1), "u_range_z", "a_range_z"),
        # Late impressions: event day S+1 inside the first range; one before start_ds (no features).
        _ev("w-imp", s2, "impression", _at(s1, 12), "u_range_w", "a_range_w"),
        _ev("w-clk", s2, "click", _at(s1, 12.1), "u_range_w", "a_range_w"),
        _ev("v-imp", s1, "impression", _at(shift_day(S, -1), 22), "u_range_v", "a_range_v"),
    ]


def _random_traffic(seed: int = 11) -> list[dict[str, Any]]:
    """Impressions on every day; clicks seconds to 90 minutes later (some outside the click window),
    a few clicks with no impression; conversions 0-3 days after clicks; arrivals 0-2 days late."""
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []

    def arrival(when: dt.datetime) -> str | None:
        day = shift_day(when.date().isoformat(), rng.choice([0, 0, 0, 1, 2, 3]))
        return day if day <= LAST else None

    for day in day_range(S, LAST):
        for n in range(60):
            user, ad, surface = f"r{rng.randint(0, 5)}", f"ra{rng.randint(0, 3)}", rng.choice(["reels", "fb_feed"])
            t = _at(day, rng.uniform(0, 23.9))
            rows.append(_ev(f"r-{day}-{n}-i", day, "impression", t, user, ad, surface))
            if rng.random() < 0.5:
                k = t + dt.timedelta(minutes=rng.choice([0.2, 5, 45, 90]))
                if rng.random() < 0.1:  # a click on an ad the user was not shown
                    ad = "ra-none"
                if (arrived := arrival(k)) is not None:
                    rows.append(_ev(f"r-{day}-{n}-k", arrived, "click", k, user, ad, surface))
                for j in range(rng.choice([0, 0, 1, 2])):
                    c = k + dt.timedelta(hours=rng.uniform(0, 72))
                    ctype = rng.choice(["lead", "app_install", "offsite_purchase"])
                    if (arrived := arrival(c)) is not None:
                        rows.append(_ev(f"r-{day}-{n}-c{j}", arrived, "conversion", c, user, ad, surface, ctype))
    return rows


def _append_records(spark, cfg, records: list[dict[str, Any]]) -> None:
    path = tables.ensure_table(spark, cfg, COMPLETIONS)
    spark.createDataFrame(records, COMPLETIONS.spark_schema()).write.format("delta").mode("append").save(path)


@pytest.fixture(scope="module")
def inputs(spark, tmp_path_factory) -> tuple[Path, list[dict[str, Any]]]:
    """A lakehouse of everything assemble_examples reads, none of which depends on the window:
    bronze S..LAST planted (_planted, _range_edges) + random traffic, validate records for all of
    it; sequences built for S..D, features for the assembled days (silver validation records stand
    in for validate_silver, whose suites are tested in test_quality_silver). -> (its root, to copy;
    the events)."""
    cfg = make_config(tmp_path_factory.mktemp("inputs"), start_ds=S)
    events = _planted() + _range_edges() + _random_traffic()
    path = tables.ensure_table(spark, cfg, BRONZE_AD_EVENTS)
    spark.createDataFrame(events, BRONZE_AD_EVENTS.spark_schema()).write.format("delta").mode("append").save(path)
    bronze = {BRONZE_AD_EVENTS.name: tables.latest_version(path)}  # what the validation stand-ins validated
    _append_records(spark, cfg, stand_in_records("validate_events", day_range(S, LAST), table_versions=bronze))
    # Each stage over its days in one ranged run (one commit per table, one record per day): what
    # the days' own runs write (test_build_sequences, test_build_features), in one Spark pass per stage.
    build_sequences.run(StageContext(cfg, spark), S, D)
    built = build_features.run(StageContext(cfg, spark), ASSEMBLED[0], ASSEMBLED[-1])
    _append_records(spark, cfg, stand_in_records("validate_silver", list(ASSEMBLED), table_versions={
        t: built.table_versions[t] for t in (SILVER_USER_FEATURES.name, SILVER_AD_FEATURES.name)}))
    return Path(cfg.lakehouse_uri), events


def _lakehouse(inputs, tmp_path_factory, window_days: int) -> GemConfig:
    """A config over a fresh copy of the inputs' lakehouse, with attribution_window_days = window_days."""
    cfg = make_config(tmp_path_factory.mktemp("lakehouse"), start_ds=S, attribution_window_days=window_days)
    shutil.copytree(inputs[0], cfg.lakehouse_uri)
    return cfg


@pytest.fixture(scope="module")
def assembled(spark, inputs, tmp_path_factory):
    """The inputs with window W; examples assembled for every ready day, one run per day."""
    cfg = _lakehouse(inputs, tmp_path_factory, W)
    results = {day: assemble_examples.run(StageContext(cfg, spark), day) for day in ASSEMBLED}
    return cfg, inputs[1], results


def _examples(spark, cfg, ds: str | None = None) -> dict[str, dict[str, Any]]:
    df = tables.read_table(spark, cfg, SILVER_TRAINING_EXAMPLES)
    if ds is not None:
        df = df.where(f"ds = DATE'{ds}'")
    return {r["impression_id"]: r.asDict() for r in df.collect()}


def _quarantine(spark, cfg) -> dict[str, dict[str, Any]]:
    return {r["conversion_id"]: r.asDict() for r in tables.read_table(spark, cfg, SILVER_ATTRIBUTION_QUARANTINE).collect()}


def _labels(row: dict[str, Any]) -> dict[str, int]:
    return {t: row[c] for t, c in LABEL_COLUMNS.items()}


def test_attribution_window_edge(spark, assembled):
    cfg, _, _ = assembled
    ex, q = _examples(spark, cfg), _quarantine(spark, cfg)
    # The lead on D+W that arrived on D+W counts; nothing else does.
    assert _labels(ex["e-imp"]) == {"click": 1, "lead": 1, "app_install": 0, "offsite_purchase": 0}
    assert ex["e-imp"]["attributed_conversions"] == 1
    # Happened on D+W but arrived on D+W+1: too late for D's impression.
    assert q["e-conv-late"]["reason"] == "after_impression_window" and q["e-conv-late"]["impression_id"] == "e-imp"
    # Happened on D+W+1: the click is outside the window before it.
    assert q["e-conv-out"]["reason"] == "no_click_in_window"
    assert {q[c]["ds"].isoformat() for c in ("e-conv-late", "e-conv-out")} == {shift_day(D, W + 1)}


def test_last_click_and_click_links(spark, assembled):
    cfg, _, _ = assembled
    ex = _examples(spark, cfg)
    assert (ex["l-imp-a"]["label_click"], ex["l-imp-a"]["label_lead"]) == (1, 0)
    assert (ex["l-imp-b"]["label_click"], ex["l-imp-b"]["label_lead"]) == (1, 1)
    assert ex["m-imp"]["ds"].isoformat() == D and ex["m-imp"]["label_click"] == 1
    assert ex["n-imp"]["label_click"] == 0  # its click came 2 hours later: outside the click window
    assert _labels(ex["s-after"]) == {"click": 1, "lead": 0, "app_install": 0, "offsite_purchase": 0}
    assert ex["s-target"]["label_click"] == 0


def test_unmatched_conversions_quarantined_and_counts_reconcile(spark, assembled):
    cfg, events, results = assembled
    q = _quarantine(spark, cfg)
    assert q["o-conv"]["reason"] == "no_click_in_window" and q["o-conv"]["click_id"] is None
    assert q["n-conv"]["reason"] == "click_without_impression" and q["n-conv"]["click_id"] == "n-clk"
    for day, r in results.items():
        arrived = [e for e in events if e["event_type"] == "conversion" and e["ds"].isoformat() == day]
        impressions = [e for e in events if e["event_type"] == "impression" and e["ds"].isoformat() == day]
        assert r.details["conversions_in"] == len(arrived)
        conversions_quarantined = sum(r.quarantined_by_reason.values()) - r.details["orphan_clicks"]
        assert r.details["attributed"] + conversions_quarantined == len(arrived)
        assert r.details["examples"] == len(impressions)
        record = completions.completion(cfg, "assemble_examples", day)
        clicks = [e for e in events if e["event_type"] == "click" and e["ds"].isoformat() == day]
        assert r.details["clicks_in"] == len(clicks)
        assert record["rows_in"] == len(arrived) + len(impressions) + len(clicks)
        assert record["rows_quarantined"] == (sum(1 for c in q.values() if c["ds"].isoformat() == day)
                                              + r.details["orphan_clicks"])
    # Attributed conversions land on examples: every day whose conversions can only go to assembled
    # impression days (arrival day X attributes to X-W..X) sums up on both sides.
    closed = [d for d in ASSEMBLED if shift_day(d, -W) >= S]
    attributed_by_arrival = sum(results[d].details["attributed"] for d in closed)
    ex = _examples(spark, cfg)
    conversion_arrival = {e["event_id"]: e["ds"].isoformat() for e in events if e["event_type"] == "conversion"}
    assert attributed_by_arrival == _reference_attributed_count(events, closed, conversion_arrival)
    assert sum(row["attributed_conversions"] for row in ex.values()) >= attributed_by_arrival


def test_clicks_linking_no_impression_are_quarantined_and_counted(spark, assembled):
    """Every click that arrived on an assembled day is either linked (it labels an impression) or
    in silver.click_quarantine with its reason, counted in that day's record."""
    cfg, events, results = assembled
    links = _reference_links(events)
    rows = tables.read_table(spark, cfg, SILVER_CLICK_QUARANTINE).collect()
    assert "n-clk" in {r.click_id for r in rows}  # its impression is 2 hours before it
    for day, r in results.items():
        expected = sorted(e["event_id"] for e in events if e["event_type"] == "click"
                          and e["ds"].isoformat() == day and links[e["event_id"]] is None)
        got = sorted(x.click_id for x in rows if x.ds.isoformat() == day)
        assert got == expected and r.details["orphan_clicks"] == len(expected), day
        assert {x.reason for x in rows if x.ds.isoformat() == day} <= {"no_impression_in_click_window"}
        assert r.quarantined_by_reason.get("no_impression_in_click_window", 0) == len(expected)
    assert sum(r.details["orphan_clicks"] for r in results.values()) > 0


def _reference_attributed_count(events, days, conversion_arrival) -> int:
    outcomes = _reference_outcomes(events)
    return sum(1 for cid, (reason, _) in outcomes.items() if reason is None and conversion_arrival[cid] in days)


# --------------------------------------------------------------------------------------------------
# A plain Python implementation of schemas/examples.py's rules.


def _reference_links(events) -> dict[str, dict[str, Any] | None]:
    imps = [e for e in events if e["event_type"] == "impression"]
    links = {}
    for k in (e for e in events if e["event_type"] == "click"):
        cands = [i for i in imps if (i["user_id"], i["ad_id"], i["surface"]) == (k["user_id"], k["ad_id"], k["surface"])
                 and k["event_time"] - dt.timedelta(minutes=60) <= i["event_time"] <= k["event_time"]
                 and i["ds"] <= k["ds"]]
        links[k["event_id"]] = max(cands, key=lambda i: (i["event_time"], i["event_id"])) if cands else None
    return links


def _reference_outcomes(events) -> dict[str, tuple[str | None, dict[str, Any] | None]]:
    """conversion id -> (reason or None, the impression it is attributed to)."""
    links = _reference_links(events)
    clicks = [e for e in events if e["event_type"] == "click"]
    out = {}
    for c in (e for e in events if e["event_type"] == "conversion"):
        day = c["event_time"].date()
        if (c["ds"] - day).days > W:
            out[c["event_id"]] = ("arrived_after_window", None)
            continue
        cands = [k for k in clicks if (k["user_id"], k["ad_id"]) == (c["user_id"], c["ad_id"])
                 and k["event_time"] <= c["event_time"] and (day - k["event_time"].date()).days <= W
                 and k["ds"] <= c["ds"]]
        if not cands:
            out[c["event_id"]] = ("no_click_in_window", None)
            continue
        imp = links[max(cands, key=lambda k: (k["event_time"], k["event_id"]))["event_id"]]
        if imp is None:
            out[c["event_id"]] = ("click_without_impression", None)
        elif (c["ds"] - imp["ds"]).days > W:
            out[c["event_id"]] = ("after_impression_window", imp)
        else:
            out[c["event_id"]] = (None, imp)
    return out


def test_labels_and_quarantine_equal_a_plain_python_reference(spark, assembled):
    cfg, events, _ = assembled
    by_id = {e["event_id"]: e for e in events}
    click_days: dict[str, list[dt.date]] = {}  # impression id -> arrival days of its clicks
    for kid, imp in _reference_links(events).items():
        if imp is not None:
            click_days.setdefault(imp["event_id"], []).append(by_id[kid]["ds"])
    outcomes = _reference_outcomes(events)
    converted: dict[str, set[str]] = {}  # impression id -> conversion types attributed
    for cid, (reason, imp) in outcomes.items():
        if reason is None:
            converted.setdefault(imp["event_id"], set()).add(by_id[cid]["conversion_type"])
    expected: dict[str, dict[str, int]] = {}
    for i in (e for e in events if e["event_type"] == "impression" and e["ds"].isoformat() in ASSEMBLED):
        window_end = dt.date.fromisoformat(shift_day(i["ds"].isoformat(), W))
        labels = {t: int(t in converted.get(i["event_id"], set())) for t in LABEL_COLUMNS}
        labels["click"] = int(any(d <= window_end for d in click_days.get(i["event_id"], [])))
        expected[i["event_id"]] = labels
    got = {iid: _labels(row) for iid, row in _examples(spark, cfg).items()}
    assert got == expected
    assert sum(v["click"] for v in got.values()) > 50 and sum(v["lead"] for v in got.values()) > 5
    expected_q = {cid: reason for cid, (reason, _) in outcomes.items()
                  if reason is not None and by_id[cid]["ds"].isoformat() in ASSEMBLED}
    assert {cid: r["reason"] for cid, r in _quarantine(spark, cfg).items()} == expected_q
    assert len(set(expected_q.values())) == 4  # every reason occurs


def test_features_are_the_impression_days_counters(spark, assembled):
    cfg, _, _ = assembled
    row = _examples(spark, cfg, D)["s-target"]
    user = tables.read_table(spark, cfg, build_features.SILVER_USER_FEATURES).where(
        f"ds = DATE'{D}' AND user_id = 'u_seq'").collect()[0]
    assert row["features_ds"].isoformat() == D and row["sequence_ds"].isoformat() == D
    # As of the end of D-1: S's impression + click and D-1's impression; nothing of D.
    assert (row["user_impressions_28d"], row["user_clicks_28d"]) == (user["impressions_28d"], user["clicks_28d"]) == (2, 1)
    assert row["user_impressions_1d"] == 1 and row["ad_impressions_28d"] == 0  # a_z first shown on D


def test_materialized_sequence_is_strictly_before_the_impression(spark, assembled):
    cfg, _, _ = assembled
    ex = _examples(spark, cfg, D)
    snapshot = tables.read_table(spark, cfg, SILVER_USER_SEQUENCES).where(
        f"ds = DATE'{ex['s-target']['sequence_ds']}' AND user_id = 'u_seq'").collect()[0].asDict(recursive=True)
    ids = {}
    for event_type, (seq, _) in SEQUENCE_COLUMNS.items():
        ids[event_type] = [e["event_id"] for e in cut_before(snapshot[seq], ex["s-target"]["impression_time"])]
    # Earlier days and the click a millisecond before; not the target, its same-millisecond
    # neighbour, or anything after.
    assert ids == {"impression": ["s-old-imp", "s-prev-imp"], "click": ["s-old-clk", "s-before"], "conversion": []}
    # The impression a millisecond later sees both impressions at T and the click before it.
    after = [e["event_id"] for e in cut_before(snapshot["impressions"], ex["s-after"]["impression_time"])]
    assert after == ["s-old-imp", "s-prev-imp", "s-same-ms", "s-target"]


def test_rerun_is_idempotent(spark, assembled):
    cfg, _, results = assembled
    before = (_examples(spark, cfg, D), sorted(_quarantine(spark, cfg)))
    again = assemble_examples.run(StageContext(cfg, spark), D)
    assert (again.details["examples"], again.details["attributed"], again.quarantined_by_reason) == (
        results[D].details["examples"], results[D].details["attributed"], results[D].quarantined_by_reason)
    assert (_examples(spark, cfg, D), sorted(_quarantine(spark, cfg))) == before


def test_missing_inputs_fail_naming_the_stage(spark, tmp_path):
    cfg = make_config(tmp_path, start_ds=S, attribution_window_days=W)
    _append_records(spark, cfg, stand_in_records("validate_events", day_range(S, shift_day(D, W - 1))))
    with pytest.raises(completions.MissingInputError, match=f"validate_events.*ds={shift_day(D, W)}"):
        assemble_examples.run(StageContext(cfg, spark), D)


def test_cli_ready_on_before_any_window_closes_exits_99(tmp_path):
    cfg_path = tmp_path / "cfg.yaml"
    cfg_path.write_text(f"lakehouse_uri: {tmp_path / 'lake'}\nstart_ds: '{S}'\nattribution_window_days: {W}\n")
    proc = subprocess.run(
        [PYTHON, "-m", "jobs.assemble_examples", "--ready-on", shift_day(S, W - 1)],
        cwd=REPO, env=subprocess_env(cfg_path), capture_output=True, text=True, timeout=120, check=False,
    )
    assert proc.returncode == NOTHING_READY_EXIT, proc.stderr
    assert "nothing to do" in proc.stdout


# --------------------------------------------------------------------------------------------------
# A range of days in one run equals the daily runs.

@pytest.fixture(scope="module")
def range_and_daily(spark, inputs, tmp_path_factory):
    """Two copies of the inputs with window W1: RANGE_DAYS assembled one run per day in the first,
    one run per range of RANGES in the second."""
    daily, ranged = (_lakehouse(inputs, tmp_path_factory, W1) for _ in range(2))
    for day in RANGE_DAYS:
        assemble_examples.run(StageContext(daily, spark), day)
    results = [assemble_examples.run(StageContext(ranged, spark), first, last) for first, last in RANGES]
    return daily, ranged, results


def test_range_run_equals_daily_runs(range_and_daily):
    daily, ranged, results = range_and_daily
    assert [len(r.records) for r in results] == [len(day_range(*r)) for r in RANGES]
    for table in (SILVER_TRAINING_EXAMPLES, SILVER_ATTRIBUTION_QUARANTINE, SILVER_CLICK_QUARANTINE):
        rows = lakehouse_rows(daily, table.name)
        assert rows and lakehouse_rows(ranged, table.name) == rows, table.name
    for day in RANGE_DAYS:
        one, many = (completions.completion(cfg, "assemble_examples", day) for cfg in (daily, ranged))
        counts = ("rows_in", "rows_written", "rows_quarantined", "quarantined_by_reason", "reconciliation")
        assert {k: many[k] for k in counts} == {k: one[k] for k in counts}, day


def test_range_covers_the_edge_cases(spark, range_and_daily):
    _, ranged, results = range_and_daily
    ex = _examples(spark, ranged)
    q = _quarantine(spark, ranged)
    orphans = {r.click_id: r.ds.isoformat() for r in tables.read_table(spark, ranged, SILVER_CLICK_QUARANTINE).collect()}
    s4 = shift_day(S, 4)
    assert (q["x-conv"]["reason"], q["x-conv"]["click_id"], q["x-conv"]["ds"].isoformat()) == ("arrived_after_window", None, s4)
    assert orphans["y-clk"] == s4
    assert (ex["z-late"]["label_click"], ex["z-late"]["features_ds"].isoformat()) == (1, S)
    assert ex["z-new"]["label_click"] == 0
    assert (ex["w-imp"]["features_ds"].isoformat(), ex["w-imp"]["ds"].isoformat()) == (shift_day(S, 1), shift_day(S, 2))
    assert ex["v-imp"]["user_impressions_28d"] == 0
    # Every reason occurs, and labels of every kind: the equality above is not over empty tables.
    assert {r["reason"] for r in q.values()} == set(ATTRIBUTION_REASONS)
    assert sum(r["attributed_conversions"] for r in ex.values()) > 5
    assert sum(r.details["orphan_clicks"] for r in results) > 1


def test_cli_through_goes_with_ds():
    with pytest.raises(SystemExit) as exit_info:
        assemble_examples.main(["--ready-on", S, "--through", shift_day(S, 1)])
    assert exit_info.value.code == 2

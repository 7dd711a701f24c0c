"""Silver data-quality suites: clean partitions pass; each broken rule fails on its own, by name."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from gem.data.encode import hash_ids
from gem.lakehouse import tables
from gem.quality import silver as qs
from gem.quality.bronze import statistics_frame
from gem.quality.runner import DataQualityError, format_failures, validate
from schemas.examples import LABEL_COLUMNS, SILVER_TRAINING_EXAMPLES
from schemas.features import COUNTER_COLUMNS, SILVER_USER_FEATURES
from schemas.ids import HASHED_IDS, hash_column
from schemas.sequences import SILVER_USER_SEQUENCES
from tests.support import make_config

D = "2026-01-05"
DAY = dt.date.fromisoformat(D)


def _t(hours: float) -> dt.datetime:
    return dt.datetime.fromisoformat(D) + dt.timedelta(hours=hours)


def _failed(report) -> set[str]:
    return {o.rule for o in report.failed_critical}


@pytest.fixture(scope="module")
def cfg(tmp_path_factory):
    return make_config(
        tmp_path_factory.mktemp("silver_dq"),
        sequence_caps={"impression": 3, "click": 2, "conversion": 2},
        quality={"label_rates": {"click": {"min": 0.0, "max": 0.6}, "offsite_purchase": {"min": 0.0, "max": 0.6},
                                 "app_install": {"min": 0.0, "max": 0.6}, "lead": {"min": 0.0, "max": 0.6}},
                 "min_sequence_margin": 0.5},
    )


# --------------------------------------------------------------------------------------------------
# silver.user_sequences


def _element(hours: float, event_id: str) -> dict[str, Any]:
    return {"event_time": _t(hours), "event_id": event_id, "ad_id": "a1", "advertiser_id": "adv1",
            "campaign_id": "c1", "surface": "reels", "objective": "sales"}


def _sequence_row(user: str, impressions: list[dict[str, Any]], n_impressions: int | None = None,
                  last: float = 23.0) -> dict[str, Any]:
    return {"ds": DAY, "user_id": user, "impressions": impressions, "clicks": [], "conversions": [],
            "n_impressions": len(impressions) if n_impressions is None else n_impressions, "n_clicks": 0,
            "n_conversions": 0, "last_event_time": _t(last)}


def _sequences(spark, rows):
    return spark.createDataFrame(rows, SILVER_USER_SEQUENCES.spark_schema())


def test_clean_sequences_pass(spark, cfg):
    rows = [_sequence_row("u1", [_element(1, "e1"), _element(2, "e2")]),
            _sequence_row("u2", [_element(1, "e3"), _element(1, "e4"), _element(5, "e5")], n_impressions=9)]
    report = validate(cfg, qs.sequence_checks(_sequences(spark, rows), cfg), "test.sequences", qs.sequence_expectations(cfg), D,
                      raise_on_critical=False)
    assert report.success, [o.describe() for o in report.outcomes if not o.success]


@pytest.mark.parametrize("row, rule", [
    # Over the cap is also longer than min(count, cap): both rules name it.
    (_sequence_row("u_cap", [_element(h, f"c{h}") for h in range(4)]),
     "sequences_within_caps,sequence_length_is_min_count_cap"),
    (_sequence_row("u_len", [_element(1, "l1")], n_impressions=2), "sequence_length_is_min_count_cap"),
    (_sequence_row("u_order", [_element(2, "o1"), _element(1, "o2")]), "sequences_strictly_ordered"),
    (_sequence_row("u_tie", [_element(1, "t2"), _element(1, "t1")]), "sequences_strictly_ordered"),
    (_sequence_row("u_last", [_element(1, "x1"), _element(6, "x2")], last=5), "last_event_time_is_latest"),
])
def test_each_broken_sequence_rule_fails_alone(spark, cfg, row, rule):
    rows = [_sequence_row("u_ok", [_element(1, "ok")]), row]
    report = validate(cfg, qs.sequence_checks(_sequences(spark, rows), cfg), "test.sequences", qs.sequence_expectations(cfg), D,
                      raise_on_critical=False)
    assert _failed(report) == set(rule.split(","))


def test_duplicate_user_fails(spark, cfg):
    rows = [_sequence_row("u_dup", [_element(1, "d1")]), _sequence_row("u_dup", [_element(2, "d2")])]
    report = validate(cfg, qs.sequence_checks(_sequences(spark, rows), cfg), "test.sequences", qs.sequence_expectations(cfg), D,
                      raise_on_critical=False)
    assert _failed(report) == {"one_row_per_user"}
    # A row rule's line: the group that broke it (the user masked), and the contract that sets it.
    (failure,) = DataQualityError(format_failures([report]), [report]).failures
    assert failure.line(None) == (f"FAILED test.sequences/one_row_per_user: found 2 (ds={D}, user_id=***); "
                                  "bound one row per user_id a day; "
                                  "set by the silver.user_sequences contract in schemas/ (not a setting)")


def test_cap_margin_is_measured_and_only_warns(spark, cfg):
    # Cap 3 with margin 0.5: at most 1 event of the day per user. u_busy has 2 on D (one the day before).
    rows = [_sequence_row("u_busy", [_element(-1, "b0"), _element(1, "b1"), _element(2, "b2")]),
            _sequence_row("u_calm", [_element(3, "k1")])]
    stats = qs.sequence_margin_statistics(qs.sequence_checks(_sequences(spark, rows), cfg), [D])
    assert stats[D][qs.day_events_column("impressions")] == 2 and stats[D][qs.day_events_column("clicks")] == 0
    report = validate(cfg, statistics_frame(stats), "test.margin", qs.sequence_margin_expectations(cfg), D,
                      raise_on_critical=False)
    assert not report.failed_critical
    assert {o.rule for o in report.failed_warnings} == {"cap_margin:impressions"}


# --------------------------------------------------------------------------------------------------
# silver.user_features


def _feature_row(user: str, **counters: int) -> dict[str, Any]:
    row: dict[str, Any] = {"ds": DAY, "user_id": user}
    row.update({c.name: (None if c.nullable else 0) for c in COUNTER_COLUMNS})
    row.update(counters)
    return row


def _features(spark, rows):
    return spark.createDataFrame(rows, SILVER_USER_FEATURES.spark_schema())


def _consistent(**by_window: int) -> dict[str, int]:
    """impressions on reels only, all-surface counters equal to the reels ones."""
    out = {}
    for name, n in by_window.items():
        out[name] = n
        out[f"reels_{name}"] = n
    return out


@pytest.mark.parametrize("bad, rule", [
    (_feature_row("u_nest", **_consistent(impressions_1d=3, impressions_7d=2, impressions_28d=3)), "windows_nested"),
    (_feature_row("u_sum", impressions_7d=1, impressions_28d=1), "surfaces_add_up"),
    (_feature_row("u_ctr", **_consistent(impressions_28d=1, clicks_28d=5)), "clicks_within_impressions"),
    (_feature_row("u_ok"), "one_row_per_user_id"),
])
def test_each_broken_feature_rule_fails_alone(spark, cfg, bad, rule):
    good = [_feature_row("u_ok", **_consistent(impressions_1d=1, impressions_7d=2, impressions_28d=4, clicks_28d=1))]
    report = validate(cfg, qs.feature_checks(_features(spark, good), "user_id"), "test.features", qs.feature_expectations(cfg, "user_id"), D,
                      raise_on_critical=False)
    assert report.success
    report = validate(cfg, qs.feature_checks(_features(spark, good + [bad]), "user_id"), "test.features", qs.feature_expectations(cfg, "user_id"),
                      D, raise_on_critical=False)
    assert _failed(report) == {rule}


# --------------------------------------------------------------------------------------------------
# silver.training_examples


def _example(iid: str, user: str = "u1", surface: str = "reels", click: int = 0, lead: int = 0,
             features_ds: dt.date = DAY) -> dict[str, Any]:
    row: dict[str, Any] = {
        "ds": DAY, "surface": surface, "impression_id": iid, "impression_time": _t(10), "user_id": user,
        "ad_id": "a1", "advertiser_id": "adv1", "campaign_id": "c1", "objective": "sales",
        "creative_type": "image", "position": 1, "sequence_ds": DAY, "features_ds": features_ds,
        "attributed_conversions": lead,
    }
    row.update({hash_column(c): int(hash_ids(pa.array([row[c]]))[0]) for c in HASHED_IDS})
    row.update({c: 0 for c in LABEL_COLUMNS.values()})
    row.update({"label_click": click, "label_lead": lead})
    for prefix in ("user_", "ad_"):
        row.update({f"{prefix}{c.name}": (None if c.nullable else 0) for c in COUNTER_COLUMNS})
    return row


@pytest.fixture(scope="module")
def sequences_path(spark, cfg):
    rows = [_sequence_row(u, [_element(1, f"s-{u}")]) for u in ("u1", "u2")]
    # Cap 3: u_cut had 5 impressions by the end of D, the 3 kept all at or after 10:00 (the
    # examples' impression time), so the 2 before it are gone: its examples' prefix was cut.
    rows.append(_sequence_row("u_cut", [_element(h, f"c-{h}") for h in (10, 11, 12)], n_impressions=5))
    tables.replace_partition(_sequences(spark, rows), cfg, SILVER_USER_SEQUENCES, {"ds": D})
    return tables.table_path(cfg, SILVER_USER_SEQUENCES)


def _examples(spark, rows):
    return spark.createDataFrame(rows, SILVER_TRAINING_EXAMPLES.spark_schema())


def _checked(spark, cfg, rows):
    """The examples suite's batch: `rows` with their snapshot checks against the fixture's sequences."""
    return qs.with_snapshot_checks(_examples(spark, rows), tables.read_table(spark, cfg, SILVER_USER_SEQUENCES), cfg)


GOOD_EXAMPLES = [_example("i1", click=1, lead=1), _example("i2", user="u2"), _example("i3"),
                 _example("i4", surface="fb_feed", click=1), _example("i5", surface="fb_feed")]


@pytest.mark.slow  # one full validation of the examples suite per rule (slow on 2 cores)
@pytest.mark.parametrize("bad, rule", [
    ([_example("i6", surface="fb_feed", click=1)], "label_rate:click"),  # fb_feed: 2 of 3 clicked > 0.6
    ([_example("i6", lead=1)], "conversion_label_implies_click"),
    ([_example("i6", user="u_unknown")], "sequence_snapshot_exists"),
    ([_example("i6", features_ds=DAY - dt.timedelta(days=1))], "features_of_impression_day"),
    ([_example("i1")], "one_row_per_impression"),
    ([_example("i6", user="u_cut")], "sequence_prefix_cut_rate"),  # 1 of 6 examples cut > 0.02
])
def test_each_broken_example_rule_fails_alone(spark, cfg, sequences_path, bad, rule):
    good, broken = _checked(spark, cfg, GOOD_EXAMPLES), _checked(spark, cfg, GOOD_EXAMPLES + bad)
    report = validate(cfg, good, "test.examples", qs.example_expectations(cfg), D, raise_on_critical=False)
    assert report.success, [o.describe() for o in report.outcomes if not o.success]
    report = validate(cfg, broken, "test.examples", qs.example_expectations(cfg), D, raise_on_critical=False)
    assert _failed(report) == {rule}


def test_examples_whose_prefix_the_cap_cut_are_counted_and_fail_above_the_rate(spark, cfg, sequences_path):
    cut = [_example("i6", user="u_cut"), _example("i7", user="u_cut")]
    examples = _checked(spark, cfg, GOOD_EXAMPLES + cut)
    report = validate(cfg, examples, "test.examples", qs.example_expectations(cfg), D, raise_on_critical=False)
    assert _failed(report) == {"sequence_prefix_cut_rate"}
    # A rate gate's line: the day's rate and counts, the bound, the key that sets it (and the rerun an
    # entry point adds).
    failed = DataQualityError(format_failures([report]), [report])
    failed.rerun = "gem bulk --start A --end B"
    assert str(failed).splitlines()[-1] == (
        f"FAILED test.examples/sequence_prefix_cut_rate: found {2 / 7:.4g} (ds={D}, cut_examples=2, examples=7); "
        f"bound at most {cfg.quality.max_sequence_cut_rate} of a day's examples with a prefix the cap cut; "
        "set by quality.max_sequence_cut_rate (or raise sequence_caps, so fewer prefixes are cut); "
        "rerun: gem bulk --start A --end B")
    counted = {o.rule: o for o in report.failed_warnings}
    assert set(counted) == {"sequence_prefix_cut_by_cap"} and "2" in counted["sequence_prefix_cut_by_cap"].describe()
    tolerant = make_config(Path(cfg.lakehouse_uri).parent, sequence_caps={"impression": 3, "click": 2, "conversion": 2},
                           quality={"max_sequence_cut_rate": 0.5, "label_rates": cfg.quality.label_rates})
    examples = _checked(spark, tolerant, GOOD_EXAMPLES + cut)
    report = validate(tolerant, examples, "test.examples", qs.example_expectations(tolerant), D,
                      raise_on_critical=False)
    assert not report.failed_critical and {o.rule for o in report.failed_warnings} == {"sequence_prefix_cut_by_cap"}

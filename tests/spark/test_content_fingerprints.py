"""A rerun that writes the same rows leaves the records that read them valid; one changed row does
not (the completion records' content fingerprints: gem.lakehouse.fingerprint)."""

from __future__ import annotations

import pytest

from gem.days import shift_day
from gem.lakehouse import completions
from gem.lakehouse.commit import StageContext
from gem.lakehouse.staleness import DONE, STALE, Ledger, all_records
from jobs import build_sequences, ingest_events, validate_events
from schemas.events import BRONZE_AD_EVENTS, BRONZE_QUARANTINE
from tests.landing_lines import DAY, DAY_MS, DAY_START_MS, all_dirty_lines, line, write_day
from tests.support import make_config

DAYS = [DAY, shift_day(DAY, 1)]
CHAIN = [("ingest_events", d) for d in DAYS] + [("validate_events", d) for d in DAYS] + [
    ("build_sequences", d) for d in DAYS]


def _landing_lines(day: int, changed_ad: str = "a1") -> list[str]:
    """Day `day`'s landing lines: a few users' impressions and clicks, and two dirty lines (the
    quarantine table gets rows too, under the validation's quarantine-rate bound); `changed_ad`:
    the first event's ad."""
    start = DAY_START_MS + day * DAY_MS
    events = [line(f"d{day}-{k}", user_id=f"u{k % 4}", ad_id=changed_ad if k == 0 else f"a{k % 3}",
                   event_type="click" if k % 5 == 0 else "impression", event_time=start + 60_000 * k)
              for k in range(40)]
    return events + all_dirty_lines()[:2]


def _states(cfg) -> dict[tuple[str, str], str]:
    ledger = Ledger(all_records(cfg))
    return {key: ledger.status(*key).state for key in CHAIN}


def test_reingesting_an_unchanged_day_marks_nothing_stale_and_one_changed_row_does(spark, tmp_path):
    cfg = make_config(tmp_path)
    ctx = StageContext(cfg, spark)
    for i, d in enumerate(DAYS):
        write_day(cfg.landing_root, d, _landing_lines(i))
    ingest_events.run(ctx, DAYS[0], DAYS[-1])  # one range commit: one fingerprint per day's record
    for d in DAYS:  # as daily runs do (a range's records would each read every day of the range)
        validate_events.run(ctx, d)
        build_sequences.run(ctx, d)
    assert set(_states(cfg).values()) == {DONE}
    first = completions.completion(cfg, "ingest_events", DAYS[0])
    validation = completions.completion(cfg, "validate_events", DAYS[0])
    assert set(first["table_fingerprints"]) == {BRONZE_AD_EVENTS.name, BRONZE_QUARANTINE.name}
    assert first["table_fingerprints"] != completions.completion(cfg, "ingest_events", DAYS[1])["table_fingerprints"]
    # The validation names the rows it validated (the ones ingest's record names).
    assert validation["table_fingerprints"][BRONZE_AD_EVENTS.name] == first["table_fingerprints"][BRONZE_AD_EVENTS.name]

    # The same landing files again: new Delta versions of day 1's partitions, the same rows.
    ingest_events.run(ctx, DAYS[0])
    again = completions.completion(cfg, "ingest_events", DAYS[0])
    assert again["table_versions"][BRONZE_AD_EVENTS.name] > first["table_versions"][BRONZE_AD_EVENTS.name]
    assert again["table_fingerprints"] == first["table_fingerprints"]
    assert set(_states(cfg).values()) == {DONE}
    # A reader takes day 1 through its validation: the rewrite with the validated rows is accepted.
    build_sequences.run(ctx, DAYS[0])
    assert set(_states(cfg).values()) == {DONE}

    # One row changed (the first event's ad): day 1's validation and every sequence build after it
    # now rest on other rows.
    write_day(cfg.landing_root, DAYS[0], _landing_lines(0, changed_ad="a9"))
    ingest_events.run(ctx, DAYS[0])
    changed = completions.completion(cfg, "ingest_events", DAYS[0])
    assert changed["table_fingerprints"][BRONZE_AD_EVENTS.name] != first["table_fingerprints"][BRONZE_AD_EVENTS.name]
    assert changed["table_fingerprints"][BRONZE_QUARANTINE.name] == first["table_fingerprints"][BRONZE_QUARANTINE.name]
    states = _states(cfg)
    assert [states[("validate_events", d)] for d in DAYS] == [STALE, DONE]
    assert [states[("build_sequences", d)] for d in DAYS] == [STALE, STALE]
    with pytest.raises(completions.StaleInputError,
                       match=rf"needs validate_events ds={DAYS[0]}, which is stale.*"
                             rf"rerun `python -m jobs.validate_events --ds {DAYS[0]}` first"):
        build_sequences.run(ctx, DAYS[0])

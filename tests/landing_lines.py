"""Hand-made landing lines for ingest tests: one clean event and one line per quarantine reason."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from gem.lakehouse.landing import LandingFile, mark_partition_complete
from schemas.events import LANDING_EVENTS

DAY = "2026-01-01"
DAY_START_MS = int(dt.datetime(2026, 1, 1, tzinfo=dt.UTC).timestamp() * 1000)
DAY_MS = 86_400_000


def clean_event(event_id: str, **fields: Any) -> dict[str, Any]:
    event = {
        "event_id": event_id,
        "event_type": "impression",
        "event_time": DAY_START_MS + 3_600_000,
        "user_id": "u1",
        "ad_id": "a1",
        "advertiser_id": "adv1",
        "campaign_id": "c1",
        "objective": "sales",
        "creative_type": "video",
        "surface": "reels",
        "position": 1,
        "conversion_type": None,
        "user_attrs": {"age": "25-34"},
    }
    event.update(fields)
    assert set(event) >= set(LANDING_EVENTS.column_names)
    return event


def line(event_id: str, **fields: Any) -> str:
    return json.dumps(clean_event(event_id, **fields))


# line reason -> the lines that must be quarantined with it (each line breaks exactly that one rule).
DIRTY_LINES: dict[str, list[str]] = {
    "malformed_json": ['{"event_id": "m1", "event_type": "impr', "[1, 2, 3]"],
    "unexpected_column": [line("x1", coupon="SAVE10")],
    "wrong_type": [line("w1", event_time="yesterday"), line("w2", position="3rd"),
                   # ids that are JSON numbers, objects or arrays (not strings): one column each, so
                   # no column's share of wrong types reaches the drift threshold.
                   line("w3", user_id=12345), line("w4", ad_id={"id": 7}), line("w5", campaign_id=["c1"])],
    "missing_id": [line("i1", user_id=None), line("i2", ad_id=""), line("i3", campaign_id="  ")],
    "missing_field": [line("f1", objective=None)],
    "unknown_surface": [line("s1", surface="tiktok")],
    "invalid_value": [
        line("v1", event_type="view"),
        line("v2", conversion_type="lead"),  # an impression that claims a conversion type
        line("v3", event_type="conversion", conversion_type=None, position=None),
        line("v4", position=-2),
    ],
    "negative_timestamp": [line("t1", event_time=-5)],
    "stale_timestamp": [line("t5", event_time=(DAY_START_MS + 3_600_000) // 1000)],  # seconds read as ms: 1970
    "far_future_timestamp": [line("t2", event_time=4_102_444_800_000)],  # 2100-01-01
    "event_after_arrival": [line("t3", event_time=DAY_START_MS + DAY_MS + 3_600_000)],
    "duplicate_event_id": [line("g1")],  # an exact repeat of a clean line below
}

CLEAN_LINES: list[str] = [
    line("g1"),
    line("g2", event_type="click", surface="fb_feed"),
    line("g3", event_type="conversion", conversion_type="lead", position=None),
    line("g4", user_attrs=None, position=None),
]


def write_day(landing_root: str, ds: str, lines: list[str], name: str = "part-0") -> None:
    with LandingFile(landing_root, ds, name) as f:
        f.write_lines(lines)
    mark_partition_complete(landing_root, ds, {"producer": "tests"})


def all_dirty_lines() -> list[str]:
    return [ln for lines in DIRTY_LINES.values() for ln in lines]


def bronze_event(event_id: str, arrived: str, event_type: str = "impression", **fields: Any) -> dict[str, Any]:
    """A bronze.ad_events row (typed: event_time a datetime) that arrived on `arrived`.

    Built from `clean_event`, so a test states only what it cares about; a conversion gets a
    conversion type and no position, as ingest requires.
    """
    is_conversion = event_type == "conversion"
    row = clean_event(
        event_id,
        event_type=event_type,
        event_time=dt.datetime(2026, 1, 1, 1),
        position=None if is_conversion else 1,
        conversion_type="lead" if is_conversion else None,
    )
    row.update(fields)
    row["ds"] = dt.date.fromisoformat(arrived)
    return row

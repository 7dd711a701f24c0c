"""Known dirt for the landing files: every landing file gets `floor(dirty_fraction * clean_lines)`
extra lines, cycling through every kind in schemas.events.DIRTY_KIND_REASON, each line with exactly
one defect, so ingest's quarantine can be checked against exact counts.
"""

from __future__ import annotations

import datetime as dt
import json

import numpy as np

from gem.sources.world import DAY_MS, EPOCH, HOUR_MS, compact_json
from schemas.events import DIRTY_KIND_REASON, ID_COLUMNS

# ---- Dirty rows. ------------------------------------------------------------------------------
DIRTY_KINDS: tuple[str, ...] = tuple(DIRTY_KIND_REASON)
UNKNOWN_SURFACES: tuple[str, ...] = ("tiktok", "snapchat", "youtube_shorts")
FAR_FUTURE_MS = int((dt.date(2100, 1, 1) - EPOCH).days) * DAY_MS


# ==================================================================================================
# Dirty rows.


def dirty_line(
    kind: str, variant: int, clean_line: str, serial: int, arrival_end_ms: int, rng: np.random.Generator
) -> str:
    """A copy of a clean line with exactly one defect of `kind`.

    `variant` (how many lines of this kind the file already has) rotates which field is broken;
    `serial` makes the fresh event id unique within the file. Each defect trips only its own ingest
    rule: the line stays valid JSON with all columns and types except where the defect says
    otherwise.
    """
    if kind == "duplicate_event_id":
        return clean_line
    event = json.loads(clean_line)
    event["event_id"] = f"{event['event_id']}-d{serial}"
    if kind == "malformed_json":
        text = compact_json(event)
        return text[: len(text) * 2 // 3]  # cut mid-object: never parseable
    if kind == "wrong_type":
        if variant % 2 == 1 and event["position"] is not None:
            event["position"] = "3rd"
        else:
            event["event_time"] = "yesterday"
    elif kind in ("null_id", "empty_id"):
        event[ID_COLUMNS[variant % len(ID_COLUMNS)]] = None if kind == "null_id" else ""
    elif kind == "unknown_surface":
        event["surface"] = UNKNOWN_SURFACES[variant % len(UNKNOWN_SURFACES)]
    elif kind == "negative_timestamp":
        event["event_time"] = -int(rng.integers(1000, 10**9))
    elif kind == "far_future_timestamp":
        event["event_time"] = FAR_FUTURE_MS + int(rng.integers(0, 365 * DAY_MS))
    elif kind == "event_after_arrival":
        event["event_time"] = arrival_end_ms + int(rng.integers(HOUR_MS, 6 * HOUR_MS))
    else:
        raise ValueError(f"unknown dirty kind {kind!r}; known: {DIRTY_KINDS}")
    return compact_json(event)


class DirtyPlanter:
    """Adds floor(fraction * clean lines so far) dirty lines to one landing file, streaming.

    Kinds cycle through DIRTY_KINDS in order, so any file with at least len(DIRTY_KINDS) dirty lines
    has every kind; the counts per kind are exact and go into the file's sidecar manifest.
    """

    def __init__(self, fraction: float, arrival_ds: str):
        self.fraction = fraction
        self.arrival_end_ms = (dt.date.fromisoformat(arrival_ds) - EPOCH).days * DAY_MS + DAY_MS
        self.clean = 0
        self.dirty = 0
        self.counts: dict[str, int] = {kind: 0 for kind in DIRTY_KINDS}

    def plant(self, clean_lines: list[str], rng: np.random.Generator) -> list[str]:
        """Count `clean_lines` and return the dirty lines due for them (derived from them)."""
        self.clean += len(clean_lines)
        due = int(np.floor(self.fraction * self.clean)) - self.dirty
        if due <= 0 or not clean_lines:
            return []
        sources = np.sort(rng.choice(len(clean_lines), size=min(due, len(clean_lines)), replace=False))
        out = []
        for source in sources.tolist():
            kind = DIRTY_KINDS[self.dirty % len(DIRTY_KINDS)]
            out.append(dirty_line(kind, self.counts[kind], clean_lines[source], self.dirty, self.arrival_end_ms, rng))
            self.counts[kind] += 1
            self.dirty += 1
        return out

"""Speculative pairs: the (user, ad) pairs precompute expects tomorrow's requests to need, and how
well yesterday's expectation did.

Policy (computed on day ds for the requests of ds+1), for every user active on ds (a row in
silver.user_sequences ds, i.e. events that arrived on ds):
  - "recent": the ads of the user's `precompute.recent_ads` most recent distinct impressions: users
    see the same ads again (frequency capping allows repeats, retargeting seeks them);
  - "popular": the `precompute.popular_ads` ads with the most impressions on ds: the campaigns that
    serve widely today still serve tomorrow.
The request context assumed is the surface of the user's latest impression, position unknown, the
counters of ds (those of ds+1 are built only tomorrow), the user's sequences as of the end of ds.

Measurement (on day ds, of the pairs computed on ds-1): the impressions that arrived on ds with an
event time on ds (from silver.user_sequences ds) are the requests; a hit is an impression whose
(user, ad) pair was precomputed. hit rate = hits / impressions; wasted = share of the pairs no
impression used; staleness at use = the model's age (ds - its mixture day) and the inputs' age
(ds - the snapshot day read, averaged over the hits).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

RECENT, POPULAR = "recent", "popular"


@dataclass(frozen=True)
class Pair:
    user_id: str
    ad_id: str
    surface: str
    reason: str


def day_impressions(sequences: pa.Table, ds: str) -> pa.Table:
    """(user_id, ad_id) of every impression in `sequences` (user_id, impressions rows of
    silver.user_sequences ds) with an event time on ds."""
    lists = sequences["impressions"].combine_chunks()
    flat = pc.list_flatten(lists)
    owner = pc.list_parent_indices(lists)
    start = dt.datetime.fromisoformat(ds).replace(tzinfo=dt.UTC)
    times = pc.struct_field(flat, "event_time")
    on_day = pc.and_(pc.greater_equal(times, pa.scalar(start, times.type)),
                     pc.less(times, pa.scalar(start + dt.timedelta(days=1), times.type)))
    users = pc.take(sequences["user_id"], owner)
    return pa.table({"user_id": users, "ad_id": pc.struct_field(flat, "ad_id")}).filter(on_day)


def popular_ads(impressions: pa.Table, n: int) -> tuple[str, ...]:
    """The n ads with the most impressions (ties by ad id)."""
    if n == 0 or impressions.num_rows == 0:
        return ()
    counts = impressions.group_by("ad_id").aggregate([("ad_id", "count")])
    ranked = counts.sort_by([("ad_id_count", "descending"), ("ad_id", "ascending")])
    return tuple(ranked["ad_id"].to_pylist()[:n])


def choose_pairs(active: pa.Table, popular: tuple[str, ...], recent_ads: int) -> list[Pair]:
    """The policy's pairs for the users of `active` (user_id, impressions oldest first), in the
    order of `active`'s rows; a pair chosen for both reasons counts as "recent"."""
    if active.num_rows == 0:
        return []
    lists = active["impressions"].combine_chunks()
    offsets = lists.offsets.to_numpy()
    flat = pc.list_flatten(lists)
    ads = np.asarray(pc.struct_field(flat, "ad_id").to_pylist(), dtype=object)
    surfaces = np.asarray(pc.struct_field(flat, "surface").to_pylist(), dtype=object)
    pairs = []
    for i, user in enumerate(active["user_id"].to_pylist()):
        first, last = int(offsets[i]), int(offsets[i + 1])
        if last == first:  # clicks or conversions only: no surface to assume
            continue
        newest_first = ads[first:last][::-1]
        recent = list(dict.fromkeys(newest_first))[:recent_ads]
        surface = surfaces[last - 1]
        chosen = {ad: RECENT for ad in recent} | {ad: POPULAR for ad in popular if ad not in recent}
        pairs.extend(Pair(user, ad, surface, reason) for ad, reason in chosen.items())
    return pairs


@dataclass(frozen=True)
class Measured:
    impressions: int
    hits: int
    hit_rate: float | None
    wasted_share: float | None
    input_age_days: float | None


def measure(impressions: pa.Table, pairs: pa.Table, ds: str) -> Measured:
    """How the pairs (user_id, ad_id, sequence_ds) computed for ds served ds's impressions (user_id, ad_id)."""
    key = ["user_id", "ad_id"]
    served = pairs.select([*key, "sequence_ds"])
    hits = impressions.select(key).join(served, key, join_type="inner")
    used = hits.select(key).group_by(key).aggregate([])
    day = dt.date.fromisoformat(ds)
    ages = [(day - d).days for d in hits["sequence_ds"].to_pylist()]
    n, m = impressions.num_rows, pairs.num_rows
    return Measured(
        impressions=n, hits=hits.num_rows,
        hit_rate=hits.num_rows / n if n else None,
        wasted_share=(m - used.num_rows) / m if m else None,
        input_age_days=float(np.mean(ages)) if ages else None,
    )

"""The loader's vectorized sequence cut (gem.data.sequences) against a per-example reference, and the
snapshot cache's memory bound (gem.data.snapshots)."""

from __future__ import annotations

import bisect

import numpy as np
import pyarrow as pa
import pytest

from gem.data.sequences import newest_before_each, newest_before_runs, spread
from gem.data.snapshots import MIB, DaySnapshot, FlatSequences, SnapshotCache, SnapshotTooLarge


def test_newest_before_runs_equals_one_binary_search_per_example():
    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 40, size=300)  # some users with no events
    offsets = np.r_[0, np.cumsum(lengths)]
    times = np.concatenate([np.sort(rng.integers(0, 1000, size=k)) for k in lengths])  # ascending per run, ties too
    users = rng.integers(0, len(lengths), size=2000)
    cuts = rng.integers(-5, 1005, size=2000)
    for keep in (1, 3, 64):
        first, stop = newest_before_runs(times, offsets[users], offsets[users + 1], cuts, keep)
        for i, u in enumerate(users):
            s, e = offsets[u], offsets[u + 1]
            expected_stop = s + bisect.bisect_left(times[s:e].tolist(), cuts[i])
            assert (first[i], stop[i]) == (max(s, expected_stop - keep), expected_stop)


def test_spread_and_newest_before_each():
    assert spread(np.array([5, 0, 9]), np.array([2, 3, 0])).tolist() == [5, 6, 0, 1, 2]
    times = np.array([1, 3, 5, 2, 4])  # runs (0, 3) and (3, 5)
    index, lengths = newest_before_each(times, [(0, 3), (3, 5), (0, 0)], np.array([5, 9, 9]), keep=1)
    assert index.tolist() == [1, 4] and lengths.tolist() == [1, 1, 0]


def _day(ds: str, elements: int) -> DaySnapshot:
    flat = FlatSequences(np.array([0, elements]), np.arange(elements), {"ad_id": np.arange(elements)})
    return DaySnapshot(ds, pa.array(["u1"]), {"impression": flat})


def test_the_snapshot_cache_stays_within_its_bound_and_refuses_a_larger_day():
    loads = []

    def load(ds):
        loads.append(ds)
        return _day(ds, {"d1": 80_000, "d2": 80_000, "d3": 80_000, "big": 200_000}[ds])  # 16 bytes an element

    cache = SnapshotCache(load, max_mib=3, context="test")  # two of the small days
    for ds in ("d1", "d2", "d1", "d3"):  # d1 used again, so d2 is the least recently used
        cache(ds)
    assert list(cache.days) == ["d1", "d3"] and cache.nbytes <= 3 * MIB and loads == ["d1", "d2", "d3"]
    assert cache("d3").users[0].as_py() == "u1" and loads[-1] == "d3"  # a hit loads nothing
    with pytest.raises(SnapshotTooLarge, match=r"ds=big indexes to 3 MiB.*loader.snapshot_cache_mib=3"):
        cache("big")


def test_a_snapshot_finds_each_users_row():
    snap = DaySnapshot("d", pa.array(["u2", "u1"]), {})
    assert snap.rows(pa.array(["u1", "u9", "u2", None])).tolist() == [1, -1, 0, -1]

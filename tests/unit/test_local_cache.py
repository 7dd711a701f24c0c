"""gem.data.local_cache: decoded tables written once, memory-mapped by later readers, bounded on
disk; and a day snapshot's round trip through it (gem.data.snapshots)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from gem.data.local_cache import MIB, LocalCache
from gem.data.snapshots import DaySnapshot, FlatSequences


def _table(rows: int, value: int = 0) -> pa.Table:
    return pa.table({"x": np.full(rows, value, np.int64)})


def test_a_miss_decodes_and_writes_and_a_hit_maps_the_file(tmp_path):
    cache, builds = LocalCache(tmp_path, max_mib=8), []

    def build():
        builds.append(1)
        return _table(1000, 7)

    key = cache.key("examples", "/lake/part-0.parquet", 123, ["x"])
    first, second = cache.get(key, build), cache.get(key, build)
    assert builds == [1] and (cache.hits, cache.misses) == (1, 1)
    assert first.equals(second) and second["x"].to_pylist()[:2] == [7, 7]
    # Another reader (a worker process, a later run) finds the file the first one wrote.
    assert LocalCache(tmp_path, max_mib=8).get(key, lambda: _table(1, 0)).equals(first)
    # Nothing of the write is left under a temporary name.
    assert [e.name for e in tmp_path.iterdir()] == [key]
    # Another file size (a rewritten file under the same name cannot happen in Delta, but a size
    # names the content too) or other columns are another key.
    assert len({key, cache.key("examples", "/lake/part-0.parquet", 124, ["x"]),
                cache.key("examples", "/lake/part-0.parquet", 123, ["x", "y"])}) == 3


def test_the_folder_stays_within_its_bound_dropping_the_least_recently_used(tmp_path):
    cache = LocalCache(tmp_path, max_mib=2)  # a table of 100k int64 is 0.76 MiB: two fit
    keys = [cache.key(i) for i in range(3)]
    cache.get(keys[0], lambda: _table(100_000))
    cache.get(keys[1], lambda: _table(100_000))
    cache.get(keys[0], lambda: _table(100_000))  # a hit: keys[0] is now the most recently used
    cache.get(keys[2], lambda: _table(100_000))
    names = {e.name for e in tmp_path.iterdir()}
    assert names == {keys[0], keys[2]} and sum(e.stat().st_size for e in tmp_path.iterdir()) <= 2 * MIB


def test_a_damaged_file_is_decoded_again(tmp_path):
    cache = LocalCache(tmp_path, max_mib=8)
    key = cache.key("damaged")
    (tmp_path / key).write_bytes(b"not arrow")
    assert cache.get(key, lambda: _table(3, 5))["x"].to_pylist() == [5, 5, 5] and cache.misses == 1
    assert cache.get(key, lambda: _table(0)).num_rows == 3  # rewritten whole


def test_a_day_snapshot_round_trips_through_the_cache_without_copies(tmp_path):
    flat = FlatSequences(np.array([0, 2, 2, 5]), np.array([1, 4, 2, 3, 9]),
                         {"ad_id": np.array([10, 11, 12, 13, 14]), "surface": np.array([1, 0, 2, 2, 1])})
    empty = FlatSequences(np.zeros(4, np.int64), np.zeros(0, np.int64), {})
    snap = DaySnapshot("2026-01-02", pa.array(["u1", "u2", "u3"]), {"impression": flat, "click": empty})
    cache = LocalCache(tmp_path, max_mib=8)
    cache.get("d.arrow", snap.to_table)
    back = DaySnapshot.from_table(cache.get("d.arrow", snap.to_table), "2026-01-02")
    assert cache.hits == 1 and back.users.to_pylist() == ["u1", "u2", "u3"]
    assert list(back.sequences) == ["impression", "click"] and back.sequences["click"].fields == {}
    got = back.sequences["impression"]
    assert got.offsets.tolist() == [0, 2, 2, 5] and got.times.tolist() == [1, 4, 2, 3, 9]
    assert {k: v.tolist() for k, v in got.fields.items()} == {k: v.tolist() for k, v in flat.fields.items()}
    assert not got.times.flags.writeable  # a view of the mapped file, not a copy
    assert back.rows(pa.array(["u3", "u9"])).tolist() == [2, -1]


def test_the_cache_never_stops_a_run(tmp_path, caplog):
    """A folder that cannot be written is warned about once and the decoded tables are used as they
    are; a table larger than the bound is not written; a killed worker's old temporary file goes."""
    import os
    import time

    blocked = tmp_path / "file"
    blocked.write_text("a file where the folder should be")  # mkdir under it fails, as a read-only disk would
    cache = LocalCache(blocked / "cache", max_mib=8)
    with caplog.at_level("WARNING", logger="gem.data.local_cache"):
        assert cache.get(cache.key(1), lambda: _table(3, 1))["x"].to_pylist() == [1, 1, 1]
        assert cache.get(cache.key(2), lambda: _table(2, 2)).num_rows == 2
    assert cache.unwritable and cache.misses == 2
    assert len([r for r in caplog.records if "cannot be written" in r.message]) == 1

    small = LocalCache(tmp_path / "small", max_mib=1)
    assert small.get(small.key("big"), lambda: _table(200_000)).num_rows == 200_000  # 1.5 MiB
    assert not (tmp_path / "small").exists() or not small.files()

    left = tmp_path / "small" / ".writing-killed"
    left.parent.mkdir(exist_ok=True)
    left.write_bytes(b"half a file")
    hour_ago = time.time() - 2 * 3600
    os.utime(left, (hour_ago, hour_ago))
    fresh = tmp_path / "small" / ".writing-busy"
    fresh.write_bytes(b"a worker writing now")
    small.get(small.key("small"), lambda: _table(10))
    assert not left.exists() and fresh.exists()

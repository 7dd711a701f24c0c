"""Late materialization: a user's sequence as it stood strictly before an impression.

An example names the silver.user_sequences row to read, (user_id, sequence_ds), and its
impression_time. That row is the user's capped sequences as of the END of sequence_ds, so it can
hold events at or after the impression; the model may only see the ones strictly before it.
Elements are ordered by (event_time, event_id) ascending (schemas/sequences.py), so the prefix is
everything before the first element whose event_time >= impression_time: one binary search.

Example (times in hours of one day; the impression at 12):
    elements at [3, 9, 12, 12, 15]  ->  prefix_length(...) == 2  ->  elements at [3, 9]
An element at exactly the impression time (the impression itself, or an event logged in the same
millisecond) is excluded: it is not known before the impression.

`sequence_spans` locates, for a batch of examples, each one's cut prefix (the newest the model reads)
in its day snapshot's flat arrays (gem.data.snapshots) without copying them: the training loader, the
precompute shards and gem score's rows from a lakehouse day (gem.serve.examples) all cut this way.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa

from schemas.sequences import SEQUENCE_COLUMNS

if TYPE_CHECKING:
    from gem.data.snapshots import DaySnapshot


def prefix_length(event_times: Sequence[Any], cut: Any) -> int:
    """Number of leading elements with event_time < cut; event_times sorted ascending.

    Works on any ordered values (datetimes, epoch integers, a numpy array's items).
    """
    return bisect.bisect_left(event_times, cut)


def cut_before(elements: Sequence[dict[str, Any]], cut: Any) -> list[dict[str, Any]]:
    """The elements (structs as dicts, oldest first) with event_time strictly before `cut`."""
    times = [e["event_time"] for e in elements]
    return list(elements[: prefix_length(times, cut)])


def newest_before_runs(times: np.ndarray, starts: np.ndarray, ends: np.ndarray, cuts: np.ndarray,
                       keep: int) -> tuple[np.ndarray, np.ndarray]:
    """For each example i, of the run times[starts[i]:ends[i]] (ascending), the newest `keep`
    elements strictly before cuts[i] are times[first[i]:stop[i]] -> (first (n,) int64, stop (n,) int64).

    One binary search per example, all of them at once: each round halves every open interval
    [lo, hi) with whole-array operations, so a batch costs about log2(longest run) rounds.
    """
    lo, hi = starts.astype(np.int64), ends.astype(np.int64)  # copies: narrowed in place below
    cuts = np.asarray(cuts, dtype=np.int64)
    open_ = np.flatnonzero(lo < hi)
    while open_.size:
        mid = (lo[open_] + hi[open_]) // 2
        before = times[mid] < cuts[open_]  # the answer is right of mid, else at or left of it
        lo[open_] = np.where(before, mid + 1, lo[open_])
        hi[open_] = np.where(before, hi[open_], mid)
        open_ = open_[lo[open_] < hi[open_]]
    return np.maximum(starts, lo - keep), lo


def spread(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """(sum(lengths),) int64: starts[0] .. starts[0]+lengths[0]-1, then starts[1] .., one run per entry.
    Example: spread([5, 0], [2, 3]) == [5, 6, 0, 1, 2]."""
    lengths = np.asarray(lengths, dtype=np.int64)
    run_starts = np.cumsum(lengths) - lengths  # where each run begins in the output
    return np.repeat(np.asarray(starts, dtype=np.int64) - run_starts, lengths) + np.arange(int(lengths.sum()))


def newest_before_each(times: np.ndarray, runs: Sequence[tuple[int, int]], cuts: np.ndarray,
                       keep: int) -> tuple[np.ndarray, np.ndarray]:
    """For each example i, the newest `keep` elements of its run runs[i] = (start, end) of `times`
    strictly before cuts[i]: -> (index (N,) int64 into times, oldest first per example; lengths (n,) int64)."""
    bounds = np.asarray(runs, dtype=np.int64).reshape(-1, 2)  # (n, 2)
    first, stop = newest_before_runs(times, bounds[:, 0], bounds[:, 1], cuts, keep)
    return spread(first, stop - first), stop - first


def runs_by_key(keys: np.ndarray) -> dict[str, tuple[int, int]]:
    """key -> (start, end) of its run in `keys` (sorted, so each key's rows are one run)."""
    if not len(keys):
        return {}
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    ends = np.r_[starts[1:], len(keys)]
    return {str(keys[s]): (int(s), int(e)) for s, e in zip(starts, ends, strict=True)}


@dataclass
class Spans:
    """Where each of n examples' sequences lie in its day snapshot's flat arrays: per event type,
    events first[i] .. cut[i] (exclusive) of the user's row in snapshot days[i]."""

    days: np.ndarray  # (n,) str, "YYYY-MM-DD"
    first: dict[str, np.ndarray]  # event type -> (n,) int64
    cut: dict[str, np.ndarray]  # event type -> (n,) int64

    def lengths(self) -> np.ndarray:
        """(n, event types) int64, event types in SEQUENCE_COLUMNS order."""
        return np.stack([self.cut[e] - self.first[e] for e in SEQUENCE_COLUMNS], axis=1)

    def take(self, index: np.ndarray) -> Spans:
        return Spans(self.days[index], {e: v[index] for e, v in self.first.items()},
                     {e: v[index] for e, v in self.cut.items()})

    def by_day(self) -> Iterator[tuple[str, np.ndarray]]:
        """(day, (k,) indices of its examples, ascending) per distinct day."""
        days, inverse = np.unique(self.days, return_inverse=True)
        for j, day in enumerate(days):
            yield str(day), np.flatnonzero(inverse == j)


def sequence_spans(snapshot: Callable[[str], DaySnapshot], max_length: Callable[[str], int],
                   users: pa.Array | pa.ChunkedArray | Sequence[str], sequence_ds: np.ndarray | Sequence[str],
                   times: np.ndarray) -> Spans:
    """Per event type, where each example's events strictly before its impression time (times (n,)
    int64 microseconds) lie in the user's row of its day snapshot (`snapshot(day)`), the newest
    `max_length(event type)` kept (the loader's LoaderConfig.max_length), without copying them. A user
    without a row has no events. Whole-array work per day of the examples: no per-example Python."""
    if not isinstance(users, pa.Array | pa.ChunkedArray):
        users = pa.array(list(users), pa.string())
    n = len(users)
    spans = Spans(np.asarray(sequence_ds, dtype="U10").reshape(n), {}, {})
    for event_type in SEQUENCE_COLUMNS:
        spans.first[event_type], spans.cut[event_type] = np.zeros(n, np.int64), np.zeros(n, np.int64)
    for day, index in spans.by_day():
        snap = snapshot(day)
        rows = snap.rows(users.take(pa.array(index)))  # (k,) -1: no history up to that day
        index, rows = index[rows >= 0], rows[rows >= 0]
        for event_type in SEQUENCE_COLUMNS:
            flat = snap.sequences[event_type]
            spans.first[event_type][index], spans.cut[event_type][index] = newest_before_runs(
                flat.times, flat.offsets[rows], flat.offsets[rows + 1], times[index], max_length(event_type))
    return spans

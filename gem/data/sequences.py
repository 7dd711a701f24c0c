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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

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


def newest_before(times: np.ndarray, start: int, end: int, cut: Any, keep: int) -> tuple[int, int]:
    """(first, stop): of the run times[start:end] (ascending), the newest `keep` elements strictly
    before `cut` are times[first:stop]."""
    stop = start + int(np.searchsorted(times[start:end], cut, side="left"))
    return max(start, stop - keep), stop


def newest_before_each(times: np.ndarray, runs: Sequence[tuple[int, int]], cuts: np.ndarray,
                       keep: int) -> tuple[np.ndarray, np.ndarray]:
    """For each example i, the newest `keep` elements of its run runs[i] = (start, end) of `times`
    strictly before cuts[i]: -> (index (N,) int64 into times, oldest first per example; lengths (n,) int64)."""
    picked, lengths = [], np.zeros(len(runs), np.int64)
    for i, (start, end) in enumerate(runs):
        first, stop = newest_before(times, start, end, cuts[i], keep)
        picked.append(np.arange(first, stop))
        lengths[i] = stop - first
    return (np.concatenate(picked) if picked else np.zeros(0, np.int64)), lengths


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

    days: list[str]
    first: dict[str, np.ndarray]  # event type -> (n,) int64
    cut: dict[str, np.ndarray]  # event type -> (n,) int64

    def lengths(self) -> np.ndarray:
        """(n, event types) int64, event types in SEQUENCE_COLUMNS order."""
        return np.stack([self.cut[e] - self.first[e] for e in SEQUENCE_COLUMNS], axis=1)

    def take(self, index: np.ndarray) -> Spans:
        return Spans([self.days[i] for i in index], {e: v[index] for e, v in self.first.items()},
                     {e: v[index] for e, v in self.cut.items()})


def sequence_spans(snapshot: Callable[[str], DaySnapshot], max_length: Callable[[str], int], users: list[str],
                   sequence_ds: list[str], times: np.ndarray) -> Spans:
    """Per event type, where each example's events strictly before its impression time (times (n,)
    int64 microseconds) lie in the user's row of its day snapshot (`snapshot(day)`), the newest
    `max_length(event type)` kept (the loader's LoaderConfig.max_length), without copying them. A user
    without a row has no events."""
    snaps = {d: snapshot(d) for d in sorted(set(sequence_ds))}
    rows = [snaps[ds].user_row.get(user) for user, ds in zip(users, sequence_ds, strict=True)]
    first, cut = {}, {}
    for event_type in SEQUENCE_COLUMNS:
        max_len = max_length(event_type)
        lo, hi = np.zeros(len(users), dtype=np.int64), np.zeros(len(users), dtype=np.int64)
        for i, (row, ds) in enumerate(zip(rows, sequence_ds, strict=True)):
            if row is None:  # no history up to that day
                continue
            flat = snaps[ds].sequences[event_type]
            lo[i], hi[i] = newest_before(flat.times, int(flat.offsets[row]), int(flat.offsets[row + 1]), times[i],
                                         max_len)
        first[event_type], cut[event_type] = lo, hi
    return Spans(list(sequence_ds), first, cut)

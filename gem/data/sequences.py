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
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import Any


def prefix_length(event_times: Sequence[Any], cut: Any) -> int:
    """Number of leading elements with event_time < cut; event_times sorted ascending.

    Works on any ordered values (datetimes, epoch integers, a numpy array's items).
    """
    return bisect.bisect_left(event_times, cut)


def cut_before(elements: Sequence[dict[str, Any]], cut: Any) -> list[dict[str, Any]]:
    """The elements (structs as dicts, oldest first) with event_time strictly before `cut`."""
    times = [e["event_time"] for e in elements]
    return list(elements[: prefix_length(times, cut)])

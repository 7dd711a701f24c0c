"""One day of silver.user_sequences, indexed by user, for cutting sequences before impressions.

Loaded once per (worker, day) from the files the Delta log lists for partition ds at the
manifest's pinned version, and kept flat: per event type the offsets of each user's list and
numpy arrays of each element field (ids hashed, vocabularies indexed, times in microseconds).
Cutting a batch's sequences is then one binary search per example and one gather per field
(gem.data.sequences defines the cut: elements strictly before the impression time).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gem.data.delta_log import LoggedFile, read_logged
from gem.data.encode import HASHED_IDS, VOCABULARIES, hash_ids, timestamps_us, vocab_index
from schemas.sequences import SEQUENCE_COLUMNS, SEQUENCE_FIELDS

# Element fields handed to the model per event type (besides the time gap).
MODEL_FIELDS: dict[str, tuple[str, ...]] = {
    t: tuple(f for f in fields if f in HASHED_IDS or f in VOCABULARIES) for t, fields in SEQUENCE_FIELDS.items()
}


@dataclass
class FlatSequences:
    offsets: np.ndarray  # (users + 1,) int64
    times: np.ndarray  # (elements,) int64 microseconds, ascending within each user
    fields: dict[str, np.ndarray]  # field -> (elements,) int64


@dataclass
class DaySnapshot:
    ds: str
    user_row: dict[str, int]
    sequences: dict[str, FlatSequences]  # event type -> flat arrays


def _flatten(column: pa.ChunkedArray, event_type: str) -> FlatSequences:
    lists = column.combine_chunks()
    offsets = lists.offsets.to_numpy().astype(np.int64)
    offsets = offsets - offsets[0]
    elements = pc.list_flatten(lists)
    fields = {}
    for name in MODEL_FIELDS[event_type]:
        child = pc.struct_field(elements, name)
        fields[name] = hash_ids(child) if name in HASHED_IDS else vocab_index(child, VOCABULARIES[name])
    return FlatSequences(offsets, timestamps_us(pc.struct_field(elements, "event_time")), fields)


SNAPSHOT_COLUMNS: list[str] = ["user_id"] + [seq for seq, _ in SEQUENCE_COLUMNS.values()]


def load_day(files: list[LoggedFile], ds: str, context: str) -> DaySnapshot:
    """Index the user_sequences rows of partition ds (files already filtered to it)."""
    try:
        table = read_logged(files, {}, SNAPSHOT_COLUMNS) if files else None  # no partition column is read
    except FileNotFoundError as e:
        raise type(e)(f"{context}: {e}") from e
    return index_day(table, ds, context)


def index_day(table: pa.Table | None, ds: str, context: str, users: Collection[str] | None = None) -> DaySnapshot:
    """Index rows of partition ds (SNAPSHOT_COLUMNS); `users`: only theirs (the others are dropped
    before their sequences are flattened)."""
    if table is not None and users is not None:
        table = table.filter(pc.is_in(table["user_id"], value_set=pa.array(sorted(users), pa.string())))
    if table is None or table.num_rows == 0:
        empty = FlatSequences(np.zeros(1, np.int64), np.zeros(0, np.int64), {})
        return DaySnapshot(ds, {}, {t: empty for t in SEQUENCE_COLUMNS})
    names = table["user_id"].to_pylist()
    user_row = {u: i for i, u in enumerate(names)}
    if len(user_row) != len(names):
        raise ValueError(f"{context}: silver.user_sequences ds={ds} holds a user twice")
    return DaySnapshot(ds, user_row, {t: _flatten(table[seq], t) for t, (seq, _) in SEQUENCE_COLUMNS.items()})

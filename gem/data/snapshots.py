"""One day of silver.user_sequences, indexed by user, for cutting sequences before impressions.

Loaded once per (worker, day) from the files the Delta log lists for partition ds at the
manifest's pinned version, and kept flat: per event type the offsets of each user's list and
numpy arrays of each element field (ids as the hashes build_sequences wrote, vocabularies indexed,
times in microseconds). With a LocalCache the indexed day is also written to the host's disk
once and memory-mapped by every later reader (other worker processes, later passes and runs), so a
day's Parquet files are decoded once per host, not once per worker and pass. Cutting a batch's sequences is then a vectorized binary search per event
type and one gather per field (gem.data.sequences defines the cut: elements strictly before the
impression time).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Collection
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gem.data.delta_log import LoggedFile, read_logged
from gem.data.encode import VOCABULARIES, timestamps_us, vocab_index
from gem.data.local_cache import LocalCache
from schemas.ids import HASHED_IDS, hash_column
from schemas.sequences import ELEMENT_ID_HASHES, SEQUENCE_COLUMNS, SEQUENCE_FIELDS

# Element fields handed to the model per event type (besides the time gap); an id field's values
# are its hash (schemas/ids.py).
MODEL_FIELDS: dict[str, tuple[str, ...]] = {
    t: tuple(f for f in fields if f in ELEMENT_ID_HASHES or f in VOCABULARIES) for t, fields in SEQUENCE_FIELDS.items()
}
MIB = 1 << 20


class SnapshotTooLarge(MemoryError):
    """A day's indexed silver.user_sequences is larger than the loader's snapshot cache."""


@dataclass
class FlatSequences:
    offsets: np.ndarray  # (users + 1,) int64
    times: np.ndarray  # (elements,) int64 microseconds, ascending within each user
    fields: dict[str, np.ndarray]  # field -> (elements,) int64

    @property
    def nbytes(self) -> int:
        return self.offsets.nbytes + self.times.nbytes + sum(v.nbytes for v in self.fields.values())


@dataclass
class DaySnapshot:
    ds: str
    users: pa.Array  # (users,) string: row i's user
    sequences: dict[str, FlatSequences]  # event type -> flat arrays

    def rows(self, user_ids: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """(n,) int64: each user's row, -1 for a user without one (no history up to the day)."""
        found = pc.index_in(user_ids, value_set=self.users)
        return pc.fill_null(found, -1).to_numpy(zero_copy_only=False).astype(np.int64)

    @property
    def nbytes(self) -> int:
        return self.users.nbytes + sum(f.nbytes for f in self.sequences.values())

    def to_table(self) -> pa.Table:
        """One row per user: user_id and, per event type, a large_list<struct<time, fields...>> of
        int64 (the flat arrays as Arrow buffers; from_table reads them back without a copy)."""
        columns = {"user_id": self.users}
        for event_type, flat in self.sequences.items():
            elements = pa.StructArray.from_arrays([pa.array(flat.times), *map(pa.array, flat.fields.values())],
                                                  names=["time", *flat.fields])
            columns[event_type] = pa.LargeListArray.from_arrays(pa.array(flat.offsets), elements)
        return pa.table(columns)

    @classmethod
    def from_table(cls, table: pa.Table, ds: str) -> DaySnapshot:
        """The snapshot to_table wrote; the arrays are views of the table's buffers (memory-mapped
        ones stay on disk until touched)."""
        def single(name: str) -> pa.Array:
            column = table[name]
            return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()

        sequences = {}
        for event_type in table.column_names[1:]:
            lists = single(event_type)
            elements = lists.values
            fields = {elements.type.field(i).name: elements.field(i).to_numpy() for i in range(elements.type.num_fields)}
            sequences[event_type] = FlatSequences(lists.offsets.to_numpy(), fields.pop("time"), fields)
        return cls(ds, single("user_id"), sequences)


def _flatten(column: pa.ChunkedArray, event_type: str) -> FlatSequences:
    lists = column.combine_chunks()
    offsets = lists.offsets.to_numpy().astype(np.int64)
    offsets = offsets - offsets[0]
    elements = pc.list_flatten(lists)
    fields = {}
    for name in MODEL_FIELDS[event_type]:
        if name in HASHED_IDS:  # written by build_sequences: no string is hashed here
            child = pc.struct_field(elements, hash_column(name))
            fields[name] = pc.fill_null(child, 0).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        else:
            fields[name] = vocab_index(pc.struct_field(elements, name), VOCABULARIES[name])
    return FlatSequences(offsets, timestamps_us(pc.struct_field(elements, "event_time")), fields)


SNAPSHOT_COLUMNS: list[str] = ["user_id"] + [seq for seq, _ in SEQUENCE_COLUMNS.values()]
# The element fields an index reads, per sequence column: event ids and id strings stay on disk.
SNAPSHOT_FIELDS: dict[str, tuple[str, ...]] = {
    seq: ("event_time", *(hash_column(f) if f in HASHED_IDS else f for f in MODEL_FIELDS[t]))
    for t, (seq, _) in SEQUENCE_COLUMNS.items()
}


def load_day(files: list[LoggedFile], ds: str, context: str, cache: LocalCache | None = None) -> DaySnapshot:
    """Index the user_sequences rows of partition ds (files already filtered to it); with `cache`,
    through the host's disk cache, keyed by the day's data files and what an index holds."""
    def build() -> DaySnapshot:
        try:  # no partition column is read
            table = read_logged(files, {}, SNAPSHOT_COLUMNS, fields=SNAPSHOT_FIELDS) if files else None
        except FileNotFoundError as e:
            raise type(e)(f"{context}: {e}") from e
        return index_day(table, ds, context)

    if cache is None:
        return build()
    key = cache.key("user_sequences index", sorted((f.path, f.bytes) for f in files), SNAPSHOT_FIELDS, VOCABULARIES)
    return DaySnapshot.from_table(cache.get(key, lambda: build().to_table()), ds)


def index_day(table: pa.Table | None, ds: str, context: str, users: Collection[str] | None = None) -> DaySnapshot:
    """Index rows of partition ds (SNAPSHOT_COLUMNS); `users`: only theirs (the others are dropped
    before their sequences are flattened)."""
    if table is not None and users is not None:
        table = table.filter(pc.is_in(table["user_id"], value_set=pa.array(sorted(users), pa.string())))
    if table is None or table.num_rows == 0:
        empty = FlatSequences(np.zeros(1, np.int64), np.zeros(0, np.int64), {})
        return DaySnapshot(ds, pa.array([], pa.string()), {t: empty for t in SEQUENCE_COLUMNS})
    names = table["user_id"].combine_chunks()
    if pc.count_distinct(names).as_py() != len(names):
        raise ValueError(f"{context}: silver.user_sequences ds={ds} holds a user twice")
    return DaySnapshot(ds, names, {t: _flatten(table[seq], t) for t, (seq, _) in SEQUENCE_COLUMNS.items()})


class SnapshotCache:
    """Day snapshots by ds, loaded on first use and kept within `max_mib` MiB (the least recently
    used day dropped first); a day larger than that alone raises SnapshotTooLarge."""

    def __init__(self, load: Callable[[str], DaySnapshot], max_mib: int, context: str) -> None:
        self.load, self.max_bytes, self.context = load, max_mib * MIB, context
        self.days: OrderedDict[str, DaySnapshot] = OrderedDict()

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.days.values())

    def __call__(self, ds: str) -> DaySnapshot:
        if ds in self.days:
            self.days.move_to_end(ds)
            return self.days[ds]
        snap = self.load(ds)
        if snap.nbytes > self.max_bytes:
            raise SnapshotTooLarge(
                f"{self.context}: silver.user_sequences ds={ds} indexes to {snap.nbytes / MIB:.0f} MiB, more than "
                f"loader.snapshot_cache_mib={self.max_bytes // MIB}; raise it (GEM__LOADER__SNAPSHOT_CACHE_MIB) or "
                "lower sequence_caps, which bound each user's stored events")
        self.days[ds] = snap
        while self.nbytes > self.max_bytes:
            self.days.popitem(last=False)
        return snap

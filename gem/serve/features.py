"""A student artifact's input contract: the feature spec, and feature rows -> the graph's input arrays.

A feature row is one request to score: the candidate impression's ids and attributes, the user's and
the ad's counters, the user's recent history and (LoopFM students) the FM codes logged for the user
before it. The artifact's feature_spec.json lists every column with its kind:

    hashed_id   user_id, ad_id, advertiser_id, campaign_id: a string, hashed here as the Spark stages
                hash the training rows (xxhash64 of the text with seed 42 & (2^63 - 1), schemas/ids.py),
                or an integer >= 0 already hashed that way; the graph takes it modulo the table's
                `buckets` rows
    vocabulary  surface, objective, creative_type: a string of the spec's vocabulary -> its index + 1
    position    an integer >= 0 -> min(position, 63) + 1; null -> 0
    counter     every user_* / ad_* counter: a number; counts enter as log1p of their full-window
                estimate (scaled from counters_start_ds, gem.data.encode.dense_matrix), rates as they are
    day         features_ds: the day whose counters the row carries (a date or timestamp)
    history     history_<event>: the ad ids of the user's events of that type strictly before the
                request, oldest first, as a list of strings (hashed here) or of integers >= 0 (hashed);
                the graph reads the newest `max_len`
    time        impression_time (LoopFM): the request's time, a timestamp
    codes       fm_codes (LoopFM): the user's FM history codes, oldest first, each `code_bytes` bytes
                (INT4, two codes per byte), with their log times in fm_code_times; the graph keeps
                those strictly before impression_time and within max_age_days, the newest max_codes

Defined behaviour (the spec's `behaviour` repeats it): an id never seen in training, or an integer
id beyond the buckets, lands in row id mod buckets, shared by hashing with other ids; a vocabulary
value outside the vocabulary, or null, is 0 (the unknown row); a null id hashes to 0, a null counter
is 0, a null history or code list is empty. Everything else is a FeatureError naming the column: a
missing column, a wrong dtype, a negative id or position, code lists of unequal lengths or sizes, a
row of another surface than the student's. Extra columns are ignored.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from gem.data.encode import (
    DENSE_COLUMNS,
    MAX_POSITION,
    dense_matrix,
    hash_ids,
    position_index,
    timestamps_us,
    vocab_index,
)

SPEC_FORMAT = "gem-student-features/1"
DAY_COLUMN = "features_ds"
TIME_COLUMN = "impression_time"
CODES_COLUMN, CODE_TIMES_COLUMN = "fm_codes", "fm_code_times"
HASH = "xxhash64 of the UTF-8 text with seed 42 (Spark's xxhash64), & (2^63 - 1); null -> 0"
BEHAVIOUR = {
    "unknown_id": "an id never seen in training, or an integer id beyond the buckets, lands in row id mod buckets "
                  "(shared with other ids by hashing); never an error",
    "unknown_vocabulary_value": "a value outside the vocabulary, or null, maps to 0, the unknown row",
    "nulls": "a null id hashes to 0; a null counter is 0; a null position is 0; a null history or code list is empty",
    "missing_column": "error naming the column",
    "wrong_dtype": "error naming the column and the dtypes it accepts",
    "negative_id_or_position": "error naming the column",
    "other_surface": "error naming the surface column: a student scores its own surface's requests only",
    "empty_input": "error: nothing to score",
    "extra_columns": "ignored (impression_id, ds and surface are copied to the predictions)",
}


class FeatureError(ValueError):
    """Feature rows the artifact cannot score as they are; `column` names the one at fault."""

    def __init__(self, column: str, message: str) -> None:
        super().__init__(f"column {column!r}: {message}")
        self.column = column


class ArtifactError(ValueError):
    """An artifact folder this code cannot serve (missing file, another spec format or counter set)."""


def history_column(event: str) -> str:
    return f"history_{event}"


def history_inputs(event: str) -> tuple[str, str]:
    """The graph's inputs of one event type's history: (ids (B, L), lengths (B,))."""
    return f"{event}_ids", f"{event}_lengths"


def feature_spec(surface: str, tasks: tuple[str, ...], sparse: dict[str, dict[str, Any]],
                 history: dict[str, dict[str, Any]], counters_start_ds: str,
                 codes: dict[str, Any] | None) -> dict[str, Any]:
    """The spec of an artifact (module docstring). sparse: feature -> {"kind": "hashed_id" | "vocabulary"
    | "position", "buckets": rows, "vocabulary": [...] for vocabulary features}, in the graph's column
    order; history: event -> {"max_len", "table", "buckets"}, in the graph's order; codes (LoopFM):
    {"code_bytes", "max_codes", "max_age_days"} or None."""
    columns: list[dict[str, Any]] = []
    for name, feature in sparse.items():
        column = {"name": name, **feature, "input": "sparse_ids"}
        if feature["kind"] == "hashed_id":
            column.update(dtype="string or int64 >= 0 (already hashed)", hash=HASH)
        elif feature["kind"] == "vocabulary":
            column.update(dtype="string", unknown=0)
        else:
            column.update(dtype="int64 >= 0", max=MAX_POSITION)
        columns.append(column)
    columns += [{"name": c, "kind": "counter", "dtype": "number", "input": "dense"} for c in DENSE_COLUMNS]
    columns.append({"name": DAY_COLUMN, "kind": "day", "dtype": "date", "input": "dense"})
    inputs = [{"name": "sparse_ids", "dtype": "int64", "shape": ["batch", len(sparse)]},
              {"name": "dense", "dtype": "float32", "shape": ["batch", len(DENSE_COLUMNS)]}]
    for event, h in history.items():
        ids, lengths = history_inputs(event)
        columns.append({"name": history_column(event), "kind": "history", **h,
                        "dtype": "list<string> or list<int64 >= 0 (already hashed)", "hash": HASH,
                        "order": f"oldest first, strictly before the request; the newest {h['max_len']} are read",
                        "input": ids})
        inputs += [{"name": ids, "dtype": "int64", "shape": ["batch", f"{event}_length"],
                    "layout": "oldest first, zero-padded after each row's length"},
                   {"name": lengths, "dtype": "int64", "shape": ["batch"]}]
    if codes is not None:
        columns += [
            {"name": TIME_COLUMN, "kind": "time", "dtype": "timestamp", "input": TIME_COLUMN},
            {"name": CODES_COLUMN, "kind": "codes", "dtype": f"list<binary of {codes['code_bytes']} bytes>", **codes,
             "order": "oldest first, one per coded event of the user", "input": CODES_COLUMN},
            {"name": CODE_TIMES_COLUMN, "kind": "code_times", "dtype": "list<timestamp>, as long as fm_codes",
             "input": CODE_TIMES_COLUMN},
        ]
        inputs += [{"name": TIME_COLUMN, "dtype": "int64", "shape": ["batch"], "unit": "microseconds since the epoch"},
                   {"name": CODES_COLUMN, "dtype": "uint8", "shape": ["batch", "codes", codes["code_bytes"]]},
                   {"name": CODE_TIMES_COLUMN, "dtype": "int64", "shape": ["batch", "codes"]},
                   {"name": "fm_code_lengths", "dtype": "int64", "shape": ["batch"]}]
    return {
        "format": SPEC_FORMAT, "surface": surface, "tasks": list(tasks), "counters_start_ds": counters_start_ds,
        "columns": columns, "inputs": inputs,
        "outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", len(tasks)]},
                    {"name": "probabilities", "dtype": "float32", "shape": ["batch", len(tasks)]}],
        "behaviour": BEHAVIOUR,
    }


def check_spec(spec: dict[str, Any], where: str) -> None:
    """ArtifactError unless this code encodes rows as the spec says (its format and counter set)."""
    if spec.get("format") != SPEC_FORMAT:
        raise ArtifactError(f"{where}: feature spec format {spec.get('format')!r}, this scorer reads {SPEC_FORMAT!r}")
    counters = [c["name"] for c in spec["columns"] if c["kind"] == "counter"]
    if counters != list(DENSE_COLUMNS):
        raise ArtifactError(f"{where}: the artifact's counters differ from this code's (gem.data.encode.DENSE_COLUMNS); "
                            f"score it with the code version that exported it")


def _column(table: pa.Table, name: str, nulls_as: pa.DataType | None = None) -> pa.ChunkedArray:
    """table[name]; a column of Arrow's null type (nulls only, as a writer may store one) as `nulls_as`."""
    index = table.schema.get_field_index(name)
    if index < 0:
        raise FeatureError(name, "missing from the input")
    column = table.column(index)
    return column.cast(nulls_as) if nulls_as is not None and pa.types.is_null(column.type) else column


def _nonnegative(name: str, values: np.ndarray, what: str) -> np.ndarray:
    if values.size and int(values.min()) < 0:
        raise FeatureError(name, f"{what} must be >= 0, got {int(values.min())}")
    return values


def _ids(name: str, column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """(n,) int64 id hashes of a string or integer column."""
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return hash_ids(column)
    if pa.types.is_integer(column.type):
        values = pc.fill_null(column, 0).to_numpy(zero_copy_only=False)
        return _nonnegative(name, np.asarray(values).astype(np.int64), "an integer id (an id already hashed)")
    raise FeatureError(name, f"ids must be strings or integers >= 0 (already hashed), got {column.type}")


def _sparse_values(table: pa.Table, column: dict[str, Any], surface: str) -> np.ndarray:
    name = column["name"]
    values = _column(table, name, pa.int64() if column["kind"] == "position" else pa.string())
    if column["kind"] == "hashed_id":
        return _ids(name, values)
    if column["kind"] == "vocabulary":
        if not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type)):
            raise FeatureError(name, f"must be a string of {column['vocabulary']}, got {values.type}")
        if name == "surface":
            others = pc.fill_null(pc.not_equal(values, surface), True)
            if pc.any(others).as_py():
                found = sorted({str(v) for v in pc.filter(values, others).to_pylist()})
                raise FeatureError(name, f"the artifact scores {surface} requests; {pc.sum(others).as_py()} rows "
                                         f"are of {found}")
        return vocab_index(values, tuple(column["vocabulary"]))
    if not pa.types.is_integer(values.type):
        raise FeatureError(name, f"must be an integer >= 0, got {values.type}")
    _nonnegative(name, pc.fill_null(values, 0).to_numpy(zero_copy_only=False), "a position")
    return position_index(values)


def _dense(table: pa.Table, counters_start_ds: str) -> np.ndarray:
    for name in DENSE_COLUMNS:
        counter = _column(table, name, pa.float64())
        if not (pa.types.is_integer(counter.type) or pa.types.is_floating(counter.type)):
            raise FeatureError(name, f"a counter must be a number, got {counter.type}")
        if counter.type != table[name].type:
            table = table.set_column(table.column_names.index(name), name, counter)
    day = _column(table, DAY_COLUMN).type
    if not (pa.types.is_date(day) or pa.types.is_timestamp(day)):
        raise FeatureError(DAY_COLUMN, f"must be a date (the day of the row's counters), got {day}")
    if table[DAY_COLUMN].null_count:
        raise FeatureError(DAY_COLUMN, f"{table[DAY_COLUMN].null_count} rows have no day")
    return dense_matrix(table, counters_start_ds)


def _list(table: pa.Table, name: str) -> pa.Array:
    """A list column as one ListArray (null lists empty)."""
    column = _column(table, name, pa.list_(pa.string()))
    if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)):
        raise FeatureError(name, f"must be a list, got {column.type}")
    merged = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if merged.null_count:
        empty = pa.array([[]] * len(merged), merged.type)
        merged = pc.if_else(merged.is_null(), empty, merged)
    return merged


def _offsets(lists: pa.Array) -> np.ndarray:
    """(n + 1,) int64 offsets of a list array, from 0."""
    offsets = lists.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
    return offsets - offsets[0]


def _padded(values: np.ndarray, offsets: np.ndarray, keep: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(padded (n, W, *rest), lengths (n,) int64): each row's values (its newest `keep` when given),
    oldest first, zeros after its length; W = max(1, the longest)."""
    lengths = np.diff(offsets)
    if keep is not None:
        lengths = np.minimum(lengths, keep)
    n, width = len(lengths), max(1, int(lengths.max()) if len(lengths) else 1)
    row = np.repeat(np.arange(n), lengths)
    col = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    out = np.zeros((n, width, *values.shape[1:]), values.dtype)
    out[row, col] = values[np.repeat(offsets[1:] - lengths, lengths) + col]
    return out, lengths.astype(np.int64)


def _history(table: pa.Table, column: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """(ids (n, L) int64, lengths (n,)) of a history column: its newest max_len ids per row (the graph
    reads no more)."""
    name = column["name"]
    lists = _list(table, name)
    values = lists.flatten()
    if not (pa.types.is_string(values.type) or pa.types.is_large_string(values.type) or pa.types.is_integer(values.type)):
        raise FeatureError(name, f"must be a list of ad ids (strings, or integers >= 0 already hashed), got {lists.type}")
    return _padded(_ids(name, values), _offsets(lists), int(column["max_len"]))


def _code_bytes(codes: pa.Array, size: int) -> np.ndarray:
    """(N, size) uint8 of a binary array whose every value is `size` bytes, read from its buffers."""
    codes = codes.cast(pa.binary())
    _, offsets_buffer, data = codes.buffers()
    offsets = np.frombuffer(offsets_buffer, np.int32)[codes.offset:codes.offset + len(codes) + 1] if len(codes) else [0]
    if codes.null_count or (np.diff(offsets) != size).any():
        raise FeatureError(CODES_COLUMN, f"every code must be {size} bytes (INT4, two codes per byte)")
    return np.frombuffer(data, np.uint8)[offsets[0]:offsets[-1]].reshape(-1, size) if len(codes) else \
        np.zeros((0, size), np.uint8)


def _codes(table: pa.Table, column: dict[str, Any]) -> dict[str, np.ndarray]:
    """The graph's padded code inputs: codes (n, C, code_bytes) uint8, times (n, C) int64, lengths (n,)."""
    time = _column(table, TIME_COLUMN)
    if not pa.types.is_timestamp(time.type):
        raise FeatureError(TIME_COLUMN, f"must be a timestamp, got {time.type}")
    if time.null_count:
        raise FeatureError(TIME_COLUMN, f"{time.null_count} rows have no time")
    codes, times = _list(table, CODES_COLUMN), _list(table, CODE_TIMES_COLUMN)
    size = int(column["code_bytes"])
    flat_codes, flat_times = codes.flatten(), times.flatten()
    if not (pa.types.is_binary(flat_codes.type) or pa.types.is_fixed_size_binary(flat_codes.type)):
        raise FeatureError(CODES_COLUMN, f"must be a list of {size}-byte binaries, got {codes.type}")
    if not pa.types.is_timestamp(flat_times.type):
        raise FeatureError(CODE_TIMES_COLUMN, f"must be a list of timestamps, got {times.type}")
    offsets = _offsets(codes)
    if not np.array_equal(offsets, _offsets(times)):
        raise FeatureError(CODE_TIMES_COLUMN, f"must hold one time per code of {CODES_COLUMN} in every row")
    if flat_times.null_count:
        raise FeatureError(CODE_TIMES_COLUMN, "holds a null time")
    out_codes, lengths = _padded(_code_bytes(flat_codes, size), offsets)
    out_times, _ = _padded(timestamps_us(flat_times), offsets)
    return {TIME_COLUMN: timestamps_us(time), CODES_COLUMN: out_codes, CODE_TIMES_COLUMN: out_times,
            "fm_code_lengths": lengths}


def model_inputs(table: pa.Table, spec: dict[str, Any]) -> dict[str, np.ndarray]:
    """The graph's input arrays (spec["inputs"]) for the feature rows of `table`; FeatureError naming the
    column at fault when a row breaks the contract (module docstring)."""
    sparse = [c for c in spec["columns"] if c["input"] == "sparse_ids"]
    inputs = {"sparse_ids": np.stack([_sparse_values(table, c, spec["surface"]) for c in sparse], axis=1).astype(np.int64),
              "dense": _dense(table, spec["counters_start_ds"])}
    for column in spec["columns"]:
        if column["kind"] == "history":
            event = column["name"].removeprefix("history_")
            inputs.update(zip(history_inputs(event), _history(table, column), strict=True))
        elif column["kind"] == "codes":
            inputs.update(_codes(table, column))
    return inputs

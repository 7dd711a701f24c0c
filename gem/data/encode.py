"""Arrow columns -> numpy/torch model inputs: id hashing, small vocabularies, dense counters.

Id policy (the model buckets these further, see its config): free-form ids (user, ad, advertiser,
campaign) become stable 63-bit hashes (schemas/ids.py), written by the Spark stages beside the
strings, so an id never seen before still gets a value and the loader never hashes a string (served
requests carry strings, hashed here the same way); closed vocabularies (surface, objective,
creative type, conversion type) become their index in schemas.tasks + 1, with 0 for null or unknown.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from schemas.examples import AD_FEATURE_PREFIX, USER_FEATURE_PREFIX
from schemas.features import COUNT_METRICS, COUNTER_COLUMNS, SCOPES, WINDOW_DAYS, counter_name
from schemas.ids import HASH_MASK, HASH_SEED, hash_column
from schemas.tasks import CONVERSION_TYPES, CREATIVE_TYPES, OBJECTIVES, SURFACES

VOCABULARIES: dict[str, tuple[str, ...]] = {
    "surface": SURFACES,
    "objective": OBJECTIVES,
    "creative_type": CREATIVE_TYPES,
    "conversion_type": CONVERSION_TYPES,
}
# Dense inputs: every counter of the user and of the ad; counts as log1p of their full-window
# estimate (dense_matrix), rates as they are (0 if null).
DENSE_COLUMNS: tuple[str, ...] = tuple(f"{p}{c.name}" for p in (USER_FEATURE_PREFIX, AD_FEATURE_PREFIX) for c in COUNTER_COLUMNS)
# Count column -> its window's length in days.
_COUNT_WINDOW: dict[str, int] = {
    f"{p}{counter_name(m, w, s)}": w
    for p in (USER_FEATURE_PREFIX, AD_FEATURE_PREFIX) for w in WINDOW_DAYS for s in SCOPES for m in COUNT_METRICS.values()
}
MAX_POSITION = 63  # positions above share one value


def hash_ids(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """(n,) int64 >= 0: each string's id hash (schemas/ids.py, Spark's xxhash64 with seed 42); null -> 0.
    Hashes each distinct value once. For strings that come without their hash (served requests)."""
    import xxhash  # noqa: PLC0415 - not on the GPU image, whose entry points read ids already hashed

    encoded = pc.dictionary_encode(column)
    chunks = encoded.chunks if isinstance(encoded, pa.ChunkedArray) else [encoded]
    parts = []
    for chunk in chunks:
        texts = chunk.dictionary.to_pylist()
        table = np.array([*(xxhash.xxh64_intdigest(t.encode(), seed=HASH_SEED) & HASH_MASK for t in texts), 0], np.int64)
        indices = chunk.indices.fill_null(len(table) - 1).to_numpy(zero_copy_only=False)
        parts.append(table[indices])
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def id_values(table: pa.Table, name: str) -> np.ndarray:
    """(n,) int64: the id column `name` as the model embeds it: its hash column where the table has
    one (silver.training_examples), else the strings hashed (hash_ids)."""
    hashed = hash_column(name)
    if hashed in table.column_names:
        return pc.fill_null(table[hashed], 0).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    return hash_ids(table[name])


def vocab_index(column: pa.Array | pa.ChunkedArray, vocabulary: tuple[str, ...]) -> np.ndarray:
    """(n,) int64: index in the vocabulary + 1; 0 for null or a value outside it."""
    idx = pc.index_in(column, value_set=pa.array(vocabulary))
    return (pc.fill_null(idx, -1).to_numpy(zero_copy_only=False).astype(np.int64)) + 1


def position_index(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """(n,) int64: 0 for a null position, else min(position, MAX_POSITION) + 1 (positions above share one value)."""
    pos = column.to_numpy(zero_copy_only=False)
    return np.where(np.isnan(pos.astype(np.float64)), 0, np.minimum(np.nan_to_num(pos), MAX_POSITION) + 1).astype(np.int64)


def days_since(column: pa.Array | pa.ChunkedArray, start_ds: str) -> np.ndarray:
    """(n,) int64: each date's days after start_ds (0 on start_ds itself)."""
    days = pc.cast(pc.cast(column, pa.date32()), pa.int32()).to_numpy(zero_copy_only=False).astype(np.int64)
    return days - (np.datetime64(start_ds, "D") - np.datetime64("1970-01-01", "D")).astype(np.int64)


def dense_matrix(table: pa.Table, counters_start_ds: str) -> np.ndarray:
    """(n, len(DENSE_COLUMNS)) float32 from the example table's counter columns and `features_ds`
    (the day whose counters each row carries).

    A count enters as log1p of its full-window estimate. The w-day window of ds reads the arrival
    days from max(ds - w, counters_start_ds) to ds - 1 (jobs.build_features: no day before the
    pipeline's start_ds is read), so in a lake younger than w days it holds min(w, ds - start)
    days' events and is scaled by w over that. Unscaled, every 7- and 28-day count of a young lake
    grows day by day, and a model trained on one day's counters over-predicts on the next day's
    larger ones; scaling brings the click tasks' calibration closer to 1. Rows of a lake at least w days old,
    and rows with no day to read (ds = start, every count 0), are left as they are; rates are
    never scaled.
    """
    out = np.empty((table.num_rows, len(DENSE_COLUMNS)), dtype=np.float32)
    days_read = days_since(table["features_ds"], counters_start_ds)  # (n,)
    scale = {}  # window -> (n,) its counts' factor, once per batch rather than per column
    for window in WINDOW_DAYS:
        read = np.clip(days_read, 0, window)  # (n,) days of the window the counters read
        scale[window] = np.where(read > 0, window / np.maximum(read, 1), 1.0)  # float64: product and log1p in float64
    for j, name in enumerate(DENSE_COLUMNS):
        values = pc.fill_null(table[name], 0).to_numpy(zero_copy_only=False).astype(np.float32)
        window = _COUNT_WINDOW.get(name)
        out[:, j] = values if window is None else np.log1p(values * scale[window])
    return out


def timestamps_us(column: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """(n,) int64 microseconds since the epoch (UTC) of a timestamp column."""
    return pc.cast(column, pa.timestamp("us")).cast(pa.int64()).to_numpy(zero_copy_only=False)

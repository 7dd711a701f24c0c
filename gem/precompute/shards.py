"""Fixed user-hash-range shards: the unit of precompute's work (one Spark task each) and of commit.

A user's shard is the range of the 63-bit stable hash of their id (schemas/ids.py,
gem.data.encode.hash_ids) among `shards` equal ranges: shard = hash // ceil(2^63 / shards). The
ranges never depend on the executors, so a shard's rows are the same users for any executor count, and a rerun of a shard
(Spark's retry of a failed task, a speculative copy of a slow one) replaces exactly them.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from gem.data.encode import hash_ids

_HASH_SPACE = 1 << 63


def shard_of(user_ids: pa.Array | pa.ChunkedArray, shards: int) -> np.ndarray:
    """(n,) int32: each user's shard in 0..shards-1."""
    width = -(-_HASH_SPACE // shards)  # ceil: the last range may be shorter
    return (hash_ids(user_ids) // width).astype(np.int32)

"""Spark's side of schemas/ids.py: an id column -> its hash, the integer the model embeds."""

from __future__ import annotations

from pyspark.sql import Column as SparkColumn
from pyspark.sql import functions as F

from schemas.ids import HASH_MASK, HASH_SEED


def id_hash(column: SparkColumn) -> SparkColumn:
    """long >= 0: xxhash64(column, seed 42) & (2**63 - 1); 0 for null (xxhash64 of a null is the seed's
    own hash, not null)."""
    hashed = F.xxhash64(column).bitwiseAND(F.lit(HASH_MASK))
    return F.when(column.isNull(), F.lit(0).cast("long")).otherwise(hashed)


# Spark's xxhash64 takes its seed from the SQL function's default; this module's contract names it.
assert HASH_SEED == 42, "Spark's xxhash64 hashes with seed 42"

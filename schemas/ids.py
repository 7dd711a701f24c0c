"""Hashed ids: the integer each free-form id becomes for the model, written once by the Spark stage
that writes the row, so no reader hashes a string.

    id_hash(text) = xxhash64(UTF-8 bytes of text, seed 42) & (2**63 - 1)      id_hash(null) = 0

xxhash64 with seed 42 is Spark's built-in `xxhash64` of one string column (its default seed); the
low 63 bits keep the value >= 0, which the model's bucketing (value mod buckets) and the served
graph's integer-id inputs need. Python computes the same value with the `xxhash` package
(gem.data.encode.hash_ids: served requests, which carry string ids); tests/spark/test_id_hashes.py
checks both sides agree. The column holding an id's hash is named `<id>_hash`
(silver.training_examples: user_id_hash, ad_id_hash, ...; the elements of silver.user_sequences:
ad_id_hash, advertiser_id_hash, campaign_id_hash).
"""

from __future__ import annotations

HASH_SEED = 42  # Spark's xxhash64 default
HASH_MASK = (1 << 63) - 1

# Free-form ids the model embeds through a hash (closed vocabularies are indexed instead).
HASHED_IDS: tuple[str, ...] = ("user_id", "ad_id", "advertiser_id", "campaign_id")


def hash_column(id_column: str) -> str:
    """The column holding `id_column`'s hash: "ad_id" -> "ad_id_hash"."""
    return f"{id_column}_hash"

"""Deterministic per-row draws: a row is in a pass's sample iff hash(seed, pass, source, file, row) < p.

Counter-based, not stateful: the draw of a row depends only on its identity, so any worker, rank
or resumed run makes the same decision for it without coordination, and a row is drawn at most
once per pass and source by construction (one draw per identity).

Example:
    >>> u = row_uniforms(seed=17, pass_index=0, source="reels/click", file_path="/f.parquet", n_rows=4)
    >>> keep = u < keep_probability(0.5, 0.2, labels=np.array([1, 0, 0, 1]))   # p = [0.5, 0.1, 0.1, 0.5]
"""

from __future__ import annotations

import hashlib

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def splitmix64(x: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer, elementwise on uint64 (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        z = x.astype(np.uint64) + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _MIX1
        z = (z ^ (z >> np.uint64(27))) * _MIX2
        return z ^ (z >> np.uint64(31))


def stable_hash(text: str) -> int:
    """A 64-bit hash of `text` that is the same in every process and Python version (unlike hash())."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")


def row_uniforms(seed: int, pass_index: int, source: str, file_path: str, n_rows: int) -> np.ndarray:
    """(n_rows,) float64 in [0, 1): the draw of each row of one file for one source and pass."""
    key = np.uint64(stable_hash(f"{seed}|{pass_index}|{source}|{file_path}"))
    with np.errstate(over="ignore"):
        h = splitmix64(splitmix64(np.arange(n_rows, dtype=np.uint64) + key))
    return (h >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def keep_probability(rate: float, negative_rate: float, labels: np.ndarray) -> np.ndarray:
    """(n,) probability each row is drawn: `rate` for label 1, `rate * negative_rate` for label 0."""
    return np.where(labels == 1, rate, rate * negative_rate).astype(np.float64)

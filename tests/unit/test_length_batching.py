"""gem.data.length_batching: batches of similar sequence lengths from a buffer, every row once,
the same batches for the same buffer and seed, and far less padding on long-tailed lengths."""

from __future__ import annotations

import itertools

import numpy as np

from gem.data.length_batching import length_sorted_batches


def _long_tailed(n: int, seed: int = 0) -> np.ndarray:
    """(n, 2) lengths like the generator's histories: impressions capped at 64, clicks mostly 0-2."""
    rng = np.random.default_rng(seed)
    impressions = np.minimum(rng.lognormal(3.0, 1.2, n).astype(np.int64), 64)
    clicks = np.minimum(rng.poisson(impressions / 20.0 * rng.exponential(1.0, n)), 32)
    return np.stack([impressions, clicks], axis=1)


def _padding(lengths: np.ndarray, batches: list[np.ndarray], column: int) -> float:
    real = sum(int(lengths[b, column].sum()) for b in batches)
    padded = sum(len(b) * int(lengths[b, column].max()) for b in batches)
    return 1 - real / padded


def test_every_row_once_in_full_batches_of_sorted_lengths():
    lengths = _long_tailed(16 * 64 + 10)
    batches = length_sorted_batches(lengths, 64, [1, 2, 3])
    rows = np.concatenate(batches)
    assert sorted(rows.tolist()) == list(range(len(lengths)))
    assert sorted(len(b) for b in batches) == [10] + [64] * 16
    # Cut from one lexicographic order: batches do not overlap in their first column's range.
    spans = sorted((int(lengths[b, 0].min()), int(lengths[b, 0].max())) for b in batches)
    assert all(hi <= lo for (_, hi), (lo, _) in itertools.pairwise(spans))


def test_same_buffer_and_seed_give_the_same_batches_in_a_seeded_order():
    lengths = _long_tailed(8 * 32, seed=3)
    a = length_sorted_batches(lengths, 32, [7, 0, 1])
    assert [b.tolist() for b in a] == [b.tolist() for b in length_sorted_batches(lengths, 32, [7, 0, 1])]
    c = length_sorted_batches(lengths, 32, [7, 0, 2])
    assert sorted(map(tuple, (sorted(b) for b in a))) == sorted(map(tuple, (sorted(b) for b in c)))
    assert [b.tolist() for b in a] != [b.tolist() for b in c]  # another seed, another emission order


def test_ties_keep_stream_order():
    lengths = np.array([[3], [1], [3], [1], [3], [1]])
    (batch,) = length_sorted_batches(lengths, 6, [0])
    assert batch.tolist() == [1, 3, 5, 0, 2, 4]


def test_padding_of_long_tailed_impressions_drops_below_ten_percent():
    lengths = _long_tailed(40 * 512, seed=5)
    stream = [np.arange(lo, lo + 512) for lo in range(0, len(lengths), 512)]
    grouped = [rows + lo for lo in range(0, len(lengths), 16 * 512)
               for rows in length_sorted_batches(lengths[lo:lo + 16 * 512], 512, [0, lo])]
    before, after = _padding(lengths, stream, 0), _padding(lengths, grouped, 0)
    assert before > 0.4 and after < 0.10, (before, after)

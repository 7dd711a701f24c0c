"""Length-aware batching: cut a buffer of several batches' rows into batches of similar sequence lengths.

A padded sequence kernel computes on (B, max length in the batch) per event type, so a batch that
mixes a 3-event history with a 256-event one wastes most of its block on padding. The loader fills
a buffer of `loader.length_sort_batches` batches in stream order, orders its rows by their sequence
lengths (event types compared in turn, ties kept in stream order), cuts consecutive runs of
`batch_size` rows into batches and emits those in an order shuffled by a seed. Everything depends
only on the buffer's rows and the seed, so a buffer re-read from its start yields the same batches
(the loader's exact resume). On long-tailed histories a larger buffer cuts more of the padding,
but click histories (half of them empty, a long tail) keep most of their small blocks padded: only
a jagged kernel removes that.

Example: lengths [[5], [0], [4], [1]] (4 rows, one event type), batch_size 2 -> batches
{rows 1, 3} (lengths 0, 1) and {rows 2, 0} (lengths 4, 5), in a seeded order.
"""

from __future__ import annotations

import numpy as np


def length_sorted_batches(lengths: np.ndarray, batch_size: int, seed: list[int]) -> list[np.ndarray]:
    """Row indices of each batch, in emission order.

    lengths: (n, E) int, each row's sequence length per event type (the first column sorts first);
    seed: the integers that seed the order the batches are emitted in.
    -> ceil(n / batch_size) index arrays; all hold batch_size rows but the one of the longest rows.
    """
    n = lengths.shape[0]
    # lexsort sorts by its last key first and is stable: ties keep stream order.
    order = np.lexsort(tuple(lengths[:, e] for e in reversed(range(lengths.shape[1])))) if n else np.zeros(0, np.int64)
    batches = [order[lo : lo + batch_size] for lo in range(0, n, batch_size)]
    emit = np.random.default_rng(seed).permutation(len(batches))
    return [batches[i] for i in emit]


"""gem.model.ops.length_groups: groups of similar lengths, and the padding they leave."""

from __future__ import annotations

import torch

from gem.model.ops.length_groups import length_groups, padded_positions


def test_groups_are_a_permutation_sorted_by_total_length():
    lengths = torch.tensor([[5, 1], [0, 0], [4, 0], [1, 1], [9, 9]])
    groups = length_groups(lengths, 2)
    assert [g.tolist() for g in groups] == [[1, 3, 2], [0, 4]]  # totals 0, 2, 4 | 6, 18
    assert sorted(torch.cat(groups).tolist()) == list(range(5))
    assert [g.tolist() for g in length_groups(lengths, 1)] == [[0, 1, 2, 3, 4]]  # one group: batch order
    assert len(length_groups(lengths[:2], 8)) == 2  # never more groups than rows


def test_padded_positions_per_group():
    lengths = torch.tensor([[5], [0], [4], [1]])
    real, padded = padded_positions(lengths, 2)
    assert real.tolist() == [10]
    assert padded.tolist() == [2 * 1 + 2 * 5]  # the module docstring's example
    assert padded_positions(lengths, 1)[1].tolist() == [4 * 5]
    assert padded_positions(torch.zeros(3, 1, dtype=torch.int64), 1)[1].tolist() == [3]  # >= 1 position

"""Length groups: one batch computed as a few groups of examples with similar sequence lengths.

A padded sequence kernel computes on (B, longest sequence in the batch) per event type, so one long
history makes every short one in the batch pay for its length. Sorting the examples by length and
computing each group of B / k consecutive examples padded only to its own longest cuts that waste,
and leaves the batch itself as it was: the same examples, the same loss, the same gradient (the
examples of a Kunlun forward never interact). Length-sorted *batches* (gem.data.length_batching)
waste even less but make each step's examples alike, which costs held-out NE.

Example: lengths (one event type) [5, 0, 4, 1], 2 groups -> rows [1, 3] (padded to 1) and [2, 0]
(padded to 5): 2 * 1 + 2 * 5 = 12 padded positions instead of 4 * 5 = 20.
"""

from __future__ import annotations

import torch


def length_groups(lengths: torch.Tensor, groups: int) -> list[torch.Tensor]:
    """Row indices of each group, shortest first; together a permutation of range(B).

    lengths: (B, E) int, each example's (kept) sequence length per event type. Rows are ordered by
    their total length over the event types (ties in batch order) and cut into `groups` runs of
    near-equal size; empty groups are dropped. groups <= 1: one group, the batch in its order.
    """
    b = lengths.shape[0]
    if groups <= 1 or b <= 1:
        return [torch.arange(b, device=lengths.device)]
    order = torch.sort(lengths.sum(dim=1), stable=True).indices  # (B,)
    return [g for g in order.tensor_split(min(groups, b)) if g.numel()]


def padded_positions(lengths: torch.Tensor, groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(real events (E,), padded block positions (E,)) of a batch computed in `groups` length groups:
    per event type, sum over the groups of (group size x the group's longest sequence, at least 1)."""
    padded = torch.zeros(lengths.shape[1], dtype=torch.int64)
    for rows in length_groups(lengths, groups):
        padded += rows.numel() * lengths[rows].amax(dim=0).clamp(min=1).to(torch.int64).cpu()
    return lengths.sum(dim=0).to(torch.int64).cpu(), padded

"""Attention masks over padded sequences: key padding, causal, and sliding window.

A sequence of B examples padded to length L holds each example's events oldest first in positions
0 .. len-1 (gem.data.batch.Jagged -> padded). Position i may attend to position j iff
    j < len            (a real event, not padding)
    j <= i             (nothing from the future: events after i happened later)
    i - j < window     (sliding window: only the `window` most recent events up to i, itself included)

Example: L = 4, lengths = [3], window = 2 ->
    [[1, 0, 0, 0],
     [1, 1, 0, 0],
     [0, 1, 1, 0],
     [0, 0, 0, 0]]   (the padding row attends to nothing)
"""

from __future__ import annotations

import torch


def padding_mask(lengths: torch.Tensor, max_len: int) -> torch.Tensor:
    """(B, L) bool: True at real positions."""
    return torch.arange(max_len, device=lengths.device)[None, :] < lengths[:, None]


def sliding_window_mask(lengths: torch.Tensor, max_len: int, window: int | None) -> torch.Tensor:
    """(B, 1, L, L) bool for self-attention: causal, within `window` (None = unbounded), real keys
    and real queries only."""
    pos = torch.arange(max_len, device=lengths.device)
    delta = pos[:, None] - pos[None, :]  # (L, L): i - j
    allowed = delta >= 0
    if window is not None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        allowed = allowed & (delta < window)
    real = padding_mask(lengths, max_len)  # (B, L)
    return (allowed[None, :, :] & real[:, None, :] & real[:, :, None])[:, None]


def sliding_window_mask_reference(lengths: list[int], max_len: int, window: int | None) -> torch.Tensor:
    """The rule in the module docstring, position by position."""
    out = torch.zeros(len(lengths), 1, max_len, max_len, dtype=torch.bool)
    for b, n in enumerate(lengths):
        for i in range(n):
            for j in range(n):
                out[b, 0, i, j] = j <= i and (window is None or i - j < window)
    return out

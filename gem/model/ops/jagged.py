"""Jagged <-> padded: a batch's sequences as (values (N, d), offsets (B+1,)) or as (B, L, d) + lengths.

Example: offsets [0, 2, 2, 5] -> lengths [2, 0, 3]; padded row 1 is all padding.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


def token_rows(offsets: torch.Tensor, total: int | None = None) -> torch.Tensor:
    """(B+1,) offsets -> (N,) the example each value belongs to. Example: [0, 2, 2, 3] -> [0, 0, 2].
    `total`: N, when known (told its output size, repeat_interleave does not wait for the device)."""
    lengths = offsets[1:] - offsets[:-1]
    return torch.repeat_interleave(torch.arange(lengths.numel(), device=offsets.device), lengths, output_size=total)


def padded_index(offsets: torch.Tensor, max_len: int, rows: torch.Tensor | None = None) -> torch.Tensor:
    """(N,) each value's row in a (B x max_len) padded block flattened to (B * max_len,); -1 for the
    values past max_len. Example: offsets [0, 2, 2, 3], max_len 2 -> [0, 1, 4]. `rows`:
    token_rows(offsets), when known."""
    row = token_rows(offsets) if rows is None else rows  # (N,)
    col = torch.arange(row.numel(), device=offsets.device) - offsets[:-1][row]  # (N,)
    return torch.where(col < max_len, row * max_len + col, -1)


def to_padded(values: torch.Tensor, offsets: torch.Tensor, max_len: int | None = None) -> torch.Tensor:
    """(N, *rest) values -> (B, L, *rest), zeros after each example's length. One index_copy into
    the flattened block (its backward one index_select): faster forward + backward than indexing
    by (row, column) pairs."""
    lengths = offsets[1:] - offsets[:-1]
    b = lengths.numel()
    max_len = int(lengths.max()) if max_len is None and b else (max_len or 0)
    out = values.new_zeros((b * max_len, *values.shape[1:]))
    if values.shape[0]:
        index = padded_index(offsets, max_len)
        keep = index >= 0
        if bool(keep.all()):
            out = out.index_copy(0, index, values)
        else:
            out = out.index_copy(0, index[keep], values[keep])
    return out.view(b, max_len, *values.shape[1:])


def to_jagged(padded: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """(B, L, *rest) -> (N, *rest): each example's first `length` positions, concatenated (lengths
    at most L). The plain form of JaggedLayout.unpad (the tests' reference)."""
    b, max_len = padded.shape[:2]
    offsets = torch.cat([lengths.new_zeros(1), torch.cumsum(lengths, 0)])
    return padded.reshape(b * max_len, *padded.shape[2:]).index_select(0, padded_index(offsets, max_len))


class JaggedLayout(NamedTuple):
    """What the ops over one token stream need besides its values, computed once per batch from
    one host read of the lengths: recomputed per layer, each `lengths.max()` and each
    `repeat_interleave` without its output size waited for the device (a sync per op on a GPU)."""

    offsets: torch.Tensor  # (B+1,)
    lengths: torch.Tensor  # (B,)
    rows: torch.Tensor  # (N,) each token's example
    longest: int  # the longest sequence, at least 1 (a padded block's positions)
    index: torch.Tensor  # (N,) each token's row in the (B * longest) flattened padded block

    @classmethod
    def of(cls, offsets: torch.Tensor) -> JaggedLayout:
        lengths = offsets[1:] - offsets[:-1]
        host = lengths.cpu()  # the one read
        longest = max(1, int(host.max()) if host.numel() else 1)
        rows = token_rows(offsets, int(host.sum()))  # (N,)
        return cls(offsets, lengths, rows, longest, padded_index(offsets, longest, rows))

    @property
    def examples(self) -> int:
        return self.lengths.numel()

    def pad(self, values: torch.Tensor) -> torch.Tensor:
        """(N, *rest) -> (B, longest, *rest), zeros after each length (as to_padded)."""
        out = values.new_zeros((self.examples * self.longest, *values.shape[1:]))
        return out.index_copy(0, self.index, values).view(self.examples, self.longest, *values.shape[1:])

    def unpad(self, padded: torch.Tensor) -> torch.Tensor:
        """(B, longest, *rest) -> (N, *rest): each example's real positions (as to_jagged)."""
        return padded.reshape(self.examples * self.longest, *padded.shape[2:]).index_select(0, self.index)


def padding_ratio(lengths: torch.Tensor, max_len: int | None = None) -> float:
    """Share of a padded (B, L) block that is padding: 1 - sum(lengths) / (B * L)."""
    b = lengths.numel()
    max_len = int(lengths.max()) if max_len is None and b else (max_len or 0)
    return 0.0 if b * max_len == 0 else 1.0 - float(lengths.sum()) / (b * max_len)


def keep_last(offsets: torch.Tensor, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(index (M,), new offsets (B+1,)): per example, the positions of its last `max_len` values.

    Example: offsets [0, 3, 4], max_len 2 -> index [1, 2, 3], offsets [0, 2, 3].
    """
    lengths = offsets[1:] - offsets[:-1]
    kept = lengths.clamp(max=max_len)
    total = int(kept.sum())  # the one host read: repeat_interleave told its size does not wait again
    row = torch.repeat_interleave(torch.arange(lengths.numel(), device=offsets.device), kept, output_size=total)
    within = torch.arange(total, device=offsets.device) - torch.repeat_interleave(
        torch.cumsum(kept, 0) - kept, kept, output_size=total)
    index = offsets[1:][row] - kept[row] + within
    return index, torch.cat([offsets.new_zeros(1), torch.cumsum(kept, 0)])


def jagged_mean(values: torch.Tensor, offsets: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
    """(N, d) values, (B+1,) offsets -> (B, d): each example's mean (an EmbeddingBag with mean
    pooling); zeros for an example with no values. `rows`: token_rows(offsets), when known.

    Example: values [[1], [3], [5]], offsets [0, 2, 2, 3] -> [[2], [0], [5]].
    """
    lengths = offsets[1:] - offsets[:-1]
    rows = token_rows(offsets) if rows is None else rows
    sums = values.new_zeros(lengths.numel(), values.shape[1]).index_add_(0, rows, values)
    return sums / lengths.clamp(min=1)[:, None].to(values.dtype)


def recent_mean(values: torch.Tensor, offsets: torch.Tensor, max_len: int) -> torch.Tensor:
    """(N, d), (B+1,) -> (B, d): the mean of each example's last `max_len` values."""
    index, kept = keep_last(offsets, max_len)
    return jagged_mean(values[index], kept)

"""The blocked band layout of causal sliding-window self-attention, shared by its GDPA and softmax forms.

Query i reads keys i-window+1 .. i. The sequence is cut into blocks of w = min(window, L) positions;
each block of queries scores its own block of keys and the one before (2w keys, a superset of every
query's window), as plain batched matmuls: O(L * window) scores instead of O(L^2) masked to the band
(faster in backward than an unfold of the keys).

Example: L = 5, window = 2 -> 3 blocks of 2 queries; block 1 (queries 2, 3) scores keys 0 .. 3, of
which query 2 may read keys 1, 2 and query 3 keys 2, 3.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def band_blocks(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor,
                window: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v (B, H, L, Dh), lengths (B,) -> query blocks (B, H, nb, w, Dh), key and value blocks
    (B, H, nb, 2w, Dh), and allowed (B, 1, nb, w, 2w) bool: True where a query may read a key
    (causal, within the window, both real). Padded queries read nothing."""
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    b, h, length, dh = q.shape
    w = min(window, length)
    n_blocks = -(-length // w)
    pad = n_blocks * w - length

    def blocks(x: torch.Tensor) -> torch.Tensor:
        return F.pad(x, (0, 0, 0, pad)).view(b, h, n_blocks, w, dh)  # (B, H, nb, w, Dh)

    def with_previous(x: torch.Tensor) -> torch.Tensor:
        previous = F.pad(x, (0, 0, 0, 0, 1, 0))[:, :, :-1]  # block n-1 (zeros before the first)
        return torch.cat([previous, x], dim=3)  # (B, H, nb, 2w, Dh)

    block = torch.arange(n_blocks, device=q.device)[:, None, None]
    query = block * w + torch.arange(w, device=q.device)[None, :, None]  # (nb, w, 1) query positions
    key = (block - 1) * w + torch.arange(2 * w, device=q.device)[None, None, :]  # (nb, 1, 2w) key positions
    in_band = (key <= query) & (query - key < window) & (key >= 0)  # (nb, w, 2w)
    n = lengths[:, None, None, None]
    allowed = in_band[None] & (key[None] < n) & (query[None] < n)  # (B, nb, w, 2w)
    return blocks(q), with_previous(blocks(k)), with_previous(blocks(v)), allowed[:, None]


def from_blocks(x: torch.Tensor, length: int) -> torch.Tensor:
    """(B, H, nb, w, Dh) per-block outputs -> (B, H, L, Dh), the block padding dropped."""
    b, h, n_blocks, w, dh = x.shape
    return x.reshape(b, h, n_blocks * w, dh)[:, :, :length]

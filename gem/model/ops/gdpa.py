"""GDPA, generalized dot-product attention (Kunlun): attention without softmax, one activation per head.

    out_h = (act_h(Q_h K_h^T * alpha) * s) @ V_h

alpha scales before the activation, s after it (HSTU uses s = 1 / max_seq_len). Masked (query, key)
pairs contribute exactly 0: with no softmax to renormalize, a masked score is zeroed after the
activation (act(-inf) is not 0 for every activation, e.g. GELU gives nan).

Shapes: q (B, H, Lq, Dh), k and v (B, H, Lk, Dh); mask broadcastable to (B, H, Lq, Lk), True = attend.
With K/V computed from the non-sequence summary X_sum this is InterFormer's personalized FFN
written as attention; with K/V from the sequence itself it is sequence self-attention.

Example:
    >>> q = torch.randn(2, 4, 5, 8); kv = torch.randn(2, 4, 3, 8)
    >>> out = gdpa(q, kv, kv, activations=("silu", "gelu", "silu", "relu"), alpha=8 ** -0.5, scale=1 / 3)
    >>> out.shape
    torch.Size([2, 4, 5, 8])
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F

from gem.model.ops.band import band_blocks, from_blocks

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "gelu": F.gelu,
    "relu": F.relu,
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
}


def check_activations(activations: Sequence[str], heads: int) -> None:
    """One known activation per head, or a ValueError naming the problem."""
    if len(activations) != heads:
        raise ValueError(f"gdpa: {len(activations)} activations for {heads} heads")
    unknown = sorted(set(activations) - set(ACTIVATIONS))
    if unknown:
        raise ValueError(f"gdpa: unknown activations {unknown}; known: {sorted(ACTIVATIONS)}")


def gdpa_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, activations: Sequence[str],
                   alpha: float, scale: float, mask: torch.Tensor | None = None) -> torch.Tensor:
    """Head by head, exactly as written in the module docstring."""
    check_activations(activations, q.shape[1])
    outs = []
    for h, name in enumerate(activations):
        scores = ACTIVATIONS[name](q[:, h] @ k[:, h].transpose(-1, -2) * alpha) * scale  # (B, Lq, Lk)
        if mask is not None:
            m = mask.expand(q.shape[0], q.shape[1], q.shape[2], k.shape[2])[:, h]
            scores = scores * m.to(scores.dtype)
        outs.append(scores @ v[:, h])  # (B, Lq, Dh)
    return torch.stack(outs, dim=1)


def activate(scores: torch.Tensor, activations: Sequence[str]) -> torch.Tensor:
    """Each head's activation on scores (N, H, ...): one call per group of heads sharing one."""
    check_activations(activations, scores.shape[1])
    if len(set(activations)) == 1:
        return ACTIVATIONS[activations[0]](scores)
    groups: dict[str, list[int]] = {}
    for h, name in enumerate(activations):
        groups.setdefault(name, []).append(h)
    parts = torch.empty_like(scores)
    for name, heads in groups.items():
        idx = torch.tensor(heads, device=scores.device)
        parts.index_copy_(1, idx, ACTIVATIONS[name](scores.index_select(1, idx)))
    return parts


def gdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, activations: Sequence[str], alpha: float,
         scale: float, mask: torch.Tensor | None = None) -> torch.Tensor:
    """All heads in one batched matmul; the activation is applied per group of heads sharing it."""
    scores = activate(torch.matmul(q, k.transpose(-1, -2)) * alpha, activations)  # (B, H, Lq, Lk)
    if mask is not None:
        scores = scores.masked_fill(~mask, 0.0)
    return torch.matmul(scores * scale, v)


# At L <= 2 * window the blocked form scores as many pairs as the dense one and is slower; from 4
# windows on it wins, more so the longer L (`python -m bench.windowed_attention` times both).
BAND_MIN_WINDOWS = 4


def uses_band(length: int, window: int | None) -> bool:
    """Whether self-attention over `length` positions with `window` takes the blocked band form."""
    return window is not None and length >= BAND_MIN_WINDOWS * window


def windowed_gdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, activations: Sequence[str], alpha: float,
                  scale: float, lengths: torch.Tensor, window: int) -> torch.Tensor:
    """Causal sliding-window self-GDPA that computes only near the band: query i reads keys
    i-window+1 .. i, in O(L * window) scores instead of O(L^2) masked to the band.

    The blocked band layout (gem.model.ops.band): each block of `window` queries scores its own block
    of keys and the one before, as plain batched matmuls.
    Equal to `gdpa(q, k, v, ..., mask=sliding_window_mask(lengths, L, window))` (a parity test holds
    them together). q, k, v (B, H, L, Dh), lengths (B,); -> (B, H, L, Dh), 0 at padded queries.
    """
    queries, keys, values, allowed = band_blocks(q, k, v, lengths, window)
    scores = activate(torch.matmul(queries, keys.transpose(-1, -2)) * alpha, activations)  # (B, H, nb, w, 2w)
    scores = scores.masked_fill(~allowed, 0.0)
    return from_blocks(torch.matmul(scores * scale, values), q.shape[2])  # (B, H, L, Dh)

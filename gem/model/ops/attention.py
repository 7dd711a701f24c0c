"""Kunlun's attention switch: GDPA (gem.model.ops.gdpa) or softmax attention
(gem.model.ops.softmax_attention), dense under a mask or in the blocked band form of a sliding window.

Shapes: q (B, H, Lq, Dh), k and v (B, H, Lk, Dh); mask broadcastable to (B, H, Lq, Lk), True = attend.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gem.model.ops.gdpa import gdpa, windowed_gdpa
from gem.model.ops.softmax_attention import softmax_attention, windowed_softmax_attention


def attend(attention: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, activations: Sequence[str],
           alpha: float, scale: float, mask: torch.Tensor | None) -> torch.Tensor:
    """GDPA (`act_h(QK^T * alpha) * scale @ V`) or softmax attention (alpha only) under one mask
    -> (B, H, Lq, Dh)."""
    if attention == "softmax":
        return softmax_attention(q, k, v, alpha, mask)
    return gdpa(q, k, v, activations, alpha, scale, mask)


def attend_window(attention: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, activations: Sequence[str],
                  alpha: float, scale: float, lengths: torch.Tensor, window: int) -> torch.Tensor:
    """Causal self-attention within `window` in the band form, q, k, v (B, H, L, Dh) -> (B, H, L, Dh)."""
    if attention == "softmax":
        return windowed_softmax_attention(q, k, v, alpha, lengths, window)
    return windowed_gdpa(q, k, v, activations, alpha, scale, lengths, window)

"""Standard softmax attention with GDPA's masks: Kunlun's `attention="softmax"` ablation.

    out = softmax(Q K^T * alpha, masked keys at -inf) @ V

through torch.nn.functional.scaled_dot_product_attention (its fused kernels where the device has
them), so each query's weights sum to 1 over the keys it may read. A query that may read no key
(a padded position, an empty sequence) gets exactly 0, like GDPA, and no nan in its gradients: such
a row is scored against every key and its output multiplied by 0.

Shapes: q (B, H, Lq, Dh), k and v (B, H, Lk, Dh); mask broadcastable to (B, H, Lq, Lk), True = attend.

Example:
    >>> q = torch.randn(2, 4, 5, 8); kv = torch.randn(2, 4, 3, 8)
    >>> softmax_attention(q, kv, kv, alpha=8 ** -0.5).shape
    torch.Size([2, 4, 5, 8])
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from gem.model.ops.band import band_blocks, from_blocks


def softmax_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, alpha: float,
                                mask: torch.Tensor | None = None) -> torch.Tensor:
    """As written in the module docstring, with an explicit softmax; rows with no key are 0."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * alpha  # (B, H, Lq, Lk)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # an all -inf row is nan: no key, weight 0
    return torch.matmul(weights, v)


def softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, alpha: float,
                      mask: torch.Tensor | None = None) -> torch.Tensor:
    """scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=alpha), 0 where a query reads no key."""
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, scale=alpha)
    reads = mask.any(dim=-1, keepdim=True)  # (B, 1|H, Lq, 1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask | ~reads, scale=alpha)
    return out * reads.to(out.dtype)


def windowed_softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, alpha: float,
                               lengths: torch.Tensor, window: int) -> torch.Tensor:
    """Causal sliding-window softmax self-attention in the blocked band layout (gem.model.ops.band),
    equal to `softmax_attention(q, k, v, alpha, sliding_window_mask(lengths, L, window))`.
    q, k, v (B, H, L, Dh), lengths (B,) -> (B, H, L, Dh), 0 at padded queries."""
    queries, keys, values, allowed = band_blocks(q, k, v, lengths, window)
    b, h, n_blocks, w, dh = queries.shape
    # Blocks folded into the head axis: 4-D inputs take the fused kernels (5-D ones the math path).
    out = softmax_attention(queries.reshape(b, h * n_blocks, w, dh), keys.reshape(b, h * n_blocks, 2 * w, dh),
                            values.reshape(b, h * n_blocks, 2 * w, dh), alpha,
                            allowed.expand(b, h, n_blocks, w, 2 * w).reshape(b, h * n_blocks, w, 2 * w))
    return from_blocks(out.view(b, h, n_blocks, w, dh), q.shape[2])

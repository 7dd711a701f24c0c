"""Kunlun's three attentions over jagged sequences: no position is padding, so none is computed.

A batch's sequences of one event type arrive as a token stream: values (N, ...) of every example's
real events back to back, with rows (N,) naming each token's example (gem.model.ops.jagged). Each
form equals its padded counterpart at every real position (tests/unit/test_jagged_attention.py):

- summary attention (Kunlun's personalized layers): each token reads its own example's n summary
  tokens. As a batch of N one-query attentions, the keys gathered per token: N x n scores.
- window attention (the sliding-window layers): the stream is one long sequence in the blocked band
  layout (gem.model.ops.band), each token reading the `window` tokens up to itself that belong to its
  own example (a segment mask). About 2 x window scores per token, whatever the batch's longest.
- seed pooling (HSP): S learned seeds read every token of their example; the weighted values are
  summed per example (index_add). GDPA needs no normalisation; softmax is normalised per
  (example, head, seed) over the example's tokens.

Shapes: q, k, v of the stream (N, H, Dh); summary keys (B, H, n, Dh); seeds (S, H, Dh).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from gem.model.ops.attention import attend, attend_window
from gem.model.ops.gdpa import activate


def summary_attention(attention: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor,
                      activations: Sequence[str], alpha: float, scale: float) -> torch.Tensor:
    """q (N, H, Dh), k and v (B, H, n, Dh), rows (N,) -> (N, H, Dh): token i reads example rows[i]'s keys."""
    out = attend(attention, q[:, :, None], k[rows], v[rows], activations, alpha, scale, None)  # (N, H, 1, Dh)
    return out[:, :, 0]


def window_attention(attention: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor,
                     activations: Sequence[str], alpha: float, scale: float, window: int) -> torch.Tensor:
    """q, k, v (N, H, Dh), rows (N,) -> (N, H, Dh): causal self-attention within `window` inside
    each example's own tokens (the stream holds them oldest first, examples back to back)."""
    n = q.shape[0]
    if n == 0:
        return q.clone()

    def stream(x: torch.Tensor) -> torch.Tensor:
        return x.transpose(0, 1)[None]  # (1, H, N, Dh): the whole stream as one row

    out = attend_window(attention, stream(q), stream(k), stream(v), activations, alpha, scale,
                        torch.tensor([n], device=q.device), window, segments=rows[None])
    return out[0].transpose(0, 1)  # (N, H, Dh)


def seed_pooling(attention: str, seeds: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor,
                 examples: int, activations: Sequence[str], alpha: float, scale: float) -> torch.Tensor:
    """seeds (S, H, Dh) read the stream k, v (N, H, Dh) of each example -> (B, H, S, Dh); an example
    without tokens pools to 0 (as a padded row with every key masked)."""
    scores = torch.einsum("nhd,shd->nhs", k, seeds) * alpha  # (N, H, S)
    if attention == "softmax":
        # Softmax over each example's tokens: shifted by the example's peak (no gradient needed
        # through it: a shift common to one softmax cancels), normalised by the example's sum.
        index = rows[:, None, None].expand_as(scores)
        peak = scores.new_full((examples, *scores.shape[1:]), float("-inf")).scatter_reduce(
            0, index, scores.detach(), "amax")  # (B, H, S)
        weights = torch.exp(scores - peak[rows])
        weights = weights / scores.new_zeros(peak.shape).index_add(0, rows, weights)[rows]
    else:
        weights = activate(scores, activations) * scale
    # Each token's weighted values as a batched outer product (N x H of (S, 1) @ (1, Dh)): a matmul,
    # so torch's FLOP counter sees these multiply-adds, as it sees the padded form's weights @ V.
    weighted = torch.matmul(weights[..., None], v[:, :, None, :])  # (N, H, S, Dh)
    return v.new_zeros(examples, *weighted.shape[1:]).index_add(0, rows, weighted)

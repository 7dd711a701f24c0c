"""Kunlun's three attentions over jagged sequences, for a layout whose per-token work skips padding.

A batch's sequences of one event type arrive as a token stream: values (N, ...) of every example's
real events back to back, with offsets (B+1,) (gem.model.ops.jagged). The per-token work (every
linear layer, norm and FFN of a layer, the seed scores, the window attention) runs on the real
tokens alone; the two small products against a handful of keys per example (summary tokens, seeds)
run as one batched matmul over the examples padded to the batch's longest, the fast CPU kernel for
them (gem.model.flops.jagged_padding_flops counts what that pads). Each form equals its padded
counterpart at every real position (tests/unit/test_jagged_attention.py):

- summary attention (Kunlun's personalized layers): each token reads its own example's n summary
  tokens; the two small products run per example on queries padded to the batch's longest.
- window attention (the sliding-window layers): the stream is one long sequence in a blocked band
  layout (as gem.model.ops.band's), each token reading the `window` tokens up to itself that belong
  to its own example (a segment mask). About 2 x window scores per token, whatever the batch's longest.
- seed pooling (HSP): S learned seeds score every token of their example; the weighted values are
  summed per example by a matmul over weights padded with zeros. GDPA needs no normalisation;
  softmax is normalised per (example, head, seed) over the example's real tokens.

Shapes: q, k, v of the stream (N, H, Dh); summary keys (B, H, n, Dh); seeds (S, H, Dh). A stream's
layout (its offsets, each token's example and padded position: gem.model.ops.jagged.JaggedLayout)
is computed once per batch and shared by every layer.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from gem.model.ops.attention import attend
from gem.model.ops.gdpa import ACTIVATIONS, check_activations
from gem.model.ops.jagged import JaggedLayout
from gem.model.ops.masks import padding_mask


def summary_attention(attention: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: JaggedLayout,
                      activations: Sequence[str], alpha: float, scale: float) -> torch.Tensor:
    """q (N, H, Dh), k and v (B, H, n, Dh) -> (N, H, Dh): each token reads its own example's n
    keys. The products run on the queries padded per example: one (L x n) matmul per example and
    head is what CPU kernels do fast (gathering each token's keys is much slower); with n
    a few summary tokens they are a small share of the layer's FLOPs."""
    queries = layout.pad(q).transpose(1, 2)  # (B, H, L, Dh); padded queries are dropped
    out = attend(attention, queries, k, v, activations, alpha, scale, None)  # (B, H, L, Dh)
    return layout.unpad(out.transpose(1, 2))  # (N, H, Dh)


def window_attention(attention: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: torch.Tensor,
                     activations: Sequence[str], alpha: float, scale: float, window: int) -> torch.Tensor:
    """q, k, v (N, H, Dh), rows (N,) -> (N, H, Dh): causal self-attention within `window` inside
    each example's own tokens (the stream holds them oldest first, examples back to back).

    The stream is cut into blocks of w = min(window, N) tokens; each block of queries scores its own
    block of keys and the one before (together a superset of each query's window), masked to the
    window and to the query's own example. Head by head (each its own activation), each head's blocks
    strided views of padded copies of the stream: no operand is transposed or concatenated, which
    is faster forward + backward than the batched-heads band of gem.model.ops.band.
    alpha scales the queries and the GDPA scale rides on the mask weights, so each (nb, w, w) score
    block sees one elementwise pass after its activation.
    """
    n, heads, dh = q.shape
    if n == 0:
        return q.clone()
    w = min(window, n)
    blocks = -(-n // w)
    pad = blocks * w - n
    pos = torch.arange(w, device=q.device)
    delta = pos[:, None] - pos[None, :]  # (w, w): query - key position within a block
    segment = F.pad(rows, (0, pad), value=-1).view(blocks, w)  # padded queries belong to no example
    previous_segment = F.pad(segment, (0, 0, 1, 0), value=-1)[:-1]  # (nb, w): the block before's
    own = (delta >= 0) & (segment[:, :, None] == segment[:, None, :])  # (nb, w, w)
    before = (delta + w < window) & (segment[:, :, None] == previous_segment[:, None, :])  # keys w earlier
    if attention == "softmax":  # over both blocks' allowed keys; a query reading none (padding) is 0
        allowed = torch.cat([before, own], dim=-1)  # (nb, w, 2w)
        reads = allowed.any(dim=-1, keepdim=True)
        blocked = ~(allowed | ~reads)
    else:  # GDPA: the masks as weights with the scale folded in, one multiply per score block
        own_weight, before_weight = own.to(q.dtype) * scale, before.to(q.dtype) * scale  # (nb, w, w)
    # Per operand, the blocks (nb, w, H, Dh): a block's own tokens, and for keys and values also the
    # block before's (the stream shifted by one block: a zero block in front, the last block cut).
    # Padding, not slicing, forms them, and unbind, not indexing, takes each head's view: their
    # backward passes are a slice and one stack, where a slice or index of a shared tensor would
    # zero-fill a full-size gradient per head and per use.
    queries_all = F.pad(q * alpha, (0, 0, 0, 0, 0, pad)).view(blocks, w, heads, dh)  # alpha on (N, H, Dh), not scores
    keys_own = F.pad(k, (0, 0, 0, 0, 0, pad)).view(blocks, w, heads, dh)
    keys_before = F.pad(k, (0, 0, 0, 0, w, pad - w)).view(blocks, w, heads, dh)
    values_own = F.pad(v, (0, 0, 0, 0, 0, pad)).view(blocks, w, heads, dh)
    values_before = F.pad(v, (0, 0, 0, 0, w, pad - w)).view(blocks, w, heads, dh)
    outs = []
    for h, (queries, k_own, k_before, v_own, v_before) in enumerate(zip(  # each (nb, w, Dh), strided
            *(t.unbind(2) for t in (queries_all, keys_own, keys_before, values_own, values_before)), strict=True)):
        scores_own = torch.bmm(queries, k_own.transpose(1, 2))  # (nb, w, w)
        scores_before = torch.bmm(queries, k_before.transpose(1, 2))  # (nb, w, w)
        if attention == "softmax":
            scores = torch.cat([scores_before, scores_own], dim=-1).masked_fill(blocked, float("-inf"))
            weights_before, weights_own = (torch.softmax(scores, dim=-1) * reads).split(w, dim=-1)
        else:
            act = ACTIVATIONS[activations[h]]
            weights_own, weights_before = act(scores_own) * own_weight, act(scores_before) * before_weight
        outs.append(torch.bmm(weights_own, v_own) + torch.bmm(weights_before, v_before))  # (nb, w, Dh)
    return torch.stack(outs, dim=2).view(blocks * w, heads, dh)[:n]  # (N, H, Dh)


def seed_pooling(attention: str, seeds: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: JaggedLayout,
                 activations: Sequence[str], alpha: float, scale: float) -> torch.Tensor:
    """seeds (S, H, Dh) read each example's tokens k, v (N, H, Dh) -> (B, H, S, Dh); an example
    without tokens pools to 0 (as a padded row with every key masked). The scores are computed per
    token; the weighted sum of values runs as one (S x L) @ (L x Dh) matmul per example and head on
    weights padded with zeros (faster than a per-token outer product summed with index_add).
    GDPA goes head by head, each head's scores one (N, Dh) @ (Dh, S) product under its own
    activation: faster in training than all heads in one einsum, the activations applied per group
    of heads by gathering and scattering them, and one matmul over permuted weights."""
    if attention == "softmax":  # normalised over each example's real tokens; an empty one weighs 0
        scores = torch.einsum("nhd,shd->nhs", k, seeds) * alpha  # (N, H, S)
        real = padding_mask(layout.lengths, layout.longest)[:, :, None, None]  # (B, L, 1, 1)
        padded = layout.pad(scores).masked_fill(~real, float("-inf"))  # (B, L, H, S)
        weights = torch.softmax(padded, dim=1).nan_to_num(0.0)
        values = layout.pad(v).transpose(1, 2)  # (B, H, L, Dh)
        return torch.matmul(weights.permute(0, 2, 3, 1), values)  # (B, H, S, L) @ (B, H, L, Dh)
    check_activations(activations, k.shape[1])
    pooled = []
    for h, name in enumerate(activations):  # padded weights are 0: pad fills with zeros
        weights = ACTIVATIONS[name](k[:, h] @ (seeds[:, h].t() * alpha)) * scale  # (N, Dh) @ (Dh, S) -> (N, S)
        pooled.append(torch.bmm(layout.pad(weights).transpose(1, 2), layout.pad(v[:, h])))  # (B, S, L) @ (B, L, Dh)
    return torch.stack(pooled, dim=1)  # (B, H, S, Dh)

"""HSTU baseline (arXiv 2402.17152): a causal sequential transducer over the user's history + the candidate.

Per layer, on tokens X (B, L, d):
    U, V, Q, K = split(SiLU(W1 X))                        each (B, H, L, dh)
    A = SiLU(Q K^T + rab(i - j)) / L_max                  causal (j <= i), padding masked
    Y = X + W2(LayerNorm(A V) * U)

The sequence is the user's impressions, clicks and conversions (each the most recent max_len of
its type, tagged by an event-type embedding), oldest first within a type, then one candidate token
(the ad and surface being ranked, from the sparse embeddings). The candidate's output, with a
projection of the non-sequence features, is the representation for the task heads. rab is a
learned bias per head and bucketed relative distance.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gem.model.configs import HSTUConfig
from gem.model.history import HistoryTokens
from gem.model.ops.masks import sliding_window_mask


class HSTULayer(nn.Module):
    def __init__(self, dim: int, heads: int, max_len: int, rab_buckets: int) -> None:
        super().__init__()
        self.heads, self.head_dim, self.max_len = heads, dim // heads, max_len
        self.w1 = nn.Linear(dim, 4 * dim)
        self.w2 = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)
        self.rab = nn.Parameter(torch.zeros(heads, rab_buckets))
        self.rab_buckets = rab_buckets

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        b, length, d = x.shape
        u, v, q, k = (t.view(b, length, self.heads, self.head_dim).transpose(1, 2)
                      for t in F.silu(self.w1(x)).chunk(4, dim=-1))  # 4 x (B, H, L, dh)
        pos = torch.arange(length, device=x.device)
        distance = (pos[:, None] - pos[None, :]).clamp(min=0)
        bucket = torch.clamp(torch.floor(torch.log2(distance.double() + 1)), max=self.rab_buckets - 1).long()
        scores = q @ k.transpose(-1, -2) + self.rab[:, bucket]  # (B, H, L, L)
        mask = sliding_window_mask(lengths, length, None)  # causal, real tokens only
        att = (F.silu(scores) / self.max_len).masked_fill(~mask, 0.0) @ v  # (B, H, L, dh)
        y = self.norm(att.transpose(1, 2).reshape(b, length, d)) * u.transpose(1, 2).reshape(b, length, d)
        real = (pos[None, :] < lengths[:, None]).to(x.dtype)[..., None]
        return (x + self.w2(y)) * real


class HSTU(nn.Module):
    """Same interface as Kunlun: (sparse, dense, sequences) -> (B, out_dim)."""

    def __init__(self, cfg: HSTUConfig, sparse_features: tuple[str, ...], dense_dim: int,
                 vocab_sizes: dict[str, int]) -> None:
        super().__init__()
        self.cfg, self.sparse_features = cfg, sparse_features
        d = cfg.dim
        self.history = HistoryTokens(d, cfg.max_len, vocab_sizes, cfg.time_buckets)
        total = sum(cfg.max_len.values()) + 1
        self.layers = nn.ModuleList(HSTULayer(d, cfg.heads, total, cfg.rab_buckets) for _ in range(cfg.layers))
        self.context = nn.Sequential(nn.Linear(len(sparse_features) * d + dense_dim, cfg.mlp_hidden), nn.GELU(),
                                     nn.Linear(cfg.mlp_hidden, d))
        self.out_dim = 2 * d

    def forward(self, sparse: dict[str, torch.Tensor], dense: torch.Tensor,
                sequences: dict[str, dict[str, torch.Tensor]]) -> torch.Tensor:
        b = dense.shape[0]
        blocks = self.history(sequences)
        parts, lengths = [p for p, _, _ in blocks], [n for _, n, _ in blocks]
        # Compact each example's events to the front (types in order), then append the candidate.
        n = torch.stack(lengths, 1)  # (B, types)
        total = int(n.sum(1).max()) if b else 0
        x = dense.new_zeros(b, total + 1, self.cfg.dim)
        start = torch.zeros(b, dtype=torch.long, device=dense.device)
        for part, length in zip(parts, lengths, strict=True):
            cols = torch.arange(part.shape[1], device=dense.device)
            keep = cols[None, :] < length[:, None]
            rows = torch.arange(b, device=dense.device)[:, None].expand_as(keep)
            x[rows[keep], (start[:, None] + cols[None, :])[keep]] = part[keep]
            start = start + length
        candidate = sparse["ad_id"] + sparse.get("surface", 0)
        x[torch.arange(b, device=dense.device), start] = candidate
        seq_len = start + 1
        for layer in self.layers:
            x = layer(x, seq_len)
        target = x[torch.arange(b, device=dense.device), start]  # (B, d)
        context = self.context(torch.cat([*(sparse[f] for f in self.sparse_features), dense], dim=1))
        return torch.cat([target, context], dim=1)


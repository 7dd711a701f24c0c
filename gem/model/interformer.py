"""InterFormer baseline (arXiv 2411.09852), the GEM architecture before Kunlun, in plain torch.

Two streams, X (non-sequence tokens) and S (the user's history), exchanging summaries every layer:
    X_sum = Gate(LCE(X))                                   cross arch: X -> n_sum tokens
    S_sum = Gate([CLS tokens || PMA(S) || K most recent])  cross arch: S -> cls + pma + recent tokens
    X     = LN(X + Back(Wukong([X || S_sum])))            interaction arch (Wukong is the pluggable block;
                                                           Back mixes its n_x + n_ssum tokens back to n_x)
    S     = S + MHA(PFFN(X_sum, S)), PFFN(X_sum, S) = S (X_sum^T W)   sequence arch, RoPE, padding masked
    S     = S + FFN(S)
    output = [Gate(LCE(X)) || S_sum] of the final streams, flattened: (B, (n_sum + cls + pma + recent) * d)

Gate(Z) = Z * sigmoid(MLP(Z)). The CLS tokens are prepended to S at the first layer and carried
through it; PMA is softmax attention from learnable seeds; "most recent" are the K events with the
smallest time gap to the request. S is the event types' most recent `max_len` events each, side by
side with a type embedding (the paper merges several sequences with MaskNet; one concatenated
sequence with type embeddings is the simpler equivalent used for every baseline here).

Shapes: X (B, n_x, d); S (B, cls + sum(max_len), d) with a (B, cls + sum(max_len)) real-position mask.
"""

from __future__ import annotations

import torch
from torch import nn

from gem.model.configs import InterFormerConfig
from gem.model.history import HistoryTokens
from gem.model.kunlun import GatedCompression
from gem.model.ops.rope import rope
from gem.model.wukong import WukongLayer


def softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T / sqrt(dh)) v over allowed keys; q (..., Lq, dh), k, v (..., Lk, dh), mask
    broadcastable to (..., Lq, Lk), True = allowed. Written out (not F.scaled_dot_product_attention)
    so torch's FLOP counter sees the two matmuls on every device (tests/unit/test_flops.py)."""
    scores = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5  # (..., Lq, Lk)
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v


class Gate(nn.Module):
    """Z (B, n, d) -> Z * sigmoid(MLP(Z))."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, dim))

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return z * torch.sigmoid(self.mlp(z))


class SequenceSummary(nn.Module):
    """S (B, L, d), real (B, L), gaps (B, L) -> (B, cls + pma + recent, d)."""

    def __init__(self, cfg: InterFormerConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.seeds = nn.Parameter(torch.randn(cfg.pma_tokens, cfg.dim) * 0.02)
        self.kv = nn.Linear(cfg.dim, 2 * cfg.dim)
        self.gate = Gate(cfg.dim)

    def forward(self, s: torch.Tensor, real: torch.Tensor, gaps: torch.Tensor) -> torch.Tensor:
        b, _, d = s.shape
        c = self.cfg
        k, v = self.kv(s).chunk(2, dim=-1)  # (B, L, d) each
        pma = softmax_attention(self.seeds.expand(b, -1, -1), k, v, real[:, None, :])  # (B, pma, d)
        # The K most recent events: smallest gap to the request among real events (CLS excluded).
        events = real.clone()
        events[:, : c.cls_tokens] = False
        key = torch.where(events, gaps, torch.full_like(gaps, float("inf")))
        order = key.topk(c.recent_tokens, dim=1, largest=False).indices  # (B, K)
        recent = s.gather(1, order[..., None].expand(-1, -1, d)) * events.gather(1, order)[..., None].to(s.dtype)
        return self.gate(torch.cat([s[:, : c.cls_tokens], pma, recent], dim=1))


class InterFormerLayer(nn.Module):
    def __init__(self, cfg: InterFormerConfig, x_tokens: int) -> None:
        super().__init__()
        self.cfg, self.x_tokens = cfg, x_tokens
        d = cfg.dim
        self.compress = GatedCompression(x_tokens, cfg.summary_tokens, d)
        self.summary = SequenceSummary(cfg)
        n_int = x_tokens + cfg.sequence_summary_tokens
        self.interaction = WukongLayer(n_int, d, cfg.wukong_rank, n_int // 2, cfg.mlp_hidden)
        self.back = nn.Linear(n_int, x_tokens)  # token mixing: interaction tokens -> n_x tokens
        self.x_norm = nn.LayerNorm(d)
        self.pffn = nn.Parameter(torch.randn(cfg.summary_tokens, d) * cfg.summary_tokens ** -0.5)
        self.norm = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.ffn = nn.Sequential(nn.LayerNorm(d), nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))

    def forward(self, x: torch.Tensor, s: torch.Tensor, real: torch.Tensor, gaps: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        b, length, d = s.shape
        h, dh = self.cfg.heads, d // self.cfg.heads
        x_sum = self.compress(x)  # (B, n_sum, d)
        s_sum = self.summary(s, real, gaps)  # (B, n_ssum, d)
        mixed = self.interaction(torch.cat([x, s_sum], dim=1))  # (B, n_x + n_ssum, d)
        x = self.x_norm(x + self.back(mixed.transpose(1, 2)).transpose(1, 2))  # (B, n_x, d)
        personal = x_sum.transpose(1, 2) @ self.pffn  # (B, d, d) = X_sum^T W
        p = self.norm(s) @ personal  # (B, L, d)
        q, k, v = (t.view(b, length, h, dh).transpose(1, 2) for t in self.qkv(p).chunk(3, dim=-1))  # (B, H, L, dh)
        att = softmax_attention(rope(q), rope(k), v, real[:, None, None, :])  # (B, H, L, dh)
        s = s + self.out(att.transpose(1, 2).reshape(b, length, d))
        s = s + self.ffn(s)
        return x, s * real[..., None].to(s.dtype)  # padding stays exactly 0


class InterFormer(nn.Module):
    """Same interface as Kunlun: (sparse, dense, sequences) -> (B, out_dim)."""

    def __init__(self, cfg: InterFormerConfig, sparse_features: tuple[str, ...], dense_dim: int,
                 vocab_sizes: dict[str, int]) -> None:
        super().__init__()
        self.cfg, self.sparse_features = cfg, sparse_features
        d = cfg.dim
        x_tokens = len(sparse_features) + cfg.dense_tokens
        self.dense_mlp = nn.Sequential(nn.Linear(dense_dim, cfg.mlp_hidden), nn.GELU(),
                                       nn.Linear(cfg.mlp_hidden, cfg.dense_tokens * d))
        self.history_tokens = HistoryTokens(d, cfg.max_len, vocab_sizes, cfg.time_buckets)
        self.cls = nn.Parameter(torch.randn(cfg.cls_tokens, d) * 0.02)
        self.layers = nn.ModuleList(InterFormerLayer(cfg, x_tokens) for _ in range(cfg.layers))
        self.final_compress = GatedCompression(x_tokens, cfg.summary_tokens, d)
        self.final_summary = SequenceSummary(cfg)
        self.out_dim = (cfg.summary_tokens + cfg.sequence_summary_tokens) * d

    def history(self, sequences: dict[str, dict[str, torch.Tensor]], b: int
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """-> S (B, cls + sum(max_len), d), real (B, same) bool, gaps (B, same) seconds."""
        blocks, reals, gaps = [self.cls.expand(b, -1, -1)], [], []
        for tokens, lengths, gap in self.history_tokens(sequences):
            blocks.append(tokens)  # (B, max_len, d)
            gaps.append(gap)  # (B, max_len)
            reals.append(torch.arange(tokens.shape[1], device=lengths.device)[None, :] < lengths[:, None])
        cls_real = torch.ones(b, self.cfg.cls_tokens, dtype=torch.bool, device=self.cls.device)
        cls_gap = torch.zeros(b, self.cfg.cls_tokens, device=self.cls.device)
        return torch.cat(blocks, 1), torch.cat([cls_real, *reals], 1), torch.cat([cls_gap, *gaps], 1)

    def forward(self, sparse: dict[str, torch.Tensor], dense: torch.Tensor,
                sequences: dict[str, dict[str, torch.Tensor]]) -> torch.Tensor:
        b = dense.shape[0]
        x = torch.cat([torch.stack([sparse[f] for f in self.sparse_features], dim=1),
                       self.dense_mlp(dense).view(b, self.cfg.dense_tokens, self.cfg.dim)], dim=1)  # (B, n_x, d)
        s, real, gaps = self.history(sequences, b)
        for layer in self.layers:
            x, s = layer(x, s, real, gaps)
        out = torch.cat([self.final_compress(x), self.final_summary(s, real, gaps)], dim=1)
        return out.reshape(b, -1)  # (B, (n_sum + cls + pma + recent) * d)

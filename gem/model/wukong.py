"""Wukong interaction layers (arXiv 2403.02545): factorization machine block + linear compress block.

    X_{i+1} = LN(concat(FMB(X_i), LCB(X_i)) + X_i)          X_i: (B, n, d) tokens
    FMB(X) = reshape(MLP(LN(flatten(X (X^T Y)))))            Y: (n, k) learned; X (X^T Y): (B, n, k)
    LCB(X) = W_L X                                           W_L: (n_lcb, n)

FMB outputs n_fmb tokens and LCB n_lcb tokens with n_fmb + n_lcb = n, so the residual adds up.
X (X^T Y) is the pairwise-interaction matrix X X^T projected to rank k: O(n k d) instead of O(n^2 d).

Example:
    >>> layer = WukongLayer(tokens=8, dim=16, rank=4, fmb_tokens=4, mlp_hidden=64)
    >>> layer(torch.randn(2, 8, 16)).shape
    torch.Size([2, 8, 16])
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import nn

from gem.model.history import pooled_histories

if TYPE_CHECKING:
    from gem.model.configs import WukongConfig


class WukongLayer(nn.Module):
    def __init__(self, tokens: int, dim: int, rank: int, fmb_tokens: int, mlp_hidden: int) -> None:
        super().__init__()
        if not 0 < fmb_tokens < tokens:
            raise ValueError(f"fmb_tokens must be in (0, {tokens}), got {fmb_tokens}")
        self.tokens, self.dim, self.fmb_tokens = tokens, dim, fmb_tokens
        self.y = nn.Parameter(torch.randn(tokens, rank) * tokens ** -0.5)
        self.fmb_norm = nn.LayerNorm(tokens * rank)
        self.fmb_mlp = nn.Sequential(
            nn.Linear(tokens * rank, mlp_hidden), nn.GELU(), nn.Linear(mlp_hidden, fmb_tokens * dim)
        )
        self.lcb = nn.Linear(tokens, tokens - fmb_tokens, bias=False)  # mixes tokens, per channel
        self.out_norm = nn.LayerNorm(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b = x.shape[0]
        xty = torch.einsum("bnd,nk->bdk", x, self.y)  # (B, d, k) = X^T Y
        inter = torch.einsum("bnd,bdk->bnk", x, xty)  # (B, n, k) = X (X^T Y)
        fmb = self.fmb_mlp(self.fmb_norm(inter.reshape(b, -1))).view(b, self.fmb_tokens, self.dim)
        lcb = self.lcb(x.transpose(1, 2)).transpose(1, 2)  # (B, n - n_fmb, d)
        return self.out_norm(torch.cat([fmb, lcb], dim=1) + x)

    def flops(self) -> int:
        """Forward multiply-adds x 2 per example."""
        n, d, k = self.tokens, self.dim, self.y.shape[1]
        h = self.fmb_mlp[0].out_features
        return 2 * (2 * n * d * k + n * k * h + h * self.fmb_tokens * d + n * (n - self.fmb_tokens) * d)


class WukongStack(nn.Module):
    """`layers` Wukong layers on the same token count."""

    def __init__(self, layers: int, tokens: int, dim: int, rank: int, fmb_tokens: int, mlp_hidden: int) -> None:
        super().__init__()
        self.layers = nn.ModuleList(WukongLayer(tokens, dim, rank, fmb_tokens, mlp_hidden) for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x

    def flops(self) -> int:
        return sum(layer.flops() for layer in self.layers)


class MixtureOfWukongExperts(nn.Module):
    """Kunlun's global interaction: M Wukong stacks, expert m on its own contiguous block of tokens.

    tokens (B, n, d) -> (B, n, d); n must split into `experts` blocks of equal size.
    """

    def __init__(self, experts: int, layers: int, tokens: int, dim: int, rank: int, mlp_hidden: int) -> None:
        super().__init__()
        if tokens % experts:
            raise ValueError(f"{tokens} tokens do not split into {experts} equal expert blocks")
        self.block = tokens // experts
        if self.block < 2:
            raise ValueError(f"each of the {experts} experts needs at least 2 tokens, got {self.block}")
        fmb = max(1, self.block // 2)
        self.experts = nn.ModuleList(
            WukongStack(layers, self.block, dim, rank, fmb, mlp_hidden) for _ in range(experts)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        parts = x.split(self.block, dim=1)  # experts x (B, block, d)
        return torch.cat([e(p) for e, p in zip(self.experts, parts, strict=True)], dim=1)

    def flops(self) -> int:
        return sum(e.flops() for e in self.experts)


class WukongModel(nn.Module):
    """The Wukong baseline body: feature tokens -> Wukong stack -> flattened (B, n * d).

    Tokens: one per sparse id feature, `dense_tokens` from an MLP of the dense features, and one per
    event type: the mean of its most recent `max_len` id embeddings (a pooled bag; Wukong has no
    sequence model). Same interface as Kunlun: (sparse, dense, sequences) -> (B, out_dim).
    """

    def __init__(self, cfg: WukongConfig, sparse_features: tuple[str, ...], dense_dim: int) -> None:
        super().__init__()
        self.cfg, self.sparse_features = cfg, sparse_features
        self.tokens = len(sparse_features) + cfg.dense_tokens + len(cfg.max_len)
        self.dense_mlp = nn.Sequential(nn.Linear(dense_dim, cfg.mlp_hidden), nn.GELU(),
                                       nn.Linear(cfg.mlp_hidden, cfg.dense_tokens * cfg.dim))
        self.stack = WukongStack(cfg.layers, self.tokens, cfg.dim, cfg.rank, self.tokens // 2, cfg.mlp_hidden)
        self.out_dim = self.tokens * cfg.dim

    def forward(self, sparse: dict[str, torch.Tensor], dense: torch.Tensor,
                sequences: dict[str, dict[str, torch.Tensor]]) -> torch.Tensor:
        b = dense.shape[0]
        bags = pooled_histories(sequences, self.cfg.max_len)  # types x (B, d)
        x = torch.cat([torch.stack([*(sparse[f] for f in self.sparse_features), *bags], dim=1),
                       self.dense_mlp(dense).view(b, self.cfg.dense_tokens, self.cfg.dim)], dim=1)  # (B, n, d)
        return self.stack(x).reshape(b, -1)

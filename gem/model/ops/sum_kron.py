"""SumKronLinear (Kunlun's HSP compression): many seed tokens -> T output tokens with k rank terms.

    Y = sum_{i=1..k} Z_i^T X W_i          X (B, S, d) seeds, Z_i (S, T), W_i (d, e) -> Y (B, T, e)

Each term mixes tokens (Z_i) and channels (W_i) separately, i.e. a linear map over the flattened
(S*d) input whose matrix is a sum of k Kronecker products Z_i (x) W_i: k*(S*T + d*e) parameters
instead of S*d*T*e.
"""

from __future__ import annotations

import torch
from torch import nn


def sum_kron_linear_reference(x: torch.Tensor, z: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Term by term, as written: x (B, S, d), z (k, S, T), w (k, d, e) -> (B, T, e)."""
    return sum(z[i].transpose(0, 1) @ x @ w[i] for i in range(z.shape[0]))


def sum_kron_linear(x: torch.Tensor, z: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The same sum in two batched contractions (tokens first: S*T*d per term, then channels)."""
    mixed = torch.einsum("kst,bsd->bktd", z, x)  # (B, k, T, d)
    return torch.einsum("bktd,kde->bte", mixed, w)


class SumKronLinear(nn.Module):
    def __init__(self, in_tokens: int, out_tokens: int, dim_in: int, dim_out: int, rank: int) -> None:
        super().__init__()
        self.z = nn.Parameter(torch.randn(rank, in_tokens, out_tokens) * in_tokens ** -0.5)
        self.w = nn.Parameter(torch.randn(rank, dim_in, dim_out) * (rank * dim_in) ** -0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum_kron_linear(x, self.z, self.w)

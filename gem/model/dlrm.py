"""DLRM baseline, the torchrec.models.dlrm architecture in plain torch (no torchrec import here).

    dense (B, D_in) --DenseArch MLP (ReLU on every layer)--> (B, d)
    sparse embeddings (B, F, d): the id features, then each event type's sequence as a mean-pooled bag
    InteractionArch: [dense || sparse] (B, F+1, d) -> pairwise dot products, upper triangle without
                     the diagonal ((F+1) F / 2 values), concatenated after the dense vector
    OverArch: MLP, ReLU on all but the last layer -> (B, over_arch[-1]) for the task heads

Same layout and math as torchrec's DenseArch / InteractionArch / OverArch, so a torchrec DLRM's
weights load into it (tests/unit/test_baselines.py checks the outputs agree). torchrec's over arch ends
in one logit; here the shared domain-expert heads read its last hidden layer, as every
architecture's representation is read.
"""

from __future__ import annotations

import itertools

import torch
from torch import nn

from gem.model.configs import DLRMConfig
from gem.model.history import pooled_histories


def mlp(sizes: list[int], relu_last: bool) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (n_in, n_out) in enumerate(itertools.pairwise(sizes)):
        layers.append(nn.Linear(n_in, n_out))
        if relu_last or i < len(sizes) - 2:
            layers.append(nn.ReLU())
    return nn.Sequential(*layers)


def dot_interaction(dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
    """(B, d), (B, F, d) -> (B, d + (F+1) F / 2): dense, then <v_i, v_j> for i < j over [dense || sparse]."""
    combined = torch.cat([dense[:, None], sparse], dim=1)  # (B, F+1, d)
    gram = combined @ combined.transpose(1, 2)  # (B, F+1, F+1)
    i, j = torch.triu_indices(combined.shape[1], combined.shape[1], offset=1, device=dense.device)
    return torch.cat([dense, gram[:, i, j]], dim=1)


class DLRM(nn.Module):
    """Same interface as Kunlun: (sparse, dense, sequences) -> (B, out_dim)."""

    def __init__(self, cfg: DLRMConfig, sparse_features: tuple[str, ...], dense_dim: int) -> None:
        super().__init__()
        self.cfg, self.sparse_features = cfg, sparse_features
        self.dense_arch = mlp([dense_dim, *cfg.dense_arch], relu_last=True)
        n = len(sparse_features) + len(cfg.max_len)
        self.over_arch = mlp([cfg.dim + n * (n + 1) // 2, *cfg.over_arch], relu_last=False)
        self.out_dim = cfg.over_arch[-1]

    def forward(self, sparse: dict[str, torch.Tensor], dense: torch.Tensor,
                sequences: dict[str, dict[str, torch.Tensor]]) -> torch.Tensor:
        bags = pooled_histories(sequences, self.cfg.max_len)  # types x (B, d)
        embedded = torch.stack([*(sparse[f] for f in self.sparse_features), *bags], dim=1)  # (B, F, d)
        return self.over_arch(dot_interaction(self.dense_arch(dense), embedded))

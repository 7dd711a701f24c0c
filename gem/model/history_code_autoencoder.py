"""LoopFM's history-code autoencoder (arXiv 2605.29280): the foundation model's representation of an
example compressed to a few INT4 codes, trained beside pretraining, stored per user per event.

What it compresses: the task heads' input, GemTrainTask.representation (B, body.out_dim) - for
Kunlun the final [Gate(LCE(X)) || HSP_e(S_e)] tokens, flattened. It is the deepest activation every
task shares (the heads specialize after it), it already mixes the user's whole history with the ad
of that event, and the precompute stage computes it anyway for the predictions it logs, so coding
it costs one small encoder and no extra foundation-model forward.

    x   = LayerNorm(h)                      h (B, D) stop-gradient; no affine: the code keeps the
                                            direction and relative sizes, not the overall scale
    z   = tanh(Encoder(x))                  (B, K) in (-1, 1)
    z_q = round(8 z).clamp(-8, 7) / 8       INT4 (gem.model.ops.int4), straight-through in training
    loss = mean over n in prefix_lengths of  mean((Decoder(z_q[:, :n] || 0) - x)^2)

Matryoshka: the decoder reconstructs from every prefix of the code (the tail zeroed, i.e. only the
first n columns of its first layer read), so the first codes carry the most and a reader may keep
any prefix. Encoder and decoder: Linear -> GELU -> Linear.

Shapes: h (B, D) -> codes (B, K) int8 in [-8, 7] (stored packed, K / 2 bytes per event).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from gem.model.configs import HistoryCodesConfig
from gem.model.ops.int4 import int4_codes, quantize_int4


class HistoryCodeAutoencoder(nn.Module):
    def __init__(self, in_dim: int, cfg: HistoryCodesConfig) -> None:
        super().__init__()
        self.cfg, self.in_dim = cfg, in_dim
        self.encoder = nn.Sequential(nn.Linear(in_dim, cfg.hidden), nn.GELU(), nn.Linear(cfg.hidden, cfg.code_dim))
        self.decoder = nn.Sequential(nn.Linear(cfg.code_dim, cfg.hidden), nn.GELU(), nn.Linear(cfg.hidden, in_dim))

    def normalized(self, h: torch.Tensor) -> torch.Tensor:
        """(B, D) -> (B, D): each row to zero mean, unit variance (the reconstruction target)."""
        return F.layer_norm(h, (self.in_dim,))

    def encode(self, h: torch.Tensor) -> torch.Tensor:
        """(B, D) -> z_q (B, K): the dequantized codes, with a straight-through gradient."""
        return quantize_int4(torch.tanh(self.encoder(self.normalized(h))))

    @torch.no_grad()
    def codes(self, h: torch.Tensor) -> torch.Tensor:
        """(B, D) -> (B, K) int8 codes in [-8, 7]: what precompute stores (pack with ops.int4.pack_int4)."""
        return int4_codes(torch.tanh(self.encoder(self.normalized(h))))

    def decode(self, z: torch.Tensor, prefix: int | None = None) -> torch.Tensor:
        """(B, K) codes (dequantized) -> (B, D) reconstruction from the first `prefix` codes (all: None)."""
        if prefix is not None:
            keep = torch.arange(z.shape[-1], device=z.device) < prefix  # (K,)
            z = z * keep.to(z.dtype)
        return self.decoder(z)

    def reconstruction_errors(self, h: torch.Tensor) -> dict[int, torch.Tensor]:
        """prefix length -> mean squared error of the normalized h reconstructed from that prefix."""
        target = self.normalized(h)
        z = self.encode(h)
        return {n: (self.decode(z, n) - target).square().mean() for n in self.cfg.prefix_lengths}

    def loss(self, h: torch.Tensor) -> torch.Tensor:
        """The Matryoshka loss: the mean of reconstruction_errors over the prefix lengths. Pass
        h.detach() (GemTrainTask does): the foundation model never learns from it."""
        errors = self.reconstruction_errors(h)
        return torch.stack(list(errors.values())).mean()

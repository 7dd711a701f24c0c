"""INT4 codes of values in [-1, 1] (LoopFM's quantized bottleneck) and their 4-bit packing.

    code(z)       = clamp(round(8 z), -8, 7)           integers -8 .. 7 (round half to even)
    dequantize(c) = c / 8                               values -1, -0.875, .., 0.875
    quantize(z)   = z + stop_gradient(code(z) / 8 - z)  value code(z) / 8, gradient 1 (straight-through)

Packing: two codes per byte, nibble = code + 8 (0 .. 15); code 2i in the low nibble of byte i,
code 2i+1 in the high nibble. (N, K) codes -> (N, K / 2) uint8, K even.

Example:
    >>> int4_codes(torch.tensor([[-1.0, 0.3, 0.99, 0.06]]))
    tensor([[-8,  2,  7,  0]], dtype=torch.int8)
    >>> pack_int4(torch.tensor([[-8, 2, 7, 0]], dtype=torch.int8))   # nibbles 0, 10 | 15, 8
    tensor([[160, 143]], dtype=torch.uint8)
"""

from __future__ import annotations

import torch

LEVELS = 8  # z * LEVELS rounds to the integer code; 16 codes -8 .. 7


def int4_codes(z: torch.Tensor) -> torch.Tensor:
    """(..., K) float in [-1, 1] -> (..., K) int8 codes in [-8, 7]."""
    return torch.round(z * LEVELS).clamp(-LEVELS, LEVELS - 1).to(torch.int8)


def dequantize_int4(codes: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(..., K) integer codes -> (..., K) float codes / 8."""
    return codes.to(dtype) / LEVELS


def quantize_int4(z: torch.Tensor) -> torch.Tensor:
    """The value code(z) / 8 with a straight-through gradient (dz passes unchanged), for training
    through the quantizer."""
    quantized = torch.round(z * LEVELS).clamp(-LEVELS, LEVELS - 1) / LEVELS
    return z + (quantized - z).detach()


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """(N, K) int codes in [-8, 7], K even -> (N, K / 2) uint8, two codes per byte."""
    if codes.shape[-1] % 2:
        raise ValueError(f"packing needs an even number of codes per row, got {codes.shape[-1]}")
    if codes.numel() and (int(codes.min()) < -LEVELS or int(codes.max()) > LEVELS - 1):
        raise ValueError(f"INT4 codes must lie in [-8, 7], got [{int(codes.min())}, {int(codes.max())}]")
    nibbles = (codes.to(torch.int16) + LEVELS).to(torch.uint8)  # (N, K) 0 .. 15
    return nibbles[..., 0::2] | (nibbles[..., 1::2] << 4)  # (N, K / 2)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """(N, K / 2) uint8 -> (N, K) int8 codes in [-8, 7]: the inverse of pack_int4."""
    low, high = packed & 0x0F, packed >> 4  # (N, K / 2) each: codes 0, 2, 4 .. and 1, 3, 5 ..
    nibbles = torch.stack([low, high], dim=-1).flatten(-2)  # (N, K / 2, 2) -> (N, K), interleaved back
    return (nibbles.to(torch.int16) - LEVELS).to(torch.int8)

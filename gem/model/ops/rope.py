"""Rotary position embedding (RoPE): rotate each pair of channels by an angle proportional to the position.

    x (..., L, dh), dh even -> x with channel pair (2i, 2i+1) at position p rotated by p * base^(-2i/dh)

So <rope(q)_i, rope(k)_j> depends on q, k and i - j only (tests/unit/test_baselines.py checks this).
"""

from __future__ import annotations

import torch


def rope(x: torch.Tensor, base: float = 10_000.0) -> torch.Tensor:
    length, dh = x.shape[-2], x.shape[-1]
    if dh % 2:
        raise ValueError(f"RoPE needs an even head width, got {dh}")
    inv_freq = base ** (-torch.arange(0, dh, 2, device=x.device, dtype=torch.float32) / dh)  # (dh/2,)
    angle = torch.arange(length, device=x.device, dtype=torch.float32)[:, None] * inv_freq  # (L, dh/2)
    cos, sin = angle.cos().to(x.dtype), angle.sin().to(x.dtype)
    even, odd = x[..., 0::2], x[..., 1::2]  # (..., L, dh/2) each
    return torch.stack([even * cos - odd * sin, even * sin + odd * cos], dim=-1).flatten(-2)

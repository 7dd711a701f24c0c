"""Log-scaled time-gap buckets: how long before the request an event happened, as an embedding index.

    bucket(gap) = min(n_buckets - 1, floor(log(1 + gap_s / unit_s) / log(base)))   (gap < 0 -> 0)

With unit 60 s and base 2 the buckets are < 1 min, 1-3 min, 3-7 min, ... so recent events are told
apart finely and old ones coarsely. Example: gaps [0, 30, 3600, 86400*30] s -> [0, 0, 5, 15].
"""

from __future__ import annotations

import math

import torch


def time_gap_buckets(gap_s: torch.Tensor, n_buckets: int, unit_s: float = 60.0, base: float = 2.0) -> torch.Tensor:
    gap = torch.clamp(gap_s.to(torch.float64), min=0.0)
    raw = torch.floor(torch.log1p(gap / unit_s) / math.log(base))
    return torch.clamp(raw, 0, n_buckets - 1).to(torch.int64)

"""The student's LoopFM feature: its user's past foundation-model codes as a short sequence, pooled.

For an example at time t, of its user's coded events (in time order, oldest first) it keeps those with

    t - max_age < time < t         strictly before the example, within max_age_days

and of them the most recent max_codes, so a code logged at or after the example (its own
impression, later ones) can never reach it. Each kept event becomes a token of width d:

    token = Linear(unpack + dequantize(codes))  +  embedding of the log time-gap bucket of t - time

and the tokens are pooled two ways, both (B, d) and 0 for an example with no kept event:

    mean       the mean of the kept tokens
    attention  softmax_j(q . k_j / sqrt(d)) v_j,   q = W_q target,  k_j = W_k token_j,  v_j = W_v token_j

target: the candidate ad's embedding (B, d), so the student weighs the past events by the ad it scores.
The two vectors enter the student's DLRM as two more feature embeddings (gem.model.student).
"""

from __future__ import annotations

import torch
from torch import nn

from gem.data.batch import Jagged
from gem.model.configs import HistoryCodeFeatureConfig
from gem.model.ops.int4 import dequantize_int4, unpack_int4
from gem.model.ops.jagged import jagged_mean, keep_last, to_padded
from gem.model.ops.masks import padding_mask
from gem.model.ops.softmax_attention import softmax_attention
from gem.model.ops.time_encoding import time_gap_buckets

MICROSECONDS_PER_DAY = 86_400 * 1_000_000


def past_code_positions(time_us: torch.Tensor, offsets: torch.Tensor, example_time_us: torch.Tensor,
                        max_codes: int, max_age_us: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Which coded events each example reads: (index (M,) into the N events, offsets (B+1,)).

    time_us (N,) int64 event times, oldest first within each example; offsets (B+1,); example_time_us
    (B,) int64. Kept: 0 < example time - event time <= max_age_us, then the last max_codes of those.

    Example: times [1, 5, 9, 12], offsets [0, 4], example time 9, max_codes 5, max_age 6 -> index [1]
    (time 1 is older than 6, time 9 is not strictly before, time 12 is after), offsets [0, 1].
    """
    lengths = offsets[1:] - offsets[:-1]  # (B,)
    row = torch.repeat_interleave(torch.arange(lengths.numel(), device=offsets.device), lengths)  # (N,)
    age = example_time_us[row] - time_us  # (N,) microseconds before the example
    eligible = ((age > 0) & (age <= max_age_us)).nonzero().squeeze(1)  # (N_e,) in the events' order
    counts = torch.bincount(row[eligible], minlength=lengths.numel())  # (B,)
    within, kept_offsets = keep_last(torch.cat([offsets.new_zeros(1), counts.cumsum(0)]), max_codes)
    return eligible[within], kept_offsets


class HistoryCodeFeature(nn.Module):
    """(history Jagged of N coded events, example times (B,), target (B, d)) -> (mean (B, d), attention (B, d))."""

    def __init__(self, code_dim: int, dim: int, cfg: HistoryCodeFeatureConfig) -> None:
        super().__init__()
        self.cfg, self.dim = cfg, dim
        self.max_age_us = int(cfg.max_age_days * MICROSECONDS_PER_DAY)
        self.code = nn.Linear(code_dim, dim)
        self.time = nn.Embedding(cfg.time_buckets, dim)
        self.query, self.key, self.value = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)

    def tokens(self, history: Jagged, example_time_us: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The kept events as tokens: ((M, d), offsets (B+1,))."""
        time_us = history.values["time_us"]
        index, offsets = past_code_positions(time_us, history.offsets, example_time_us, self.cfg.max_codes,
                                             self.max_age_us)
        lengths = offsets[1:] - offsets[:-1]
        row = torch.repeat_interleave(torch.arange(lengths.numel(), device=offsets.device), lengths)  # (M,)
        codes = dequantize_int4(unpack_int4(history.values["codes"][index]), self.code.weight.dtype)  # (M, K)
        gap_s = (example_time_us[row] - time_us[index]).double() / 1e6  # (M,) > 0
        return self.code(codes) + self.time(time_gap_buckets(gap_s, self.cfg.time_buckets)), offsets

    def forward(self, history: Jagged, example_time_us: torch.Tensor,
                target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        tokens, offsets = self.tokens(history, example_time_us)  # (M, d), (B+1,)
        lengths = offsets[1:] - offsets[:-1]
        mean = jagged_mean(tokens, offsets)  # (B, d)
        longest = max(1, int(lengths.max()) if lengths.numel() else 1)
        padded = to_padded(tokens, offsets, longest)  # (B, L, d), zeros after each length
        q = self.query(target)[:, None, None, :]  # (B, 1 head, 1 query, d)
        k, v = self.key(padded)[:, None], self.value(padded)[:, None]  # (B, 1, L, d) each
        mask = padding_mask(lengths, longest)[:, None, None, :]  # (B, 1, 1, L)
        attended = softmax_attention(q, k, v, self.dim ** -0.5, mask)[:, 0, 0]  # (B, d), 0 with no key
        return mean, attended

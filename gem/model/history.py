"""The user's history as tokens of one width, for the models that read all event types in one
stream (HSTU, InterFormer): each event type's most recent `max_len` events, oldest first,

    token = id embedding + surface + objective + log time-gap bucket + event-type embedding

padded per type to (B, max_len, d), with each example's lengths and time gaps (seconds before the
request) alongside. Kunlun embeds each event type at its own width instead (gem/model/kunlun.py).
The models without a sequence module (Wukong, DLRM) read `pooled_histories`: one mean-pooled bag of
id embeddings per event type.
"""

from __future__ import annotations

import torch
from torch import nn

from gem.model.ops.jagged import keep_last, recent_mean, to_padded
from gem.model.ops.time_encoding import time_gap_buckets


class HistoryTokens(nn.Module):
    def __init__(self, dim: int, max_len: dict[str, int], vocab_sizes: dict[str, int], time_buckets: int) -> None:
        super().__init__()
        self.max_len, self.time_buckets = dict(max_len), time_buckets
        self.type_embedding = nn.Embedding(len(max_len), dim)
        self.surface = nn.Embedding(vocab_sizes["surface"], dim)
        self.objective = nn.Embedding(vocab_sizes["objective"], dim)
        self.time = nn.Embedding(time_buckets, dim)

    def forward(self, sequences: dict[str, dict[str, torch.Tensor]]
                ) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """-> per event type, in max_len order: (tokens (B, max_len, d) zero-padded, lengths (B,),
        gaps (B, max_len) seconds, 0 at padding)."""
        out = []
        for t, (event, max_len) in enumerate(self.max_len.items()):
            seq = sequences[event]
            index, offsets = keep_last(seq["offsets"], max_len)
            gap = seq["gap_s"][index]
            tokens = (seq["id_emb"][index] + self.surface(seq["surface"][index])
                      + self.objective(seq["objective"][index])
                      + self.time(time_gap_buckets(gap, self.time_buckets)) + self.type_embedding.weight[t])
            out.append((to_padded(tokens, offsets, max_len), offsets[1:] - offsets[:-1],
                        to_padded(gap.float(), offsets, max_len)))
        return out


def pooled_histories(sequences: dict[str, dict[str, torch.Tensor]], max_len: dict[str, int]) -> list[torch.Tensor]:
    """Per event type (in max_len order), the mean id embedding of its most recent max_len events:
    (B, d) each, zeros for an empty history (an EmbeddingBag with mean pooling)."""
    return [recent_mean(sequences[e]["id_emb"], sequences[e]["offsets"], n) for e, n in max_len.items()]

"""Sparse id embeddings in plain torch (gem/model/sparse.py holds the same tables in a torchrec EmbeddingCollection).

Id policy, per feature: the loader hands stable 63-bit hashes (free-form ids) or vocabulary
indices + 1 (closed vocabularies, 0 = unknown); a table of `buckets[feature]` rows takes value
% buckets. So an id never seen in training still lands in some row (shared with others by hashing),
and a vocabulary value outside the schema lands in row 0. Sequence ad ids share the ad_id table, so
an ad's embedding is the same as a candidate and as a past event.
"""

from __future__ import annotations

import torch
from torch import nn

from gem.data.batch import Batch
from gem.model.configs import EmbeddingConfig

# The same tables' state keys in gem.model.sparse.TorchrecEmbeddings (its EmbeddingCollection's), mapped
# here so that plain-torch readers of a torchrec-trained checkpoint need no torchrec.
COLLECTION_PREFIX = "embeddings.collection.embeddings."


def plain_state_key(key: str) -> str:
    """A task state key of a TorchrecEmbeddings table -> the same table's key in PlainEmbeddings.

    "embeddings.collection.embeddings.user_id.weight" -> "embeddings.tables.user_id.weight"
    """
    if not key.startswith(COLLECTION_PREFIX):
        raise ValueError(f"{key!r} is not a table of the embedding collection")
    return "embeddings.tables." + key[len(COLLECTION_PREFIX):]


def collection_state_key(key: str) -> str:
    """The inverse of plain_state_key: "embeddings.tables.user_id.weight" ->
    "embeddings.collection.embeddings.user_id.weight" (other keys unchanged)."""
    prefix = "embeddings.tables."
    return COLLECTION_PREFIX + key[len(prefix):] if key.startswith(prefix) else key


class PlainEmbeddings(nn.Module):
    """sparse ids (B,) per feature -> (B, dim); sequence ids (N,) -> (N, dim)."""

    backend = "torch"  # model.embeddings.backend

    def __init__(self, cfg: EmbeddingConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tables = nn.ModuleDict({f: nn.Embedding(n, cfg.dim) for f, n in cfg.buckets.items()})
        for t in self.tables.values():
            nn.init.normal_(t.weight, std=0.02)

    def lookup(self, feature: str, ids: torch.Tensor) -> torch.Tensor:
        return self.tables[feature](torch.remainder(ids, self.cfg.buckets[feature]))

    def forward(self, sparse: dict[str, torch.Tensor], sequence_ids: dict[str, torch.Tensor]
                ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        return ({f: self.lookup(f, v) for f, v in sparse.items()},
                {e: self.lookup(self.cfg.sequence_table, v) for e, v in sequence_ids.items()})

    def embed(self, batch: Batch) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """A batch's ids -> ({feature: (B, dim)}, {event: (N_event, dim)}), as TorchrecEmbeddings.embed."""
        return self({f: s.values for f, s in batch.sparse.items()},
                    {e: j.values["ad_id"] for e, j in batch.sequences.items()})

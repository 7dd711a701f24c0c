"""Sparse ids through torchrec: one EmbeddingCollection over the batch's KeyedJaggedTensors.

The same tables and id policy as gem.model.embeddings.PlainEmbeddings (ids taken modulo the
table's `buckets`, sequence ad ids in the shared `sequence_table`), so the two are interchangeable
(tests/distributed/test_sparse.py loads the same weights into both and compares). This module is what
torchrec shards (gem.train.sharding); the dense model never imports torchrec.

Input, from a Batch of B examples:
    batch.to_kjt():        keys = sparse features, one id per example      e.g. lengths [1, 1, 1]
    batch.sequence_kjt():  keys = event types, each example's history ids   e.g. lengths [3, 0, 2]
Output: ({feature: (B, dim)}, {event: (N_event, dim)}), as PlainEmbeddings.embed returns.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torchrec import EmbeddingCollection
from torchrec import EmbeddingConfig as TableConfig
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from gem.data.batch import Batch
from gem.model.configs import EmbeddingConfig


def sequence_key(event: str) -> str:
    """The KJT key of an event type's history ids (a feature of the shared sequence table)."""
    return f"{event}_history"


class TorchrecEmbeddings(nn.Module):
    backend = "torchrec"  # model.embeddings.backend: sharded by gem.train.sharding in training

    def __init__(self, cfg: EmbeddingConfig, events: tuple[str, ...], device: torch.device | None = None) -> None:
        super().__init__()

        if cfg.sequence_table not in cfg.buckets:
            raise ValueError(f"sequence_table {cfg.sequence_table!r} has no table in buckets {sorted(cfg.buckets)}")
        self.cfg, self.events = cfg, events
        tables = [
            TableConfig(name=name, embedding_dim=cfg.dim, num_embeddings=rows,
                        feature_names=[name] + ([sequence_key(e) for e in events] if name == cfg.sequence_table else []))
            for name, rows in cfg.buckets.items()
        ]
        self.collection = EmbeddingCollection(tables=tables, device=device or torch.device("cpu"))
        self.rows = dict(cfg.buckets) | {
            sequence_key(e): cfg.buckets[cfg.sequence_table] for e in events}
        for table in self.collection.embeddings.values():
            nn.init.normal_(table.weight, std=0.02)

    def features(self, batch: Batch) -> Any:
        """The batch's id KJTs, concatenated, each key's ids taken modulo its table's rows."""
        kjt = KeyedJaggedTensor.concat([batch.to_kjt(), batch.sequence_kjt("ad_id")])
        renamed = [k if k in batch.sparse else sequence_key(k) for k in kjt.keys()]  # noqa: SIM118 (a KJT, not a dict)
        per_key = torch.split(kjt.values(), kjt.length_per_key())
        values = torch.cat([torch.remainder(v, self.rows[k]) for k, v in zip(renamed, per_key, strict=True)])
        return KeyedJaggedTensor.from_lengths_sync(keys=renamed, values=values, lengths=kjt.lengths())

    def embed(self, batch: Batch) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        out = self.collection(self.features(batch))
        sparse = {f: out[f].values() for f in batch.sparse}
        for f, emb in sparse.items():
            if emb.shape[0] != batch.size:
                raise ValueError(f"sparse feature {f!r} must have exactly one id per example, got {emb.shape[0]} "
                                 f"for {batch.size} examples")
        return sparse, {e: out[sequence_key(e)].values() for e in batch.sequences}

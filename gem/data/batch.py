"""The training batch: plain torch tensors, convertible to torchrec KeyedJaggedTensors.

torchrec is imported only by `to_kjt` / `sequence_kjt`, so the batch (and the dense model) work
where torchrec cannot be installed.

Layout for B examples and T tasks:
    dense      (B, D) float32       counters of the user and the ad (log1p counts, rates, 0 when null)
    sparse     name -> Sparse(values (N,) int64, lengths (B,) int32)   one id per example here
    sequences  event type -> Jagged(values: field -> (N_type,) tensor, offsets (B+1,) int64)
    labels     (B, T) float32       label of each task (0 where the task does not apply)
    label_mask (B, T) bool          the example was drawn for that task (its surface's tasks only)
    weights    (B, T) float32       importance weight 1 / draw probability; 0 where masked
A student's batch (gem.model.student) also carries what the foundation model logged, from the
precompute tables (None in pretraining):
    fm_predictions      (B, T) float32  the FM's probability per task; fm_prediction_mask (B, T) bool where it has one
    fm_history_codes    Jagged: per example, its user's coded events in time order, oldest first:
                        values "codes" (N, K/2) uint8 (INT4 packed, gem.model.ops.int4), "time_us" (N,) int64

Jagged example (B = 2, impressions): the first example has 3 earlier impressions, the second none:
    offsets = [0, 3, 3]; values["ad_id"] = [h1, h2, h3]; values["gap_s"] = [86400.0, 3600.0, 5.0]
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

import torch

from gem.model.ops.length_groups import padded_positions


@dataclass
class Sparse:
    values: torch.Tensor  # (N,) int64
    lengths: torch.Tensor  # (B,) int32


@dataclass
class Jagged:
    values: dict[str, torch.Tensor]  # field -> (N,) tensor; all fields share the offsets
    offsets: torch.Tensor  # (B+1,) int64

    @property
    def lengths(self) -> torch.Tensor:
        return self.offsets[1:] - self.offsets[:-1]


@dataclass
class Batch:
    dense: torch.Tensor
    sparse: dict[str, Sparse]
    sequences: dict[str, Jagged]
    labels: torch.Tensor
    label_mask: torch.Tensor
    weights: torch.Tensor
    tasks: tuple[str, ...]
    impression_times: torch.Tensor  # (B,) int64 microseconds since epoch
    example_ids: list[str] = field(default_factory=list)  # impression ids, for tests and debugging
    # Loader bookkeeping for exact resume: which shard produced the batch and where it continues.
    meta: dict[str, Any] = field(default_factory=dict)
    fm_predictions: torch.Tensor | None = None
    fm_prediction_mask: torch.Tensor | None = None
    fm_history_codes: Jagged | None = None

    @property
    def size(self) -> int:
        return int(self.dense.shape[0])

    def padded_sizes(self, groups: int = 1) -> dict[str, tuple[int, int]]:
        """Per event type, (real events, positions of the padded blocks): what a padded kernel
        computes on, against what a jagged one does. groups: the batch computed in that many length
        groups, each padded to its own longest (gem.model.ops.length_groups); 1: one (B, max length)
        block."""
        events = list(self.sequences)
        if not events or not self.size:
            return {e: (0, 0) for e in events}
        lengths = torch.stack([self.sequences[e].lengths for e in events], dim=1)  # (B, E)
        real, padded = padded_positions(lengths, groups)
        return {e: (int(r), int(p)) for e, r, p in zip(events, real, padded, strict=True)}

    def to(self, device: torch.device | str) -> Batch:
        def move(x: Any) -> Any:
            if isinstance(x, torch.Tensor):
                return x.to(device, non_blocking=True)
            if isinstance(x, Sparse):
                return Sparse(move(x.values), move(x.lengths))
            if isinstance(x, Jagged):
                return Jagged({k: move(v) for k, v in x.values.items()}, move(x.offsets))
            if isinstance(x, dict):
                return {k: move(v) for k, v in x.items()}
            return x

        return replace(self, **{f.name: move(getattr(self, f.name)) for f in fields(self)})

    def to_kjt(self) -> Any:
        """The sparse ids as one torchrec KeyedJaggedTensor (keys in `sparse` order)."""
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor  # noqa: PLC0415 - torchrec is optional

        keys = list(self.sparse)
        return KeyedJaggedTensor.from_lengths_sync(
            keys=keys,
            values=torch.cat([self.sparse[k].values for k in keys]),
            lengths=torch.cat([self.sparse[k].lengths for k in keys]).to(torch.int32),
        )

    def sequence_kjt(self, value_field: str = "ad_id") -> Any:
        """One id field of every sequence as a KeyedJaggedTensor keyed by event type."""
        from torchrec.sparse.jagged_tensor import KeyedJaggedTensor  # noqa: PLC0415 - torchrec is optional

        keys = [k for k, j in self.sequences.items() if value_field in j.values]
        return KeyedJaggedTensor.from_lengths_sync(
            keys=keys,
            values=torch.cat([self.sequences[k].values[value_field] for k in keys]),
            lengths=torch.cat([self.sequences[k].lengths for k in keys]).to(torch.int32),
        )

"""Fixed user-hash-range shards and the claims workers take on them.

A user's shard is the range of the 63-bit stable hash of their id (gem.data.encode.hash_ids) among
`shards` equal ranges: shard = hash // ceil(2^63 / shards). The ranges never depend on the workers,
so a shard's rows are the same users for any worker count, and a rerun of a shard replaces exactly
them.

Claims live in the run's folder `{lakehouse}/_ops/precompute/ds={ds}/{run_id}/` (a local folder or
an object store prefix, through gem.storage):
    shard-0003.lease   the claim (gem.lakehouse.lease, heartbeat = its `renewed_at` field): a worker
                       renews it per batch; one not renewed for precompute.lease_expiry_s (or whose
                       pid is gone on this host) is taken over
    shard-0003.done    made after the shard's commits (storage.create: one marker per shard, the
                       first worker to finish it): who did it, and when
A worker killed after its commits but before `.done` costs a recompute of that shard: its rerun
replaces the same rows (the commits are idempotent), so the contents are the same.
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from gem import storage
from gem.data.encode import hash_ids
from gem.lakehouse import lease

_HASH_SPACE = 1 << 63


def shard_of(user_ids: pa.Array | pa.ChunkedArray, shards: int) -> np.ndarray:
    """(n,) int32: each user's shard in 0..shards-1."""
    width = -(-_HASH_SPACE // shards)  # ceil: the last range may be shorter
    return (hash_ids(user_ids) // width).astype(np.int32)


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


@dataclass(frozen=True)
class ShardBoard:
    """The claims and completions of one run's shards (module docstring)."""

    folder: str  # the run's folder: a local path or URI
    shards: int
    expiry_s: float

    def _lease_path(self, shard: int) -> str:
        return storage.join(self.folder, f"shard-{shard:04d}.lease")

    def _done_path(self, shard: int) -> str:
        return storage.join(self.folder, f"shard-{shard:04d}.done")

    def done(self, shard: int) -> dict | None:
        """Who completed the shard, or None."""
        return _read(self._done_path(shard))

    def remaining(self) -> list[int]:
        """The shards without a `.done` marker (one listing of the run's folder)."""
        present = {storage.name(uri) for uri in storage.listdir(self.folder)}
        return [s for s in range(self.shards) if storage.name(self._done_path(s)) not in present]

    def holder(self, shard: int) -> dict | None:
        """The current claim's holder (run_id = worker name, pid, ...), or None."""
        return _read(self._lease_path(shard))

    def claims(self, worker: str, start: int = 0) -> Iterator[tuple[int, lease.Lease]]:
        """Claim undone shards one at a time, trying them from `start` round (workers start apart,
        so they rarely race for one); the caller works each before asking for the next."""
        for k in range(self.shards):
            shard = (start + k) % self.shards
            if self.done(shard) is not None:
                continue
            try:
                held = lease.acquire_path(self._lease_path(shard), worker, f"precompute shard {shard}",
                                          expiry_s=self.expiry_s, renewed=True)
            except lease.LeaseHeldError:
                continue  # a live worker has it
            if self.done(shard) is not None:  # completed between the check and the claim
                held.release()
                continue
            yield shard, held

    def mark_done(self, shard: int, worker: str, details: dict) -> bool:
        """Make the shard's `.done` marker; False when another worker's marker is there already (it
        finished the same shard after taking over a lease this worker let expire: the same rows)."""
        return storage.create(self._done_path(shard), json.dumps({"worker": worker, **details}))


def _read(uri: str) -> dict | None:
    """A marker's or lease's JSON, None when there is none (or it is no JSON: not a marker)."""
    try:
        return storage.read_json(uri)
    except (FileNotFoundError, json.JSONDecodeError):
        return None

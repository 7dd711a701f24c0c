"""The loader's worker processes fork from the training process: nothing that process left for the
garbage collector is finalized in a worker (an onnxruntime session's destructor, run in a forked
worker, waits on a condition variable of the parent's threads and hangs the run)."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from torch.utils.data import IterableDataset, get_worker_info

from gem.config import LoaderConfig
from gem.data.loader import ResumableLoader


class Finalized:
    """Appends the pid of the process that finalizes it to `path`; in a reference cycle, so only the
    garbage collector frees it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.cycle = self

    def __del__(self) -> None:
        with open(self.path, "a") as out:
            out.write(f"{os.getpid()}\n")


class CollectingStream(IterableDataset):
    """One batch per worker; each worker runs a full garbage collection before it yields."""

    cfg = LoaderConfig(num_workers=2)

    def configure(self, *_: Any) -> None:
        pass

    def __iter__(self) -> Iterator[SimpleNamespace]:
        gc.collect()
        worker = get_worker_info()
        yield SimpleNamespace(meta={"shard": worker.id, "cursor": (0, 0, 1), "worker": worker.id, "pid": os.getpid()})


def test_garbage_is_finalized_in_the_training_process_not_in_a_forked_worker(tmp_path: Path) -> None:
    finalized_by = tmp_path / "finalized_by"
    gc.disable()  # the garbage stays until the loader starts its workers
    try:
        Finalized(finalized_by)
        batches = list(ResumableLoader(CollectingStream()).epoch())
    finally:
        gc.enable()
    workers = {b.meta["pid"] for b in batches}
    assert len(workers) == 2 and os.getpid() not in workers
    assert finalized_by.read_text().split() == [str(os.getpid())]

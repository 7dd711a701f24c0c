"""A surface's examples of given days, streamed to a student with what the FM logged for them.

The student does not read the mixture manifest: that is the FM's multi-surface sample. It reads all
of its surface's examples of the chosen days (every row, importance weight 1) at the version their
validations checked, through the same loader as pretraining (gem.data.loader: files dealt to
shards, rows shuffled, sequences cut at each impression, resumable), described by a Manifest built
in memory. StudentStream adds the FM's signals to each batch (gem.distill.signals).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from gem.config import LoaderConfig
from gem.data.batch import Batch
from gem.data.delta_log import logged_files, partition_types, read_logged
from gem.data.loader import ExampleStream
from gem.data.manifest import Manifest, Source
from gem.data.sequences import Spans
from gem.distill.signals import FmSignals
from schemas.examples import LABEL_COLUMNS


def surface_manifest(examples_path: str, examples_version: int, sequences_path: str, sequences_version: int,
                     surface: str, tasks: tuple[str, ...], days: list[str], split: str, seed: int,
                     counters_start_ds: str) -> Manifest:
    """Every example of `surface` on `days` (partitions of silver.training_examples at the version
    given) as one source per task, drawn at rate 1; ValueError when the days hold none.
    counters_start_ds: the pipeline's start_ds (Manifest.counters_start_ds)."""
    files = [f for f in logged_files(examples_path, examples_version)
             if f.partition.get("ds") in days and f.partition.get("surface") == surface]
    if not files:
        raise ValueError(f"silver.training_examples v{examples_version} has no {surface} examples on {days}")
    types = partition_types(examples_path, examples_version)
    labels = read_logged(files, types, list({LABEL_COLUMNS[t.split("/")[1]] for t in tasks}))
    paths = tuple(sorted(f.path for f in files))
    rows = sum(f.rows for f in files)
    sources = tuple(Source(name=t, surface=surface, label_type=t.split("/")[1], sampling_rate=1.0, negative_rate=1.0,
                           rows=rows, positives=int(np.asarray(labels[LABEL_COLUMNS[t.split("/")[1]]]).sum()),
                           files=paths) for t in tasks)
    return Manifest(
        mixture_id=f"student:{surface}:{days[0]}..{days[-1]}:{split}", ds=days[-1], split=split, seed=seed,
        examples_path=examples_path, examples_version=examples_version, sequences_path=sequences_path,
        sequences_version=sequences_version, sources=sources,
        file_ds={f.path: f.partition["ds"] for f in files}, file_rows={f.path: f.rows for f in files},
        file_surface={f.path: surface for f in files}, counters_start_ds=counters_start_ds,
        example_files={f.path: f for f in files},
        example_partition_types=types,
    )


class StudentStream(ExampleStream):
    """An ExampleStream whose batches carry the FM's predictions and history codes (Batch.fm_*)."""

    def __init__(self, manifest: Manifest, tasks: tuple[str, ...], cfg: LoaderConfig, signals: FmSignals,
                 rank: int | None = None, world_size: int | None = None) -> None:
        super().__init__(manifest, tasks, cfg, rank, world_size)
        self.signals = signals

    def make_batch(self, table: pa.Table, mask: np.ndarray, weights: np.ndarray, meta: dict[str, Any],
                   spans: Spans) -> Batch:
        batch = super().make_batch(table, mask, weights, meta, spans)
        return self.signals.attach(batch, table["user_id"].to_pylist())

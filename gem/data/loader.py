"""Stream a mixture manifest as training batches: sampled, sharded, resumable, sequences cut late.

Semantics (each one tested in tests/spark/test_loader.py):
  * Draws. In pass k, a row of file f is drawn for source s (a task of the file's surface) iff
    u(seed, k, s, f, row) < p, with p = sampling_rate if the row's label for the task is 1, else
    sampling_rate * negative_rate (gem.data.sampling). So each source is drawn at its rate, and
    within one pass a row is drawn at most once per source. A row drawn for several tasks of its
    surface is one example whose label_mask holds those tasks.
  * Weights. An example carries, per drawn task, the importance weight 1 / p; the loss and the
    calibration metrics weight by it, so weighted rates estimate the unsampled data's rates.
  * Sharding. The files of a pass are shuffled with (seed, k) and dealt round-robin to
    world_size x num_workers shards; each file is read by exactly one shard, and a row lives in one
    file, so across ranks and workers no row is emitted twice in a pass. Rows of a file are
    shuffled with (seed, k, file). A rank's shards are served round-robin, by its DataLoader worker
    processes or (loader.in_process) in the training process in the same order.
  * Interleaving (`loader.interleave_files` = G). A shard reads its files G at a time: a group's
    drawn rows are shuffled together with (seed, k, the group's files), so a batch mixes the
    group's files. The example table is partitioned by day and surface, so with G = 1 every batch
    held one surface of one day and the model trained on surface after surface in runs of batches.
  * Length-aware batching (`loader.length_sort_batches` = K > 1). A shard fills a buffer of K
    batches' rows in stream order, orders them by sequence length and cuts them into batches of
    similar lengths, emitted in a seeded shuffled order (gem.data.length_batching): padded
    sequence blocks hold far less padding. Draws, weights and the set of examples of a pass are
    those of K = 1 (stream order, the batches cut as the rows come); only the grouping changes.
  * Determinism and resume. Everything above depends only on (seed, k, file, row), a file named by
    its partition and rank (Manifest.file_keys), not its location, so a pass is reproducible and
    the same tables draw the same rows in any lakehouse folder. Every batch carries its shard and
    the cursor (file position, row position, batches already emitted) of where it continues: the
    start of its buffer and how many of the buffer's batches are out, or, after a buffer's last
    batch, the position after the buffer.
    `ResumableLoader.state_dict()` is those cursors plus the pass and which worker is next
    (DataLoader takes workers round-robin), a few integers. Loading it re-reads the open buffer
    from its start and skips what was emitted, so it continues with exactly the batches an
    uninterrupted run would have produced next.
  * Sequences. Each example's sequences come from the user_sequences row (user_id, sequence_ds) at
    the manifest's pinned version, cut strictly before impression_time, the most recent
    `loader.max_<type>s` kept. A worker indexes a day's snapshot once (gem.data.snapshots, its ids
    already hashed, its days kept within loader.snapshot_cache_mib) and serves all that day's files
    from it, instead of reading a snapshot per example.
  * Decoded once per host. With loader.local_cache_mib > 0, an example file's columns and a day's
    sequence index are written once to the host's disk as Arrow IPC and memory-mapped by every later
    reader (gem.data.local_cache): worker processes, passes and runs share them instead of decoding
    the same Parquet files each. The batches are the same with the cache or without it.
  * Batches are built with whole-column Arrow / NumPy operations: ids are the hash columns the Spark
    stages wrote (schemas/ids.py), and the sequence cut is a vectorized binary search and a gather
    per day of the batch (gem.data.sequences); no step loops over examples in Python.

Batches hold fewer than batch_size examples only in the last buffer of a shard's pass.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch
from more_itertools import divide, roundrobin
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from gem.config import ConfigError, LoaderConfig
from gem.data.batch import Batch, Jagged, Sparse
from gem.data.delta_log import LoggedFile, MissingDataFileError, logged_files, read_logged, require_file
from gem.data.encode import (
    DENSE_COLUMNS,
    MAX_POSITION,  # noqa: F401 - importable from here too (bench.gpu_train)
    VOCABULARIES,
    dense_matrix,
    id_values,
    position_index,
    timestamps_us,
    vocab_index,
)
from gem.data.length_batching import length_sorted_batches
from gem.data.local_cache import LocalCache, default_dir
from gem.data.manifest import Manifest
from gem.data.sampling import keep_probability, row_uniforms, stable_hash
from gem.data.sequences import Spans, sequence_spans, spread
from gem.data.snapshots import MODEL_FIELDS, DaySnapshot, SnapshotCache, load_day
from schemas.examples import LABEL_COLUMNS
from schemas.ids import HASHED_IDS, hash_column
from schemas.sequences import SEQUENCE_COLUMNS

SPARSE_FEATURES: tuple[str, ...] = ("user_id", "ad_id", "advertiser_id", "campaign_id", "surface", "objective",
                                    "creative_type", "position")
# Columns read from an example file (its surface partition value is restored from the log): the
# ids as the hashes assemble_examples wrote (schemas/ids.py), the user's id too, which keys the
# sequence snapshots.
EXAMPLE_COLUMNS: list[str] = [
    "impression_id", "impression_time", "user_id", *[hash_column(c) for c in HASHED_IDS],
    "objective", "creative_type", "position", "sequence_ds", "features_ds", *LABEL_COLUMNS.values(), *DENSE_COLUMNS,
]


@dataclass(frozen=True)
class Cursor:
    file_pos: int  # index into the shard's file groups of this pass (loader.interleave_files per group)
    row_pos: int  # index into that group's drawn rows, in their shuffled order
    emitted: int = 0  # batches of the buffer that starts at (file_pos, row_pos) already emitted

    def as_tuple(self) -> tuple[int, int, int]:
        return (self.file_pos, self.row_pos, self.emitted)

    @classmethod
    def of(cls, state: tuple[int, ...] | None) -> Cursor:
        """From a saved tuple; a 2-tuple (checkpoints before length-aware batching) emitted nothing."""
        return cls(*state) if state is not None else cls(0, 0)


def _rank_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is not None and world_size is not None:
        return rank, world_size
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


class ExampleStream(IterableDataset):
    """IterableDataset of `Batch`es over one split of a manifest (module doc for the semantics).

    tasks: the model's task names, e.g. ("fb_feed/click", ..., "reels/lead"): the label columns.
    """

    def __init__(self, manifest: Manifest, tasks: tuple[str, ...], cfg: LoaderConfig,
                 rank: int | None = None, world_size: int | None = None) -> None:
        super().__init__()
        self.manifest, self.tasks, self.cfg = manifest, tuple(tasks), cfg
        self.rank, self.world_size = _rank_world(rank, world_size)
        self.num_workers = max(1, cfg.num_workers)
        self.task_index = {t: i for i, t in enumerate(self.tasks)}
        self.sources_by_surface: dict[str, list[Any]] = {}
        for s in manifest.sources:
            if s.name in self.task_index:
                self.sources_by_surface.setdefault(s.surface, []).append(s)
        # Resolved here, in the parent: deltalake's runtime does not survive the fork into DataLoader
        # workers, so workers only read Parquet files with pyarrow.
        days = set(manifest.file_ds.values())
        self.sequence_files: dict[str, list[LoggedFile]] = {d: [] for d in days}
        for f in logged_files(manifest.sequences_path, manifest.sequences_version):
            if f.partition["ds"] in days:
                self.sequence_files[f.partition["ds"]].append(f)
        self.pass_index, self.rotation = 0, 0
        self.cursors: dict[int, tuple[int, ...]] = {}
        context = f"manifest {manifest.mixture_id}"
        self.local_cache = (LocalCache(cfg.local_cache_dir or default_dir(), cfg.local_cache_mib)
                            if cfg.local_cache_mib else None)
        self.snapshots = SnapshotCache(lambda ds: load_day(self.sequence_files[ds], ds, context, self.local_cache),
                                       cfg.snapshot_cache_mib, context)

    # ---- resume plumbing (set by ResumableLoader before each iteration) ----------------------------
    def configure(self, pass_index: int, cursors: dict[int, tuple[int, ...]], rotation: int) -> None:
        self.pass_index, self.cursors, self.rotation = pass_index, dict(cursors), rotation

    # ---- which files a shard reads ----------------------------------------------------------------
    @property
    def num_shards(self) -> int:
        return self.world_size * self.num_workers

    def shard_files(self, pass_index: int, shard: int) -> list[str]:
        files = self.manifest.files
        order = np.random.default_rng([self.manifest.seed, pass_index, 0x5EED]).permutation(len(files))
        return [files[i] for i in order[shard :: self.num_shards]]

    def shard_groups(self, pass_index: int, shard: int) -> list[list[str]]:
        """The shard's files, in its file order, cut into as few groups of at most
        loader.interleave_files as they need, of sizes differing by at most one (9 files at most 8:
        5 and 4, not 8 and 1): a group's rows are read as one stream."""
        files = self.shard_files(pass_index, shard)
        return [list(g) for g in divide(-(-len(files) // self.cfg.interleave_files), files)] if files else []

    def read_file(self, path: str) -> pa.Table:
        """One example file with its surface partition value restored from the Delta log."""
        logged = self.manifest.example_files.get(path)
        if logged is None:
            raise MissingDataFileError(
                f"manifest {self.manifest.mixture_id} lists {path}, which examples version "
                f"{self.manifest.examples_version} does not hold; re-create the manifest (python -m jobs.mix)"
            )
        types, columns = self.manifest.example_partition_types, [*EXAMPLE_COLUMNS, "surface"]
        if self.local_cache is None:
            return read_logged([logged], types, columns)
        key = self.local_cache.key("training examples", logged.path, logged.bytes, logged.partition, types, columns)
        return self.local_cache.get(key, lambda: read_logged([logged], types, columns))

    # ---- draws ------------------------------------------------------------------------------------
    def draw(self, path: str, table: pa.Table, pass_index: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(rows drawn in shuffled order, mask (rows, T) bool, weights (rows, T)) for one file."""
        surface = table["surface"][0].as_py() if table.num_rows else None
        n, mask = table.num_rows, np.zeros((table.num_rows, len(self.tasks)), dtype=bool)
        weights = np.zeros((n, len(self.tasks)), dtype=np.float32)
        for source in self.sources_by_surface.get(surface, []):
            if path not in source.files:
                continue
            labels = table[LABEL_COLUMNS[source.label_type]].to_numpy(zero_copy_only=False)
            p = keep_probability(source.sampling_rate, source.negative_rate, labels)
            drawn = row_uniforms(self.manifest.seed, pass_index, source.name, self.manifest.file_keys[path], n) < p
            j = self.task_index[source.name]
            mask[:, j] = drawn
            weights[:, j] = np.where(drawn, 1.0 / p, 0.0)
        rows = np.flatnonzero(mask.any(axis=1))
        shuffle = np.random.default_rng([self.manifest.seed, pass_index,
                                         stable_hash(self.manifest.file_keys[path]) & 0x7FFFFFFF])
        return rows[shuffle.permutation(len(rows))], mask, weights

    def read_group(self, paths: list[str], pass_index: int) -> tuple[pa.Table, np.ndarray, np.ndarray, np.ndarray]:
        """(the files' rows as one table, rows drawn, mask (rows, T), weights (rows, T)) for a group of
        files. One file's drawn rows keep their order (draw); a group's are interleaved in an order
        seeded by (seed, pass, the files' keys), so a batch mixes the group's files (surfaces, days)."""
        context = f"manifest {self.manifest.mixture_id}"
        tables, drawn, masks, weights, offset = [], [], [], [], 0
        for path in paths:
            require_file(path, context)
            table = self.read_file(path)
            rows, mask, weight = self.draw(path, table, pass_index)
            tables.append(table)
            drawn.append(rows + offset)
            masks.append(mask)
            weights.append(weight)
            offset += table.num_rows
        rows = np.concatenate(drawn)
        if len(paths) > 1:
            key = stable_hash("\n".join(self.manifest.file_keys[p] for p in paths)) & 0x7FFFFFFF
            rows = rows[np.random.default_rng([self.manifest.seed, pass_index, key]).permutation(len(rows))]
        return pa.concat_tables(tables), rows, np.concatenate(masks), np.concatenate(weights)

    # ---- sequences --------------------------------------------------------------------------------
    def snapshot(self, ds: str) -> DaySnapshot:
        return self.snapshots(ds)

    def sequence_spans(self, users: pa.ChunkedArray, sequence_ds: np.ndarray, times: np.ndarray) -> Spans:
        """Per event type, where each example's events strictly before its impression time lie
        (the newest `loader.max_<type>s` kept), without copying them."""
        return sequence_spans(self.snapshot, self.cfg.max_length, users, sequence_ds, times)

    def cut_sequences(self, spans: Spans, times: np.ndarray) -> dict[str, Jagged]:
        """Per event type, the examples' events that `spans` locates, as one Jagged each."""
        return cut_sequences(self.snapshot, spans, times)

    # ---- batches ----------------------------------------------------------------------------------
    def make_batch(self, table: pa.Table, mask: np.ndarray, weights: np.ndarray, meta: dict[str, Any],
                   spans: Spans) -> Batch:
        """One batch of the table's rows; `spans`: where their sequences lie (sequence_spans)."""
        sequences = self.cut_sequences(spans, timestamps_us(table["impression_time"]))
        return example_batch(table, self.tasks, mask, weights, meta, sequences, self.manifest.counters_start_ds)

    @staticmethod
    def sequence_days(table: pa.Table) -> np.ndarray:
        """(n,) str: each row's sequence_ds, "YYYY-MM-DD"."""
        return pc.cast(table["sequence_ds"], pa.string()).to_numpy(zero_copy_only=False).astype("U10")

    def __iter__(self) -> Iterator[Batch]:
        info = get_worker_info()
        if info is not None:  # one DataLoader worker process: its own shard
            return self.worker_batches(info.id)
        # In the training process (loader.in_process, or one shard): the rank's shards round-robin,
        # an exhausted one dropping out, as DataLoader takes batches from its worker processes; so the
        # batches, their order and the resume state are the worker processes' own.
        return roundrobin(*(self.worker_batches(w) for w in range(self.num_workers)))

    def worker_batches(self, worker: int) -> Iterator[Batch]:
        """The batches worker `worker` serves: its shard of the rank, rotated by where the run resumed."""
        shard = self.rank * self.num_workers + (worker + self.rotation) % self.num_workers
        return self._iter_shard(shard, worker)

    def _iter_shard(self, shard: int, worker: int) -> Iterator[Batch]:
        groups = self.shard_groups(self.pass_index, shard)
        start = Cursor.of(self.cursors.get(shard))
        buffer_rows = self.cfg.batch_size * self.cfg.length_sort_batches
        pending: list[tuple[pa.Table, np.ndarray, np.ndarray]] = []
        pending_rows = 0
        for fp in range(start.file_pos, len(groups)):
            table, rows, mask, weights = self.read_group(groups[fp], self.pass_index)
            pos = start.row_pos if fp == start.file_pos else 0
            while pos < len(rows):
                take = rows[pos : pos + buffer_rows - pending_rows]
                pending.append((table.take(pa.array(take)), mask[take], weights[take]))
                pending_rows += len(take)
                pos += len(take)
                if pending_rows == buffer_rows:
                    yield from self._emit(pending, shard, worker, start, Cursor(fp, pos))
                    pending, pending_rows, start = [], 0, Cursor(fp, pos)
        if pending_rows:
            yield from self._emit(pending, shard, worker, start, Cursor(len(groups), 0))

    def _emit(self, pending: list[tuple[pa.Table, np.ndarray, np.ndarray]], shard: int, worker: int,
              start: Cursor, end: Cursor) -> Iterator[Batch]:
        """The batches of one buffer (rows from `start` to `end`), skipping `start.emitted` of them."""
        table = pa.concat_tables([t for t, _, _ in pending])
        mask = np.concatenate([m for _, m, _ in pending])
        weights = np.concatenate([w for _, _, w in pending])
        times = timestamps_us(table["impression_time"])
        spans = self.sequence_spans(table["user_id"], self.sequence_days(table), times)
        if self.cfg.length_sort_batches == 1:  # stream order: one batch per buffer, as cut
            groups = [np.arange(table.num_rows)]
        else:
            seed = [self.manifest.seed, self.pass_index, shard, start.file_pos, start.row_pos]
            groups = length_sorted_batches(spans.lengths(), self.cfg.batch_size, seed)
        for done, index in enumerate(groups, start=1):
            if done <= start.emitted:  # emitted before the run this resumes was stopped
                continue
            cursor = end if done == len(groups) else Cursor(start.file_pos, start.row_pos, done)
            meta = {"shard": shard, "worker": worker, "cursor": cursor.as_tuple(), "pass": self.pass_index}
            yield self.make_batch(table.take(pa.array(index)), mask[index], weights[index], meta, spans.take(index))


def cut_sequences(snapshot: Callable[[str], DaySnapshot], spans: Spans, times: np.ndarray) -> dict[str, Jagged]:
    """Per event type, the examples' events that `spans` locates, as one Jagged each (time gaps to
    `times` in seconds): one gather per field and day of the examples, no per-example Python."""
    out = {}
    days = list(spans.by_day())
    lengths_all = spans.lengths()  # (n, event types)
    for k, event_type in enumerate(SEQUENCE_COLUMNS):
        lengths = lengths_all[:, k]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)  # (n+1,)
        values = {name: np.zeros(offsets[-1], np.int64) for name in MODEL_FIELDS[event_type]}
        gap = np.zeros(offsets[-1], np.float32)
        for day, index in days:
            index = index[lengths[index] > 0]
            if not index.size:
                continue
            flat = snapshot(day).sequences[event_type]
            source = spread(spans.first[event_type][index], lengths[index])  # (m,) into the day's flat arrays
            target = spread(offsets[index], lengths[index])  # (m,) into the batch's values
            for name, arr in flat.fields.items():
                values[name][target] = arr[source]
            gap[target] = (np.repeat(times[index], lengths[index]) - flat.times[source]) / 1e6
        tensors = {name: torch.from_numpy(v) for name, v in values.items()}
        tensors["gap_s"] = torch.from_numpy(gap)
        out[event_type] = Jagged(tensors, torch.from_numpy(offsets))
    return out


def example_batch(table: pa.Table, tasks: tuple[str, ...], mask: np.ndarray, weights: np.ndarray,
                  meta: dict[str, Any], sequences: dict[str, Jagged], counters_start_ds: str) -> Batch:
    """One batch of example rows (EXAMPLE_COLUMNS and surface): ids encoded, labels per task, the
    rows' `sequences` (cut_sequences); mask and weights (n, T) as drawn; counters_start_ds: the
    first day the lake's counters count from (the pipeline's start_ds, gem.data.encode.dense_matrix)."""
    n = table.num_rows
    times = timestamps_us(table["impression_time"])
    task_index = {t: i for i, t in enumerate(tasks)}
    sparse = {}
    for name in SPARSE_FEATURES:
        if name in HASHED_IDS:
            values = id_values(table, name)
        elif name in VOCABULARIES:
            values = vocab_index(table[name], VOCABULARIES[name])
        else:  # position: 0 = none, else position + 1 (capped)
            values = position_index(table[name])
        sparse[name] = Sparse(torch.from_numpy(np.array(values, dtype=np.int64)), torch.ones(n, dtype=torch.int32))
    labels = np.zeros((n, len(tasks)), dtype=np.float32)
    task_surfaces = tuple(dict.fromkeys(t.split("/")[0] for t in tasks))
    surfaces = vocab_index(table["surface"], task_surfaces)  # (n,) index in task_surfaces + 1, 0: none
    for task, j in task_index.items():
        surface, label_type = task.split("/")
        on_surface = surfaces == task_surfaces.index(surface) + 1
        labels[:, j] = np.where(on_surface, table[LABEL_COLUMNS[label_type]].to_numpy(zero_copy_only=False), 0)
    return Batch(
        dense=torch.from_numpy(dense_matrix(table, counters_start_ds)),
        sparse=sparse,
        sequences=sequences,
        labels=torch.from_numpy(labels),
        label_mask=torch.from_numpy(mask),
        weights=torch.from_numpy(weights),
        tasks=tuple(tasks),
        impression_times=torch.from_numpy(np.array(times, dtype=np.int64)),
        example_ids=table["impression_id"].to_pylist(),
        meta=meta,
    )


class ResumableLoader:
    """Iterates an ExampleStream through a DataLoader (cfg.num_workers processes, or none with
    cfg.in_process) pass after pass, tracking the small state that makes a resumed run continue
    exactly.

    state_dict() -> {"pass": k, "cursors": {shard: (file_pos, row_pos, emitted)}, "rotation": r,
                     "interleave_files": G}  (file_pos counts groups of G files: a state inside a
                     pass resumes only under the same G)
    """

    def __init__(self, stream: ExampleStream) -> None:
        self.stream = stream
        self.state: dict[str, Any] = {"pass": 0, "cursors": {}, "rotation": 0}

    def state_dict(self) -> dict[str, Any]:
        return {"pass": self.state["pass"], "cursors": dict(self.state["cursors"]), "rotation": self.state["rotation"],
                "interleave_files": self.stream.cfg.interleave_files}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # Cursors count groups of files; states written before interleaving read files one by one.
        # A state at a pass's start (no cursors) points nowhere in it, so any interleaving continues it.
        saved = int(state.get("interleave_files", 1))
        if state["cursors"] and saved != self.stream.cfg.interleave_files:
            raise ConfigError(
                f"the loader state to resume was saved with loader.interleave_files={saved}, this run has "
                f"{self.stream.cfg.interleave_files}: its cursors count groups of {saved} files. Resume with "
                f"GEM__LOADER__INTERLEAVE_FILES={saved}, or start a new run (another run dir)")
        cursors = {int(k): tuple(v) for k, v in state["cursors"].items()}
        self.state = {"pass": int(state["pass"]), "cursors": cursors, "rotation": int(state["rotation"])}

    def resharded_state(self, states: list[dict[str, Any]]) -> dict[str, Any]:
        """The state each rank loads under another world size than the one that saved `states` (one
        per saving rank): cursors belong to the saver's world_size x num_workers shards, which another
        world size deals other files, so every rank starts the earliest pass a saving rank was in
        (that pass's rows read before the checkpoint are read again; none is skipped)."""
        return {"pass": min(int(s["pass"]) for s in states), "cursors": {}, "rotation": 0,
                "interleave_files": self.stream.cfg.interleave_files}

    def _loader(self) -> DataLoader:
        workers = 0 if self.stream.cfg.in_process else self.stream.cfg.num_workers
        if workers:
            # Garbage is collected here, before the workers fork: a worker that inherited it would run
            # its finalizers, and one that waits on a lock or condition variable of this process's
            # threads (an onnxruntime session's) never returns there, hanging the worker and the run.
            gc.collect()
        return DataLoader(self.stream, batch_size=None, num_workers=workers,
                          prefetch_factor=2 if workers else None, persistent_workers=False)

    def epoch(self) -> Iterator[Batch]:
        """The rest of the current pass; afterwards the state points at the start of the next pass."""
        self.stream.configure(self.state["pass"], self.state["cursors"], self.state["rotation"])
        workers = max(1, self.stream.cfg.num_workers)
        start_rotation = self.state["rotation"]
        for batch in self._loader():
            self.state["cursors"][batch.meta["shard"]] = batch.meta["cursor"]
            # DataLoader asks workers round-robin: the next batch comes from the following worker.
            self.state["rotation"] = (start_rotation + batch.meta["worker"] + 1) % workers
            yield batch
        self.state = {"pass": self.state["pass"] + 1, "cursors": {}, "rotation": 0}

    def batches(self, limit: int | None = None) -> Iterator[Batch]:
        """Batches across passes, forever or up to `limit`."""
        n = 0
        while True:
            for batch in self.epoch():
                yield batch
                n += 1
                if limit is not None and n >= limit:
                    return

"""A precompute worker: claims shards of a run until none is left, and commits each one.

    python -m gem.precompute.worker --ds D [--config FILE]      # join the run of D in progress
    python -m gem.precompute.worker --run-folder URI            # the same, naming the run's folder
    python -m gem.precompute.worker --run-folder -              # the folder read from stdin (jobs.precompute's helpers)

Workers are plain processes, not Spark executors: the stage is a torch stage (GPU pool, no JVM),
a process loads the model once and keeps it for all the shards it claims, and the coordination
they need is a lease per shard in the lakehouse's store, local or an object store (gem.precompute.shards). Any number
can run: the job's own process is one (jobs.precompute starts precompute.workers - 1 more), a
worker started while a run is in progress claims the shards still open, and a worker that dies
leaves its shard to whoever finds its lease expired. Under torchrun every rank is such a worker
(`torchrun --nproc-per-node N -m gem.precompute.worker --ds D`); they need no process group.

A shard's work, in a fixed order that depends only on the shard (so any worker count gives the same
rows): its users sorted by id, its impressions by impression id, cut into batches of
precompute.batch_size, each computed single-threaded on the CPU (precompute.threads_per_worker), or
on this process's GPU when it has one (LOCAL_RANK's under torchrun; there the rows are equal across
worker counts as far as the GPU's kernels are deterministic).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TextIO

import numpy as np
import pyarrow as pa
import torch
from deltalake.exceptions import CommitFailedError

from gem.config import add_config_arg, load_config
from gem.data.encode import DENSE_COLUMNS, hash_ids, timestamps_us
from gem.data.loader import cut_sequences, example_batch, sequence_spans
from gem.days import iso_day, shift_day
from gem.lakehouse.commit import StageCommit
from gem.precompute import speculative
from gem.precompute.inputs import AD_ATTRIBUTES, DayInputs
from gem.precompute.model import PrecomputeModel, user_batch
from gem.precompute.plan import STAGE, DayPlan, current_run_folder
from gem.precompute.shards import ShardBoard, worker_name
from schemas.examples import LABEL_COLUMNS
from schemas.precompute import (
    GOLD_FM_HISTORY_CODES,
    GOLD_FM_PREDICTIONS,
    GOLD_FM_SPECULATIVE_PAIRS,
    GOLD_FM_USER_EMBEDDINGS,
)
from schemas.table import TableSchema


class LeaseLost(RuntimeError):
    """Another worker took this shard over (its lease expired while this one was still at work)."""


def _list_column(rows: np.ndarray) -> pa.Array:
    """(n, k) float32 -> a list<float> column of n rows."""
    n, k = rows.shape
    return pa.ListArray.from_arrays(pa.array(np.arange(n + 1, dtype=np.int32) * k),
                                    pa.array(rows.reshape(-1), pa.float32()))


def _map_column(values: list[dict], value_type: pa.DataType) -> pa.Array:
    return pa.array([list(v.items()) for v in values], pa.map_(pa.string(), value_type))


def _predictions(probs: np.ndarray, tasks: tuple[str, ...]) -> list[dict[str, float]]:
    return [dict(zip(tasks, map(float, row), strict=True)) for row in probs]


@dataclass
class ShardWork:
    """Computes one shard's rows of the four tables with a worker's model and inputs."""

    plan: DayPlan
    inputs: DayInputs
    model: PrecomputeModel

    def __post_init__(self) -> None:
        cfg = self.plan.cfg
        self.loader_cfg = cfg.loader.capped(cfg.model.sequence_lengths())
        self.batch_size = cfg.precompute.batch_size
        self.recent_ads = cfg.precompute.recent_ads
        # Precomputed rows serve tomorrow: sequences cut at, and time gaps counted to, ds+1 00:00 UTC.
        tomorrow = dt.datetime.fromisoformat(shift_day(self.plan.ds, 1)).replace(tzinfo=dt.UTC)
        self.request_time = tomorrow
        self.request_us = int(tomorrow.timestamp() * 1_000_000)

    def _stamp(self, table: dict[str, pa.Array | list], n: int, shard: int, schema: TableSchema) -> pa.Table:
        computed_at = dt.datetime.now(dt.UTC)
        table = {"shard": pa.array(np.full(n, shard, np.int32)), **table,
                 "model_version": [self.model.version] * n,
                 "input_versions": _map_column([self.plan.input_versions] * n, pa.int64()),
                 "computed_at": pa.array([computed_at] * n, pa.timestamp("us", tz="UTC"))}
        return pa.table(table).select(schema.column_names).cast(schema.arrow_schema())

    def embeddings(self, shard: int, renew: Callable[[], None]) -> pa.Table:
        """The shard's users to recompute -> gold.fm_user_embeddings rows."""
        users, days = self.inputs.users(shard)
        snapshot = self.inputs.snapshot_reader(users)
        rows = []
        for lo in range(0, len(users), self.batch_size):
            renew()
            batch_users, batch_days = users[lo : lo + self.batch_size], days[lo : lo + self.batch_size]
            times = np.full(len(batch_users), self.request_us, dtype=np.int64)
            spans = sequence_spans(snapshot, self.loader_cfg, batch_users, batch_days, times)
            hashed = torch.from_numpy(hash_ids(pa.array(batch_users, pa.string())))
            batch = user_batch(hashed, cut_sequences(snapshot, spans, times), self.model.tasks)
            rows.append(self.model.user_embeddings(batch).numpy())  # (B, tokens, d)
        tokens = rows[0].shape[1] if rows else 1
        flat = np.concatenate([r.reshape(r.shape[0], -1) for r in rows]) if rows else np.zeros((0, 0), np.float32)
        n = len(users)
        return self._stamp({
            "ds": pa.array([dt.date.fromisoformat(self.plan.ds)] * n, pa.date32()),
            "user_id": pa.array(users, pa.string()), "embedding": _list_column(flat),
            "tokens": pa.array(np.full(n, tokens, np.int32)),
            "sequence_ds": pa.array([dt.date.fromisoformat(d) for d in days], pa.date32()),
        }, n, shard, GOLD_FM_USER_EMBEDDINGS)

    def _scored(self, examples: pa.Table, renew: Callable[[], None]) -> tuple[np.ndarray, np.ndarray]:
        """Example rows (EXAMPLE_COLUMNS, surface) -> ((n, T) probabilities, (n, out_dim) representations)."""
        snapshot = self.inputs.snapshot_reader(set(examples["user_id"].to_pylist()))
        tasks, probs, reps = self.model.tasks, [], []
        for lo in range(0, examples.num_rows, self.batch_size):
            renew()
            part = examples.slice(lo, self.batch_size)
            times = timestamps_us(part["impression_time"])
            days = [d.isoformat() for d in part["sequence_ds"].to_pylist()]
            spans = sequence_spans(snapshot, self.loader_cfg, part["user_id"].to_pylist(), days, times)
            ones = np.ones((part.num_rows, len(tasks)), dtype=bool)
            batch = example_batch(part, tasks, ones, ones.astype(np.float32), {}, cut_sequences(snapshot, spans, times),
                                  self.plan.cfg.start_ds)
            p, r = self.model.predict(batch)
            probs.append(p.numpy())
            reps.append(r.numpy())
        if not probs:  # no rows
            return np.zeros((0, len(tasks)), np.float32), np.zeros((0, self.model.task.body.out_dim), np.float32)
        return np.concatenate(probs), np.concatenate(reps)

    def predictions(self, shard: int, renew: Callable[[], None]) -> list[tuple[TableSchema, pa.Table]]:
        """The shard's impressions of the held-out day -> gold.fm_predictions rows and, from the same
        representations, gold.fm_history_codes rows (none when the model has no history autoencoder)."""
        examples = self.inputs.examples(shard)
        probs, reps = self._scored(examples, renew)
        n = examples.num_rows
        day = pa.array([dt.date.fromisoformat(self.plan.examples_ds)] * n if n else [], pa.date32())
        predictions = self._stamp({
            "ds": day, **{c: examples[c] for c in ("impression_id", "user_id", "ad_id", "surface")},
            "predictions": _map_column(_predictions(probs, self.model.tasks), pa.float64()),
            "representation": _list_column(reps),
        }, n, shard, GOLD_FM_PREDICTIONS)
        packed = self.model.history_codes(torch.from_numpy(reps))
        coded = n if packed is not None else 0
        codes = self._stamp({
            "ds": day.slice(0, coded), "user_id": examples["user_id"].slice(0, coded),
            "impression_id": examples["impression_id"].slice(0, coded),
            "event_time": examples["impression_time"].slice(0, coded),
            "codes": pa.array([] if packed is None else [row.tobytes() for row in packed.numpy()], pa.binary()),
        }, coded, shard, GOLD_FM_HISTORY_CODES)
        return [(GOLD_FM_PREDICTIONS, predictions), (GOLD_FM_HISTORY_CODES, codes)]

    def speculative_pairs(self, shard: int, renew: Callable[[], None]) -> pa.Table:
        """The policy's pairs for the shard's users active on ds -> gold.fm_speculative_pairs rows."""
        users, _ = self.inputs.users(shard)
        active = self.inputs.active_impressions(users).sort_by("user_id")
        pairs = speculative.choose_pairs(active, self.plan.popular_ads, self.recent_ads)
        n = len(pairs)
        counters = self.inputs.counters([p.user_id for p in pairs], [p.ad_id for p in pairs])
        features_day = dt.date.fromisoformat(self.plan.ds)  # the counters of ds: ds+1's are built tomorrow
        requests = {
            "impression_id": pa.array([f"speculative:{p.user_id}:{p.ad_id}" for p in pairs], pa.string()),
            "impression_time": pa.array([self.request_time] * n, pa.timestamp("us", tz="UTC")),
            "user_id": counters["user_id"], "ad_id": counters["ad_id"],
            **{a: counters[a] for a in AD_ATTRIBUTES},
            "position": pa.array([None] * n, pa.float64()),
            "sequence_ds": pa.array([dt.date.fromisoformat(self.plan.ds)] * n, pa.date32()),
            "features_ds": pa.array([features_day] * n, pa.date32()),
            **{c: pa.array(np.zeros(n, np.int32)) for c in LABEL_COLUMNS.values()},
            **{c: counters[c] for c in DENSE_COLUMNS},
            "surface": pa.array([p.surface for p in pairs], pa.string()),
        }
        probs, _ = self._scored(pa.table(requests), renew)
        return self._stamp({
            "ds": pa.array([dt.date.fromisoformat(self.plan.ds)] * n, pa.date32()),
            "user_id": requests["user_id"], "ad_id": requests["ad_id"], "surface": requests["surface"],
            "reason": pa.array([p.reason for p in pairs], pa.string()),
            "sequence_ds": requests["sequence_ds"], "features_ds": requests["features_ds"],
            "predictions": _map_column(_predictions(probs, self.model.tasks), pa.float64()),
        }, n, shard, GOLD_FM_SPECULATIVE_PAIRS)


def commit_part(commit: StageCommit, rows: pa.Table, schema: TableSchema, shard: int, attempts: int = 8) -> int:
    """Replace the shard's rows of `schema` in one commit carrying the run's transaction id; retried
    when another worker's commit of the same table won the race for the version."""
    for attempt in range(attempts):
        try:
            return commit.replace_arrow(rows, schema, also={"shard": shard}, part=str(shard))
        except CommitFailedError:
            if attempt == attempts - 1:
                raise
            time.sleep(0.05 * (attempt + 1))
    raise AssertionError("unreachable")


def do_shard(shard_work: ShardWork, commit: StageCommit, shard: int, renew: Callable[[], None]
             ) -> tuple[dict[str, int], dict[str, float]]:
    """Compute one shard's rows of the four tables, then commit them; -> (rows per table, seconds
    per phase). `renew` is called between batches (LeaseLost aborts before anything is committed)."""
    seconds: dict[str, float] = {}
    outputs: list[tuple[TableSchema, pa.Table]] = []
    for phase, compute in (("embeddings", lambda: [(GOLD_FM_USER_EMBEDDINGS, shard_work.embeddings(shard, renew))]),
                           ("predictions", lambda: shard_work.predictions(shard, renew)),
                           ("speculative_pairs",
                            lambda: [(GOLD_FM_SPECULATIVE_PAIRS, shard_work.speculative_pairs(shard, renew))])):
        t = time.perf_counter()
        outputs.extend(compute())
        seconds[phase] = time.perf_counter() - t
    renew()
    t = time.perf_counter()
    for schema, rows in outputs:
        commit_part(commit, rows, schema, shard)
    seconds["commits"] = time.perf_counter() - t
    return {schema.name: rows.num_rows for schema, rows in outputs}, seconds


@dataclass
class WorkerReport:
    worker: str
    shards: list[int]
    users: int
    seconds: float


def work(folder: str, index: int = 0, poll_s: float | None = None) -> WorkerReport:
    """Claim and do shards of the run in `folder` (its URI) until every shard is done; shards held by live
    workers are waited for (polled every poll_s, default a quarter of the lease expiry, at most 1 s),
    so a dead worker's shard is taken over once its lease expires."""
    t0 = time.time()
    plan = DayPlan.load(folder)
    cfg = plan.cfg
    board = ShardBoard(folder, plan.shards, cfg.precompute.lease_expiry_s)
    poll_s = poll_s if poll_s is not None else min(1.0, cfg.precompute.lease_expiry_s / 4)
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.precompute.threads_per_worker)
    try:
        shard_work = ShardWork(plan, DayInputs(plan), PrecomputeModel.load(cfg, plan.model))
        commit = StageCommit.join(cfg, STAGE, plan.ds, plan.run_id)
        name, done, users = worker_name(), [], 0
        start = int(index * 0.618034 * plan.shards) % plan.shards  # workers start spread over the shards
        while board.remaining():
            for shard, held in board.claims(name, start):
                def renew(held=held, shard=shard) -> None:
                    if not held.renew():
                        raise LeaseLost(f"precompute ds={plan.ds} shard {shard}: another worker took it over")

                claimed_at = time.time()
                try:
                    rows, seconds = do_shard(shard_work, commit, shard, renew)
                except LeaseLost as e:
                    print(f"[{name}] {e}; leaving it")
                    continue
                if not board.mark_done(shard, name, {"rows": rows, "seconds": seconds, "claimed_at": claimed_at,
                                                     "done_at": time.time()}):
                    print(f"[{name}] precompute ds={plan.ds} shard {shard}: another worker finished it too")
                held.release()
                done.append(shard)
                users += rows[GOLD_FM_USER_EMBEDDINGS.name]
            if board.remaining():
                time.sleep(poll_s)
    finally:
        torch.set_num_threads(threads)
    return WorkerReport(worker_name(), done, users, time.time() - t0)


def folder_from(stream: TextIO) -> str | None:
    """The run's folder URI, a line on `stream` (None when it closes empty: there is no run to join).
    What a shard needs (the checkpoint reader, deltalake) comes with this module's imports, so a
    helper started before the day is planned has loaded it by the time the folder arrives."""
    line = stream.readline().strip()
    return line or None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_config_arg(parser)
    parser.add_argument("--ds", type=iso_day, default=None, help="join the run of this day in progress")
    parser.add_argument("--run-folder", default=None, help="the run's folder URI (instead of --ds); - reads it from stdin")
    parser.add_argument("--index", type=int, default=int(os.environ.get("RANK", "0")),
                        help="spreads workers' first claims (default: the torchrun rank, else 0)")
    args = parser.parse_args(argv)
    if (args.ds is None) == (args.run_folder is None):
        parser.error("give exactly one of --ds and --run-folder")
    if args.run_folder == "-":
        folder = folder_from(sys.stdin)
        if folder is None:
            print(f"[{worker_name()}] no run to join (stdin closed empty)")
            return 0
    elif args.run_folder:
        folder = args.run_folder
    else:
        folder = current_run_folder(load_config(args.config), args.ds)
    report = work(folder, args.index)
    print(f"[{report.worker}] shards {report.shards}: {report.users} users in {report.seconds:.1f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

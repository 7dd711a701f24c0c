"""One shard's rows of the four precompute tables, computed and committed by the Spark task that
runs the shard (gem.precompute.executors).

A shard's work, in a fixed order that depends only on the shard (so any executor count, retry or
speculative copy gives the same rows): its users sorted by id, its impressions by impression id,
cut into batches of precompute.batch_size, each computed on the task's device with
precompute.threads_per_task CPU threads (reductions are ordered the same way for any count).
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch
from deltalake.exceptions import CommitFailedError

from gem import faults
from gem.data.encode import DENSE_COLUMNS, hash_ids, timestamps_us
from gem.data.loader import cut_sequences, example_batch
from gem.data.sequences import sequence_spans
from gem.days import shift_day
from gem.lakehouse.commit import StageCommit
from gem.precompute import speculative
from gem.precompute.inputs import AD_ATTRIBUTES, DayInputs
from gem.precompute.model import PrecomputeModel, user_batch
from gem.precompute.plan import DayPlan
from schemas.examples import LABEL_COLUMNS
from schemas.precompute import (
    GOLD_FM_HISTORY_CODES,
    GOLD_FM_PREDICTIONS,
    GOLD_FM_SPECULATIVE_PAIRS,
    GOLD_FM_USER_EMBEDDINGS,
)
from schemas.table import TableSchema


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
    """Computes one shard's rows of the four tables with an executor's model and inputs."""

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

    def embeddings(self, shard: int) -> pa.Table:
        """The shard's users to recompute -> gold.fm_user_embeddings rows."""
        users, days = self.inputs.users(shard)
        snapshot = self.inputs.snapshot_reader(users)
        rows = []
        for lo in range(0, len(users), self.batch_size):
            batch_users, batch_days = users[lo : lo + self.batch_size], days[lo : lo + self.batch_size]
            times = np.full(len(batch_users), self.request_us, dtype=np.int64)
            spans = sequence_spans(snapshot, self.loader_cfg.max_length, batch_users, batch_days, times)
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

    def _scored(self, examples: pa.Table) -> tuple[np.ndarray, np.ndarray]:
        """Example rows (EXAMPLE_COLUMNS, surface) -> ((n, T) probabilities, (n, out_dim) representations)."""
        snapshot = self.inputs.snapshot_reader(set(examples["user_id"].to_pylist()))
        tasks, probs, reps = self.model.tasks, [], []
        for lo in range(0, examples.num_rows, self.batch_size):
            part = examples.slice(lo, self.batch_size)
            times = timestamps_us(part["impression_time"])
            days = [d.isoformat() for d in part["sequence_ds"].to_pylist()]
            spans = sequence_spans(snapshot, self.loader_cfg.max_length, part["user_id"].to_pylist(), days, times)
            ones = np.ones((part.num_rows, len(tasks)), dtype=bool)
            batch = example_batch(part, tasks, ones, ones.astype(np.float32), {}, cut_sequences(snapshot, spans, times),
                                  self.plan.cfg.start_ds)
            p, r = self.model.predict(batch)
            probs.append(p.numpy())
            reps.append(r.numpy())
        if not probs:  # no rows
            return np.zeros((0, len(tasks)), np.float32), np.zeros((0, self.model.task.body.out_dim), np.float32)
        return np.concatenate(probs), np.concatenate(reps)

    def predictions(self, shard: int) -> list[tuple[TableSchema, pa.Table]]:
        """The shard's impressions of the held-out day -> gold.fm_predictions rows and, from the same
        representations, gold.fm_history_codes rows (none when the model has no history autoencoder)."""
        examples = self.inputs.examples(shard)
        probs, reps = self._scored(examples)
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

    def speculative_pairs(self, shard: int) -> pa.Table:
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
        probs, _ = self._scored(pa.table(requests))
        return self._stamp({
            "ds": pa.array([dt.date.fromisoformat(self.plan.ds)] * n, pa.date32()),
            "user_id": requests["user_id"], "ad_id": requests["ad_id"], "surface": requests["surface"],
            "reason": pa.array([p.reason for p in pairs], pa.string()),
            "sequence_ds": requests["sequence_ds"], "features_ds": requests["features_ds"],
            "predictions": _map_column(_predictions(probs, self.model.tasks), pa.float64()),
        }, n, shard, GOLD_FM_SPECULATIVE_PAIRS)


def commit_part(commit: StageCommit, rows: pa.Table, schema: TableSchema, shard: int, attempts: int = 8) -> int:
    """Replace the shard's rows of `schema` in one commit carrying the run's transaction id; retried
    when another task's commit of the same table won the race for the version."""
    for attempt in range(attempts):
        try:
            return commit.replace_arrow(rows, schema, also={"shard": shard}, part=str(shard))
        except CommitFailedError:
            if attempt == attempts - 1:
                raise
            time.sleep(0.05 * (attempt + 1))
    raise AssertionError("unreachable")


def do_shard(shard_work: ShardWork, commit: StageCommit, shard: int, crash_prefix: str = ""
             ) -> tuple[dict[str, int], dict[str, float]]:
    """Compute one shard's rows of the four tables, then commit them table by table; -> (rows per
    table, seconds per phase). A task killed before or between the commits leaves the shard's
    previous or partly replaced rows, which no record names; its rerun (Spark's retry, a
    speculative copy) replaces all four with the same rows. crash_prefix: names the crash points
    after each table's commit (`{crash_prefix}:committed={table}`, gem.faults)."""
    seconds: dict[str, float] = {}
    outputs: list[tuple[TableSchema, pa.Table]] = []
    for phase, compute in (("embeddings", lambda: [(GOLD_FM_USER_EMBEDDINGS, shard_work.embeddings(shard))]),
                           ("predictions", lambda: shard_work.predictions(shard)),
                           ("speculative_pairs", lambda: [(GOLD_FM_SPECULATIVE_PAIRS, shard_work.speculative_pairs(shard))])):
        t = time.perf_counter()
        outputs.extend(compute())
        seconds[phase] = time.perf_counter() - t
    t = time.perf_counter()
    for schema, rows in outputs:
        commit_part(commit, rows, schema, shard)
        faults.crash_point(f"{crash_prefix}:committed={schema.name}")
    seconds["commits"] = time.perf_counter() - t
    return {schema.name: rows.num_rows for schema, rows in outputs}, seconds

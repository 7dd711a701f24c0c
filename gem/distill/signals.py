"""The foundation model's logged outputs, as a student's batch carries them (no Spark: Delta log + pyarrow).

    logged = LoggedOutputs.read(cfg, prediction_days, code_days, versions)   read once per run
    signals = logged.for_tasks(tasks, max_codes)                            one surface's view
    signals.attach(batch, users)                                            Batch with fm_* fields set

Predictions: per impression id, the FM's probability for each of the student's tasks
(gold.fm_predictions maps task -> probability); fm_prediction_mask is False for an example the FM
did not score. History codes: per user, the coded events of gold.fm_history_codes in time order;
attach gives each example only its user's codes logged strictly before its impression (at most
`max_codes`, the newest), so neither the example's own code nor a later one can reach the student
(gem.model.history_code_feature filters by time again and applies the age limit).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from gem.data.batch import Batch, Jagged
from gem.data.delta_log import read_table
from gem.data.encode import timestamps_us
from gem.data.sequences import newest_before_each, runs_by_key
from gem.lakehouse import tables
from schemas.precompute import GOLD_FM_HISTORY_CODES, GOLD_FM_PREDICTIONS

if TYPE_CHECKING:
    from gem.config import GemConfig


@dataclass
class LoggedOutputs:
    """The FM's logged predictions of some days (a table) and the history codes of others, indexed by
    user (code_times (N,) int64 us and codes (N, K/2) uint8, sorted by (user, time); users: user ->
    (start, end)): read once, shared by every surface's and every arm's signals."""

    predictions: pa.Table  # impression_id, surface, predictions (task -> probability)
    users: dict[str, tuple[int, int]]
    code_times: np.ndarray
    codes: np.ndarray

    @classmethod
    def read(cls, cfg: GemConfig, prediction_days: list[str], code_days: list[str], predictions_version: int,
             codes_version: int | None, code_bytes: int) -> LoggedOutputs:
        """The predictions of `prediction_days` and, when codes_version is given, the history codes of
        `code_days`, at the versions the precompute records name; code_bytes: packed bytes per code
        (model.history_codes.code_dim / 2)."""
        logged = read_table(tables.table_path(cfg, GOLD_FM_PREDICTIONS), predictions_version,
                            columns=["ds", "impression_id", "surface", "predictions"])
        logged = logged.filter(pc.is_in(pc.cast(logged["ds"], pa.string()), pa.array(prediction_days)))
        users: dict[str, tuple[int, int]] = {}
        times, codes = np.zeros(0, np.int64), np.zeros((0, code_bytes), np.uint8)
        if codes_version is not None and code_days:
            coded = read_table(tables.table_path(cfg, GOLD_FM_HISTORY_CODES), codes_version,
                               columns=["ds", "user_id", "event_time", "codes"])
            coded = coded.filter(pc.is_in(pc.cast(coded["ds"], pa.string()), pa.array(code_days)))
            coded = coded.sort_by([("user_id", "ascending"), ("event_time", "ascending")])
            user_ids = coded["user_id"].to_numpy(zero_copy_only=False)
            times = timestamps_us(coded["event_time"])
            packed = coded["codes"].to_pylist()  # bytes of code_dim / 2 each
            if packed:
                codes = np.frombuffer(b"".join(packed), np.uint8).reshape(len(packed), len(packed[0]))
            users = runs_by_key(user_ids)
        return cls(logged, users, times, codes)

    def for_tasks(self, tasks: tuple[str, ...], max_codes: int) -> FmSignals:
        """The signals of one surface's `tasks`: its impressions' predictions per task, and the codes."""
        surface = tasks[0].split("/")[0]
        logged = self.predictions.filter(pc.equal(self.predictions["surface"], surface))
        ids = logged["impression_id"].to_pylist()
        preds = np.zeros((len(ids), len(tasks)), np.float32)
        mask = np.zeros((len(ids), len(tasks)), bool)
        for j, task in enumerate(tasks):
            column = pc.map_lookup(logged["predictions"], pa.scalar(task), "first")  # null where not predicted
            mask[:, j] = column.is_valid().to_numpy(zero_copy_only=False)
            preds[:, j] = column.fill_null(0.0).to_numpy(zero_copy_only=False)
        return FmSignals(tuple(tasks), {i: k for k, i in enumerate(ids)}, preds, mask, self.users, self.code_times,
                         self.codes, max_codes)


@dataclass
class FmSignals:
    """What the FM logged for the examples of a run, indexed for attaching to batches.

    predictions (n, T) float32 and mask (n, T) bool by row of `rows` (impression id -> row);
    code_times (N,) int64 us and codes (N, K/2) uint8, sorted by (user, time); users: user -> (start, end).
    """

    tasks: tuple[str, ...]
    rows: dict[str, int]
    predictions: np.ndarray
    mask: np.ndarray
    users: dict[str, tuple[int, int]]
    code_times: np.ndarray
    codes: np.ndarray
    max_codes: int

    def attach(self, batch: Batch, users: list[str]) -> Batch:
        """`batch` (its example_ids and impression_times) with fm_predictions, fm_prediction_mask and
        fm_history_codes set; `users`: the examples' user ids."""
        if batch.tasks != self.tasks:
            raise ValueError(f"signals for tasks {self.tasks}, batch of {batch.tasks}")
        b = len(users)
        found = np.array([self.rows.get(i, -1) for i in batch.example_ids], dtype=np.int64)
        preds = np.zeros((b, len(self.tasks)), np.float32)  # (B, T)
        mask = np.zeros((b, len(self.tasks)), bool)  # (B, T): False for an example the FM did not score
        hit = found >= 0
        preds[hit], mask[hit] = self.predictions[found[hit]], self.mask[found[hit]]
        # Strictly before each impression, the newest max_codes of the user's codes.
        runs = [self.users.get(user, (0, 0)) for user in users]
        index, lengths = newest_before_each(self.code_times, runs, batch.impression_times.numpy(), self.max_codes)
        history = Jagged({"codes": torch.from_numpy(self.codes[index].copy()),
                          "time_us": torch.from_numpy(self.code_times[index].copy())},
                         torch.from_numpy(np.r_[0, np.cumsum(lengths)].astype(np.int64)))
        return replace(batch, fm_predictions=torch.from_numpy(preds), fm_prediction_mask=torch.from_numpy(mask),
                       fm_history_codes=history)

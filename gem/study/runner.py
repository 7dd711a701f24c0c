"""Train one (config, learning rate, seed) on the training days and score it on a day.

Training: Adam over `epochs` passes of the training batches (the masked, importance-weighted loss of
gem.model.task), task heads started at their weighted base rates; on CUDA under bf16 autocast.
Scoring: per (example, task) pair the prediction, label and importance weight -> NE per task, NE
pooled over all pairs, over the click pairs and over the conversion pairs (gem.model.metrics), and
calibration per surface (sum of weighted predictions / sum of weighted labels).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from gem.data.batch import Batch
from gem.model import metrics
from gem.model.build import build_task
from gem.model.configs import ModelConfig
from gem.model.heads import shrunk_base_rates
from gem.model.task import GemTrainTask
from gem.study.traffic import DENSE_DIM, SPARSE


@dataclass
class Scores:
    """Predictions of one model on one day, flattened to the (example, task) pairs drawn."""

    pred: torch.Tensor  # (P,) float64 probability
    label: torch.Tensor  # (P,) float64
    weight: torch.Tensor  # (P,) float64 importance weight
    task: torch.Tensor  # (P,) int64 index into `tasks`
    tasks: tuple[str, ...]

    def select(self, names: tuple[str, ...]) -> torch.Tensor:
        """(P,) bool: the pairs of the tasks in `names`."""
        wanted = torch.tensor([t in names for t in self.tasks], dtype=torch.bool)
        return wanted[self.task]

    def ne(self, names: tuple[str, ...]) -> float | None:
        """NE of the pairs of `names` pooled (None without a positive)."""
        m = self.select(names)
        if not bool((self.label[m] > 0).any()):
            return None
        return float(metrics.ne(self.pred[m], self.label[m], self.weight[m]))

    def calibration(self, names: tuple[str, ...]) -> float | None:
        m = self.select(names)
        if not bool((self.label[m] > 0).any()):
            return None
        return float(metrics.calibration(self.pred[m], self.label[m], self.weight[m]))

    def positives(self, name: str) -> int:
        return int(self.label[self.select((name,))].sum())


@dataclass
class RunResult:
    seconds: float  # training wall time
    examples: int  # training examples seen (all epochs)
    scores: dict[str, Scores]  # eval set name -> scores


def base_rates(batches: list[Batch]) -> dict[str, float]:
    """Per task, the importance-weighted positive rate of the training examples, shrunk toward its
    label type's pooled rate (gem.model.heads.shrunk_base_rates)."""
    labels = torch.cat([b.labels * b.weights for b in batches]).sum(0)
    weights = torch.cat([b.weights * b.label_mask for b in batches]).sum(0)
    return shrunk_base_rates(dict(zip(batches[0].tasks, zip(labels.tolist(), weights.tolist(), strict=True),
                                      strict=True)))


def train(cfg: ModelConfig, train_batches: list[Batch], lr: float, seed: int, epochs: int,
          device: torch.device, bf16: bool) -> tuple[GemTrainTask, float, int]:
    """-> (trained task, seconds, examples seen). Batches are visited in the same order for every
    seed (the data order is part of the traffic); the seed sets the initialization."""
    torch.manual_seed(seed)
    task = build_task(cfg, train_batches[0].tasks, SPARSE, DENSE_DIM).to(device)
    task.heads.init_from_base_rates(base_rates(train_batches))
    on_gpu = device.type == "cuda"
    opt = torch.optim.Adam(task.parameters(), lr=lr, fused=on_gpu)  # fused: one kernel per step on a GPU
    autocast = on_gpu and bf16
    task.train()
    start, seen = time.perf_counter(), 0
    # The batches move once, not once per step and epoch (on a GPU a copy of each tensor each step).
    batches = [b.to(device) for b in train_batches]
    for _ in range(epochs):
        for batch in batches:
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
                loss, _ = task(batch)
            loss.backward()
            opt.step()
            seen += batch.size
    if device.type == "cuda":
        torch.cuda.synchronize()
    return task, time.perf_counter() - start, seen


@torch.no_grad()
def score(task: GemTrainTask, batches: list[Batch], device: torch.device, bf16: bool) -> Scores:
    task.eval()
    autocast = device.type == "cuda" and bf16
    preds, labels, weights, cols = [], [], [], []
    for batch in batches:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=autocast):
            p = torch.sigmoid(task.logits(batch.to(device)).float()).cpu().double()
        rows, col = batch.label_mask.nonzero(as_tuple=True)
        preds.append(p[rows, col])
        labels.append(batch.labels[rows, col].double())
        weights.append(batch.weights[rows, col].double())
        cols.append(col)
    return Scores(torch.cat(preds), torch.cat(labels), torch.cat(weights), torch.cat(cols), batches[0].tasks)


def run(cfg: ModelConfig, train_batches: list[Batch], evals: dict[str, list[Batch]], lr: float, seed: int,
        epochs: int, device: torch.device, bf16: bool) -> RunResult:
    """Train one (config, lr, seed) and score it on each eval set (their tasks: those of train_batches)."""
    task, seconds, seen = train(cfg, train_batches, lr, seed, epochs, device, bf16)
    return RunResult(seconds, seen, {name: score(task, b, device, bf16) for name, b in evals.items()})

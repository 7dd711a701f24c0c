"""Train one (config, learning rate, seed) on the training days and score it on a day.

Training is the pipeline's: gem.train.trainer.Trainer over the training batches cycled in order
(CyclingStream), `epochs` passes, with a TrainConfig of the run's lr, seed and bf16 (a constant lr,
no weight decay: Trainer's AdamW is then Adam), on the study's device and without checkpoints; the
task heads start at their shrunk weighted base rates. On CUDA, Trainer's bf16 autocast.
Scoring is the pipeline's too: gem.train.evaluate.predictions gives every (example, task) pair's
prediction, label and importance weight; on top of them `Scores` pools NE over groups of tasks (all
pairs, the click pairs, the conversion pairs) and calibration per surface (gem.model.metrics).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from gem.config import TrainConfig
from gem.data.batch import Batch
from gem.model import metrics
from gem.model.build import build_task
from gem.model.configs import ModelConfig
from gem.model.heads import shrunk_base_rates
from gem.study.traffic import DENSE_DIM, SPARSE
from gem.train.evaluate import Predictions, predictions
from gem.train.trainer import CyclingStream, Trainer


@dataclass
class Scores:
    """Predictions of one model on one day (gem.train.evaluate.Predictions), scored over groups of tasks."""

    p: Predictions

    @property
    def tasks(self) -> tuple[str, ...]:
        return self.p.tasks

    def _pairs(self, names: tuple[str, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """(pred, label, weight) of the pairs of `names`; None without a positive among them."""
        m = self.p.select(names)
        if not bool((self.p.label[m] > 0).any()):
            return None
        return self.p.pred[m], self.p.label[m], self.p.weight[m]

    def ne(self, names: tuple[str, ...]) -> float | None:
        """NE of the pairs of `names` pooled (None without a positive)."""
        pairs = self._pairs(names)
        return None if pairs is None else float(metrics.ne(*pairs))

    def calibration(self, names: tuple[str, ...]) -> float | None:
        """Weighted calibration of the pairs of `names` pooled (None without a positive)."""
        pairs = self._pairs(names)
        return None if pairs is None else float(metrics.calibration(*pairs))

    def positives(self, name: str) -> int:
        return int(self.p.label[self.p.select((name,))].sum())


@dataclass
class RunResult:
    seconds: float  # training wall time (Trainer's)
    examples: int  # training examples seen (all epochs)
    steps: int  # optimizer steps (epochs x training batches)
    scores: dict[str, Scores]  # eval set name -> scores


def base_rates(batches: list[Batch]) -> dict[str, float]:
    """Per task, the importance-weighted positive rate of the training examples, shrunk toward its
    label type's pooled rate (gem.model.heads.shrunk_base_rates)."""
    labels = torch.cat([b.labels * b.weights for b in batches]).sum(0)
    weights = torch.cat([b.weights * b.label_mask for b in batches]).sum(0)
    return shrunk_base_rates(dict(zip(batches[0].tasks, zip(labels.tolist(), weights.tolist(), strict=True),
                                      strict=True)))


def train_config(lr: float, seed: int, steps: int, bf16: bool) -> TrainConfig:
    """The study's training settings as a TrainConfig: constant lr, no warmup, no weight decay, bf16
    autocast on CUDA only (never on the CPU); checkpoint_every is moot (the study writes none)."""
    return TrainConfig(steps=steps, lr=lr, seed=seed, bf16=bf16, cpu_bf16=False, checkpoint_every=steps)


def run(cfg: ModelConfig, train_batches: list[Batch], evals: dict[str, list[Batch]], lr: float, seed: int,
        epochs: int, device: torch.device, bf16: bool) -> RunResult:
    """Train one (config, lr, seed) through Trainer and score it on each eval set (their tasks: those
    of train_batches). Batches are visited in the same order for every seed (the data order is part
    of the traffic); the seed sets the initialization."""
    torch.manual_seed(seed)
    task = build_task(cfg, train_batches[0].tasks, SPARSE, DENSE_DIM)
    task.heads.init_from_base_rates(base_rates(train_batches))
    steps = epochs * len(train_batches)
    # The batches move to the device once, not at every step (Trainer's move is then a no-op).
    stream = CyclingStream([b.to(device) for b in train_batches])
    trainer = Trainer(task, stream, train_config(lr, seed, steps, bf16), None, device=device)
    try:
        result = trainer.fit(steps)
        scored = _scored_task(trainer, cfg, train_batches[0].tasks)
    finally:
        trainer.close()
    return RunResult(result.seconds, result.examples, result.steps,
                     {name: Scores(predictions(scored, b)) for name, b in evals.items()})


def _scored_task(trainer: Trainer, cfg: ModelConfig, tasks: tuple[str, ...]) -> torch.nn.Module:
    """The trained task to score: itself, or with sharded tables (a "torchrec" backend) a plain-torch
    copy of its weights on the trainer's device, as the pipeline scores (gem.train.daily)."""
    if not trainer.sharded:
        return trainer.task
    plain = build_task(cfg, tasks, SPARSE, DENSE_DIM, sparse_backend="torch")
    plain.load_state_dict(trainer.plain_state())
    return plain.to(trainer.device)

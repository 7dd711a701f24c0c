"""Pretraining loop: steps over a resumable batch stream, checkpoints that resume exactly.

    python -m gem.train --config FILE --mix-ds D [--run-dir DIR] [--steps N] [--warm-start DIR]

Each step: batch -> GemTrainTask (masked, importance-weighted loss) -> AdamW. Every
`train.checkpoint_every` steps and at the end, gem.checkpoint writes model, optimizer, loader
state and RNG states; a run started on a folder that holds checkpoints continues from the latest
one, so a killed run resumed with the same config produces the same losses and final weights as
an uninterrupted one (tested on CPU). `--warm-start DIR` initialises the weights (not the
optimizer or the loader) from another run's latest checkpoint: day D's run starts from the
promoted model of an earlier day.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from gem import checkpoint
from gem.config import TrainConfig
from gem.data.batch import Batch


class BatchStream(Protocol):
    """What the trainer needs from a loader (gem.data.loader.ResumableLoader has it)."""

    def batches(self, limit: int | None = None) -> Iterator[Batch]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass
class TrainResult:
    steps: int
    losses: list[float] = field(default_factory=list)  # every step's loss, from step 1
    examples: int = 0
    seconds: float = 0.0
    checkpoint: Path | None = None


class Trainer:
    def __init__(self, task: torch.nn.Module, stream: BatchStream, cfg: TrainConfig, run_dir: Path,
                 config_snapshot: dict[str, Any] | None = None) -> None:
        self.task, self.stream, self.cfg, self.run_dir = task, stream, cfg, run_dir
        self.optimizer = torch.optim.AdamW(task.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
        self.config_snapshot = config_snapshot or {"train": asdict(cfg)}
        self.step = 0
        self.losses: list[float] = []

    # ---- checkpoints ------------------------------------------------------------------------------
    def _state(self) -> dict[str, Any]:
        # get_state_dict creates the optimizer's state tensors if it has none yet, so a fresh
        # optimizer has slots for dcp.load to fill (a plain state_dict() of it is empty).
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model, optimizer = get_state_dict(self.task, self.optimizer)
        return {"model": model, "optimizer": optimizer}

    def save(self) -> Path:
        extra = {"losses": self.losses, "loader": self.stream.state_dict(), "rng": checkpoint.rng_state(),
                 "config": self.config_snapshot}
        return checkpoint.save(self.run_dir, self.step, self._state(), extra)

    def resume(self) -> bool:
        """Continue from the run folder's latest checkpoint, if there is one."""
        path = checkpoint.latest(self.run_dir)
        if path is None:
            return False
        from torch.distributed.checkpoint.state_dict import set_state_dict

        state = self._state()
        extra = checkpoint.load(path, state)
        set_state_dict(self.task, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"])
        self.stream.load_state_dict(extra["loader"])
        checkpoint.set_rng_state(extra["rng"])
        self.step, self.losses = int(extra["step"]), list(extra["losses"])
        return True

    def warm_start(self, other_run: Path) -> Path:
        """Weights from another run's latest checkpoint (optimizer and loader start fresh)."""
        path = checkpoint.latest(other_run)
        if path is None:
            raise checkpoint.CheckpointError(f"warm start: no checkpoint in {other_run}")
        state = {"model": self.task.state_dict()}
        checkpoint.load(path, state)
        self.task.load_state_dict(state["model"])
        return path

    # ---- the loop ---------------------------------------------------------------------------------
    def fit(self, steps: int | None = None, progress: bool = False) -> TrainResult:
        total = steps or self.cfg.steps
        result = TrainResult(steps=self.step)
        if self.step >= total:
            return result
        bar = None
        if progress:
            from tqdm import tqdm

            bar = tqdm(total=total, initial=self.step, desc="train", unit="step")
        t0 = time.perf_counter()
        self.task.train()
        for batch in self.stream.batches(limit=total - self.step):
            self.optimizer.zero_grad(set_to_none=True)
            loss, _ = self.task(batch)
            loss.backward()
            self.optimizer.step()
            self.step += 1
            self.losses.append(float(loss.detach()))
            result.examples += batch.size
            if bar is not None:
                seconds = time.perf_counter() - t0
                bar.set_postfix(loss=f"{self.losses[-1]:.4f}", ex_s=f"{result.examples / max(seconds, 1e-9):,.0f}")
                bar.update(1)
            if self.step % self.cfg.checkpoint_every == 0 or self.step == total:
                result.checkpoint = self.save()
        if bar is not None:
            bar.close()
        result.steps, result.losses, result.seconds = self.step, list(self.losses), time.perf_counter() - t0
        return result

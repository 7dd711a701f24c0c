"""Pretraining loop: steps over a resumable batch stream, checkpoints that resume exactly.

Each step: batch -> GemTrainTask (masked, importance-weighted loss) -> AdamW on the dense part;
with model.embeddings.backend "torchrec" the tables are sharded by an explicit plan
(gem.train.sharding) and trained by a fused in-backward optimizer. Every `train.checkpoint_every`
steps and at the end, gem.train.checkpoint writes model, optimizers, loader state and RNG states; a
run started on a folder that holds checkpoints continues from the latest one, so a killed run
resumed with the same config produces the same losses and final weights as an uninterrupted one
(tested on CPU, both backends). A NaN or infinite loss stops the run with NonFiniteLossError before
that step updates anything, a NaN or infinite gradient before its dense optimizer step; either
way no checkpoint is written after it, so the last one written is the last good one.

A Trainer without a run folder (run_dir None) trains the same steps and writes no checkpoint: a run
kept in memory, such as each of the quality study's (gem.study.runner). A run folder is a local
folder or an object store prefix (`s3://bucket/lake/_checkpoints/<run>`), as gem.train.checkpoint
writes both.
"""

from __future__ import annotations

import json
import math
import time
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NoReturn, Protocol

import torch

from gem import storage
from gem.config import TrainConfig
from gem.data.batch import Batch
from gem.model.configs import weights_config
from gem.progress import Progress
from gem.train import checkpoint
from gem.train.lr_schedule import learning_rate


class NonFiniteLossError(FloatingPointError):
    """A step's loss or gradients were NaN or infinite: training stops, its checkpoints stay as they were."""


class BatchStream(Protocol):
    """What the trainer needs from a loader (gem.data.loader.ResumableLoader has it).

    A stream that can continue under another world size than the one that saved its positions
    also has `resharded_state(states) -> state`: from every saving rank's state_dict, in rank order,
    the state each rank of the new world loads (`Trainer.resume` refuses a world-size change
    without it)."""

    def batches(self, limit: int | None = None) -> Iterator[Batch]: ...
    def state_dict(self) -> dict[str, Any]: ...
    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class CyclingStream:
    """A BatchStream over a fixed list of batches, cycled in order; resumes at its position (benches
    and tests; the pipeline reads gem.data.loader's)."""

    def __init__(self, batches: list[Batch]) -> None:
        self.items, self.position = batches, 0

    def batches(self, limit: int | None = None) -> Iterator[Batch]:
        produced = 0
        while limit is None or produced < limit:
            batch = self.items[self.position % len(self.items)]
            self.position += 1  # before the yield: a checkpoint taken at this step resumes after it
            produced += 1
            yield batch

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.position = int(state["position"])

    @staticmethod
    def resharded_state(states: list[dict[str, Any]]) -> dict[str, Any]:
        """Every rank steps together, so each saving rank's position is the number of steps taken:
        under any world size each rank continues its own list there."""
        return {"position": min(int(s["position"]) for s in states)}


@dataclass
class TrainResult:
    steps: int
    losses: list[float] = field(default_factory=list)  # every step's loss, from step 1
    examples: int = 0
    seconds: float = 0.0
    checkpoint: checkpoint.Location | None = None
    # Per event type and over all types ("all"), the share of this run's sequence compute spent on
    # padding, in the body's padding_measure: Kunlun's jagged layout, the share of its sequence
    # FLOPs; padded bodies, the share of their padded sequence blocks.
    padding_ratio: dict[str, float] = field(default_factory=dict)


class Trainer:
    """Owns the model replica(s), the optimizers and the checkpoints of one run.

    Two sparse backends (task.embeddings.backend):
      "torch"    the whole task is one module; under a process group DDP averages all gradients.
      "torchrec" DistributedModelParallel: the tables sharded by gem.train.sharding's explicit plan,
                 trained by a fused in-backward optimizer (train.embedding_optimizer), the dense rest
                 under a fused AdamW, in DDP when there is more than one rank (gem.train.sharding).
                 A single process gets a one-rank gloo group.
    Checkpoints hold the model (tables as sharded tensors), the dense optimizer's state by
    parameter name, the tables' fused optimizer state, and every rank's loader position and RNG
    states (each rank reads its own shard of the data).

    A checkpoint resumes under another world size than the one that saved it (torchrun with more or
    fewer ranks): torch.distributed.checkpoint reshards the tables and their fused optimizer state
    to the new plan, and the dense weights and AdamW state are whole on every rank; the stream's
    positions are placed by its `resharded_state` (BatchStream), with a warning.

    run_dir None: no checkpoints (nothing to resume from, none written). device None: the current
    CUDA device when there is one, else the CPU; a caller that must run elsewhere (the study's CPU
    presets on a machine with a GPU) names it. The dense optimizer is AdamW at train.weight_decay;
    at 0 (the default) its update is Adam's.
    """

    def __init__(self, task: torch.nn.Module, stream: BatchStream, cfg: TrainConfig, run_dir: str | Path | None,
                 config_snapshot: dict[str, Any] | None = None, device: torch.device | None = None) -> None:
        self.task, self.stream, self.cfg, self.run_dir = task, stream, cfg, run_dir
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        self.device = device
        self.sharded = getattr(task.embeddings, "backend", "torch") == "torchrec"
        # A body that computes each batch in length groups (Kunlun) says how many; the padding it
        # reports is then that of the groups' blocks.
        # How the body pads its sequences: a Kunlun body counts its own (gem.model.kunlun); the other
        # architectures pad each batch to one (B, longest) block per event type.
        self.sequence_padding = getattr(task.body, "sequence_padding", None)
        self.padding_measure = getattr(task.body, "padding_measure", "padded sequence blocks")
        # bf16 autocast (GPU: train.bf16; CPU: train.cpu_bf16). train.compile: torch.compile of the
        # dense body in place (parameter names, hence checkpoints, stay the same as uncompiled); on the
        # CPU with dynamic shapes from the start, as every batch brings other token counts (a static
        # first compile would only be thrown away at the second batch).
        self.autocast = cfg.bf16 if self.device.type == "cuda" else (self.device.type == "cpu" and cfg.cpu_bf16)
        if cfg.compile:
            task.body.compile(dynamic=True if self.device.type == "cpu" else None)
        self.owns_process_group = False
        if self.sharded:
            # torchrec is optional: imported only when the tables are sharded.
            from gem.train.sharding import dense_parameters, ensure_process_group, shard_task  # noqa: PLC0415

            self.owns_process_group = ensure_process_group(self.device)
            # The dense part goes to the device here; the tables move as DMP shards them.
            for name, child in task.named_children():
                if name != "embeddings":
                    child.to(self.device)
            task.task_weights = task.task_weights.to(self.device)
            self.model, self.plan = shard_task(task, cfg.embedding_lr, self.device, cfg.embedding_optimizer)
            dense = dense_parameters(self.model)
        else:
            task.to(self.device)
            # Under torchrun (a process group is up) the dense model trains data-parallel: DDP averages
            # the gradients of the ranks, each of which reads its own shard of the mixture.
            distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
            # find_unused_parameters: a batch can leave parts of the model without gradient.
            self.model = (torch.nn.parallel.DistributedDataParallel(task, find_unused_parameters=True)
                          if distributed else task)
            dense = list(task.parameters())
        # fused: one kernel over every parameter, on the CPU too (faster than the per-parameter loop,
        # which is a large share of a CPU step with many dense tensors).
        self.optimizer = torch.optim.AdamW(dense, lr=cfg.lr, weight_decay=cfg.weight_decay,
                                           fused=self.device.type in ("cpu", "cuda"))
        self.config_snapshot = config_snapshot or {"train": asdict(cfg)}
        self.step = 0
        self.losses: list[float] = []

    def close(self) -> None:
        """Tear down the one-rank group this trainer started (a torchrun group belongs to the caller)."""
        if self.owns_process_group and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
            self.owns_process_group = False

    # ---- checkpoints ------------------------------------------------------------------------------
    @property
    def _checkpointed(self) -> torch.nn.Module:
        """The module whose state and parameter names a checkpoint holds: DMP when sharded (it names
        the tables as the task does, holding ShardedTensors, each rank its own), else the bare task."""
        return self.model if self.sharded else self.task

    def _model_state(self) -> dict[str, Any]:
        return self._checkpointed.state_dict()

    def _state(self) -> dict[str, Any]:
        named = self._checkpointed.named_parameters()
        state = {"model": self._model_state(), "optimizer": checkpoint.optimizer_state(named, self.optimizer)}
        if self.sharded:
            state["embedding_optimizer"] = self.model.fused_optimizer.state_dict()
        return state

    def _load_model_state(self, model_state: dict[str, Any]) -> None:
        self._checkpointed.load_state_dict(model_state)

    def _rank_states(self) -> list[dict[str, Any]]:
        """Every rank's stream position and RNG states, in rank order (every rank takes part)."""
        mine = {"loader": self.stream.state_dict(), "rng": checkpoint.rng_state()}
        if checkpoint.single_process():
            return [mine]
        states: list[Any] = [None] * torch.distributed.get_world_size()
        torch.distributed.all_gather_object(states, mine)
        return states

    def save(self) -> checkpoint.Location:
        """Write this step's checkpoint (every rank calls it). extra.json holds rank 0's loader and RNG
        states as "loader" and "rng" and, under more than one rank, every rank's as "ranks"."""
        if self.run_dir is None:
            raise ValueError("this Trainer has no run folder (run_dir None), so it writes no checkpoint")
        ranks = self._rank_states()
        extra = {"losses": self.losses, **ranks[0], "world_size": len(ranks), "config": self.config_snapshot}
        if len(ranks) > 1:
            extra["ranks"] = ranks
        return checkpoint.save(self.run_dir, self.step, self._state(), extra)

    def resume(self) -> bool:
        """Continue from the run folder's newest loadable checkpoint, if there is one.

        Crashed writers' partial folders (no extra.json) are removed first. A published checkpoint
        that cannot be loaded (a truncated shard, a broken extra.json) is set aside with a warning and
        the one before it is tried, so a retry after a crash mid-write does not fail forever on the same folder.
        """
        if self.run_dir is None:
            return False
        rank0 = not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0
        if rank0:
            for partial in checkpoint.discard_partials(self.run_dir):
                print(f"removed the unpublished checkpoint {partial} (a crashed write)")
        for path in checkpoint.published(self.run_dir):
            state = self._state()
            try:
                extra = checkpoint.load(path, state)  # tensors in place; the loads below also take the rest
            except checkpoint.CheckpointError as e:
                if torch.distributed.is_initialized():
                    torch.distributed.barrier()  # every rank has tried this folder before rank 0 moves it
                if rank0:
                    moved = storage.name(checkpoint.set_aside(path))
                    warnings.warn(f"{e}; set aside as {moved}, trying the one before", stacklevel=2)
                if torch.distributed.is_initialized():
                    torch.distributed.barrier()
                continue
            self._restore(state, extra)
            return True
        return False

    def _restore(self, state: dict[str, Any], extra: dict[str, Any]) -> None:
        self._load_model_state(state["model"])
        checkpoint.load_optimizer_state(self._checkpointed.named_parameters(), self.optimizer, state["optimizer"])
        if self.sharded:
            self.model.fused_optimizer.load_state_dict(state["embedding_optimizer"])
        mine = self._resharded_rank_state(extra)
        self.stream.load_state_dict(mine["loader"])
        checkpoint.set_rng_state(mine["rng"])
        self.step, self.losses = int(extra["step"]), list(extra["losses"])

    def _resharded_rank_state(self, extra: dict[str, Any]) -> dict[str, Any]:
        """This rank's loader and RNG states from a checkpoint's extra.json: its own under the saver's
        world size; under another one, the stream's `resharded_state` of the saving ranks' positions
        and rank 0's RNG states (with a warning: the data order then differs from an uninterrupted
        run's). A stream without `resharded_state` is refused with CheckpointError."""
        saved = extra.get("ranks") or [{"loader": extra["loader"], "rng": extra["rng"]}]
        distributed = torch.distributed.is_initialized()
        world = torch.distributed.get_world_size() if distributed else 1
        if len(saved) == world:
            return saved[torch.distributed.get_rank() if distributed else 0]
        reshard = getattr(self.stream, "resharded_state", None)
        if reshard is None:
            raise checkpoint.CheckpointError(
                f"step {extra['step']} was saved by {len(saved)} rank(s) and this run has {world}: the weights and "
                f"optimizer states reshard, but {type(self.stream).__name__} cannot place its saved positions under "
                f"another world size; resume with {len(saved)} rank(s)")
        state = reshard([s["loader"] for s in saved])
        warnings.warn(f"step {extra['step']} was saved by {len(saved)} rank(s), this run has {world}: weights and "
                      f"optimizer states resharded; the data stream continues from {state}", stacklevel=3)
        return {"loader": state, "rng": saved[0]["rng"]}

    def warm_start(self, source: str | Path) -> checkpoint.Location:
        """Weights from a checkpoint folder, or a run folder's latest checkpoint (optimizers and
        loader start fresh).

        Refused with a clear error when that checkpoint was trained with another model config
        (its config, embeddings backend included, is saved inside it): its tensors would not fit,
        or would mean something else.
        """
        path = source if storage.name(source).startswith(checkpoint.PREFIX) else checkpoint.latest(source)
        if path is None:
            raise checkpoint.CheckpointError(f"warm start: no checkpoint in {source}")
        extra = checkpoint.read_extra(path)
        theirs, ours = extra.get("config", {}).get("model"), self.config_snapshot.get("model")
        if (theirs is not None and ours is not None
                and jsonable(weights_config(theirs)) != jsonable(weights_config(ours))):
            raise checkpoint.CheckpointError(
                f"warm start: {path} was trained with model config {theirs}, this run's is {ours}; "
                f"start this architecture fresh or point --run-dir elsewhere")
        state = {"model": self._model_state()}
        checkpoint.load(path, state)
        self._load_model_state(state["model"])
        return path

    def plain_state(self) -> dict[str, torch.Tensor] | None:
        """The trained weights for a plain-torch ("torch" backend) task, on rank 0; every rank calls it.

        Evaluation runs that plain model on rank 0 alone, for either backend."""
        if self.sharded:
            from gem.train.sharding import unsharded_state  # noqa: PLC0415 - torchrec only when sharded

            return unsharded_state(self.model)
        rank0 = not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0
        return {k: v.detach().cpu() for k, v in self.task.state_dict().items()} if rank0 else None

    # ---- the loop ---------------------------------------------------------------------------------
    def _stop(self, bar: Progress | None, what: str, look_for: str) -> NoReturn:
        """Raise NonFiniteLossError: `what` happened; the last good checkpoint and what to look for."""
        if bar is not None:
            bar.close()
        last = ("This run writes no checkpoints (no run folder)" if self.run_dir is None else
                f"The last good checkpoint is {checkpoint.latest(self.run_dir)} (a rerun resumes from it)")
        raise NonFiniteLossError(f"{what}. {last}; look for {look_for}, or lower train.lr")

    @staticmethod
    def _mean_over_ranks(loss: torch.Tensor) -> float:
        """The step's loss averaged over the ranks: the objective DDP trains, the same on every rank
        (so the losses that rank 0 saves in a checkpoint are every rank's to resume with)."""
        if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
            loss = loss.clone()
            torch.distributed.all_reduce(loss)
            loss /= torch.distributed.get_world_size()
        return float(loss)

    def fit(self, steps: int | None = None, progress: bool = False) -> TrainResult:
        total = steps or self.cfg.steps
        result = TrainResult(steps=self.step)
        if self.step >= total:
            return result
        # A bar on a terminal, plain lines in CI and Airflow's task logs.
        bar = Progress(total, "train", "step", initial=self.step) if progress else None
        t0 = time.perf_counter()
        self.model.train()
        real: dict[str, int] = {}
        padded: dict[str, int] = {}
        for batch in self.stream.batches(limit=total - self.step):
            sizes = (self.sequence_padding({e: j.lengths for e, j in batch.sequences.items()})
                     if self.sequence_padding is not None else batch.padded_sizes())
            for event, (n_real, n_padded) in sizes.items():
                real[event] = real.get(event, 0) + n_real
                padded[event] = padded.get(event, 0) + n_padded
            batch = batch.to(self.device)
            self.optimizer.zero_grad(set_to_none=True)
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
                loss, _ = self.model(batch)
            # Checked before backward: the fused embedding optimizer updates the tables inside it.
            # The loss is averaged over the ranks first, so every rank stops at the same step.
            step_loss = self._mean_over_ranks(loss.detach())
            if not math.isfinite(step_loss):
                self._stop(bar, f"step {self.step + 1}: the loss is {step_loss}; training stopped before this step "
                                "changed any weight", "NaN or infinite inputs in the batch")
            loss.backward()
            # A finite loss can still back-propagate NaN or infinite gradients (an overflow inside
            # the model): stop before the dense step, every rank at the same step.
            grads = [p.grad for group in self.optimizer.param_groups for p in group["params"] if p.grad is not None]
            finite = float(torch.isfinite(torch.nn.utils.get_total_norm(grads))) if grads else 1.0
            if self._mean_over_ranks(torch.tensor(finite, device=self.device)) < 1.0:
                self._stop(bar, f"step {self.step + 1}: the loss is finite ({step_loss}) but its gradients are not; "
                                "training stopped before the dense optimizer step (the fused embedding tables may "
                                "have taken it, so do not use this process's weights)", "overflowing activations")
            for group in self.optimizer.param_groups:
                group["lr"] = learning_rate(self.cfg, self.step)
            self.optimizer.step()
            self.step += 1
            self.losses.append(step_loss)
            result.examples += batch.size
            if bar is not None:
                seconds = time.perf_counter() - t0
                bar.update(loss=f"{self.losses[-1]:.4f}", ex_s=f"{result.examples / max(seconds, 1e-9):,.0f}")
            if self.run_dir is not None and (self.step % self.cfg.checkpoint_every == 0 or self.step == total):
                result.checkpoint = self.save()
        if bar is not None:
            bar.close()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the seconds include the steps still queued on the GPU
        result.steps, result.losses, result.seconds = self.step, list(self.losses), time.perf_counter() - t0
        result.padding_ratio = padding_ratios(real, padded)
        return result

def padding_ratios(real: dict[str, int], padded: dict[str, int]) -> dict[str, float]:
    """Per event type, and over all of them ("all": the share of every padded block position,
    which is what padded sequence compute wastes), 1 - real / padded."""
    totals = {**padded, "all": sum(padded.values())}
    reals = {**real, "all": sum(real.values())}
    return {e: 1.0 - reals[e] / totals[e] if totals[e] else 0.0 for e in sorted(totals)}


def jsonable(x: Any) -> Any:
    return json.loads(json.dumps(x, default=str))

"""The precompute model: a promoted checkpoint loaded as a plain-torch task, once per executor Python worker.

Plain torch (no torchrec, no process group): a task computes forward passes only, on one device.
A checkpoint trained with torchrec tables is read under the plain task's names
(gem.model.embeddings.collection_state_key maps them; torch.distributed.checkpoint reshards the saved
shards into whole tables).

    model = PrecomputeModel.load(cfg, pin)
    model.user_embeddings(batch)   # (B, tokens, d): Kunlun.user_representation, the user side alone
    model.predict(batch)           # ((B, T) probabilities, (B, body.out_dim) the heads' input)
    model.history_codes(rep)       # (B, code_dim / 2) uint8: LoopFM's packed INT4 codes of predict's rep
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from gem import storage
from gem.config import GemConfig
from gem.data.batch import Batch, Jagged, Sparse
from gem.data.encode import DENSE_COLUMNS
from gem.data.loader import SPARSE_FEATURES
from gem.model.build import build_task
from gem.model.configs import weights_config
from gem.model.embeddings import collection_state_key
from gem.model.ops.int4 import pack_int4
from gem.model.task import GemTrainTask
from gem.train import checkpoint
from gem.train.trainer import jsonable


class PromotedModelMissing(RuntimeError):
    """No promoted model to precompute with (pretraining never promoted one, or its files are gone)."""


@dataclass(frozen=True)
class ModelPin:
    """The model a precompute day runs: a promoted checkpoint, pinned on its refresh day."""

    checkpoint: str
    version: str  # gem.train.promotion.Promotion.version
    model_ds: str  # the promotion's mixture day
    refresh_ds: str  # the precompute day that pinned it (and recomputed every user)
    tasks: tuple[str, ...]


@dataclass
class PrecomputeModel:
    task: GemTrainTask
    version: str
    device: torch.device

    @classmethod
    def load(cls, cfg: GemConfig, pin: ModelPin, device: torch.device | None = None) -> PrecomputeModel:
        """The pinned checkpoint as a plain-torch task in eval mode on `device` (default: this
        process's GPU, LOCAL_RANK's under torchrun, else the CPU); PromotedModelMissing when its
        folder is gone, CheckpointError when it was trained with another model config. The folder is
        local or on an object store (gem.storage)."""
        path = pin.checkpoint
        if not storage.listdir(path):
            raise PromotedModelMissing(f"the promoted checkpoint {path} ({pin.version}) is gone; rerun "
                                       f"`python -m jobs.pretrain --ds {pin.model_ds}`")
        if cfg.model.arch != "kunlun":
            raise ValueError(f"precompute needs the user-side representation, which only kunlun defines; "
                             f"model.arch is {cfg.model.arch!r}")
        extra = checkpoint.read_extra(path)
        theirs = extra.get("config", {}).get("model")
        if theirs is not None and jsonable(weights_config(theirs)) != jsonable(weights_config(cfg.to_dict()["model"])):
            raise checkpoint.CheckpointError(f"{path} was trained with model config {theirs}; this config's is "
                                             f"{cfg.to_dict()['model']}")
        task = build_task(cfg.model, pin.tasks, SPARSE_FEATURES, len(DENSE_COLUMNS), sparse_backend="torch")
        load_plain_weights(task, path, (theirs or {}).get("embeddings", {}).get("backend", "torch"))
        device = device or default_device()
        return cls(task.eval().to(device), pin.version, device)

    @property
    def tasks(self) -> tuple[str, ...]:
        return tuple(self.task.heads.tasks)

    @torch.no_grad()
    def user_embeddings(self, batch: Batch) -> torch.Tensor:
        """(B, sum_e T_e + 1, d) on the CPU: each user's sequences pooled by the first layer's HSP,
        then their user_id token (Kunlun.user_representation); reads only batch.sparse["user_id"]
        and the sequences."""
        sparse, sequences = self.task.body_inputs(batch.to(self.device))
        return self.task.body.user_representation(sparse, sequences).float().cpu()

    @torch.no_grad()
    def history_codes(self, representation: torch.Tensor) -> torch.Tensor | None:
        """(B, body.out_dim) representations (predict's second output) -> (B, code_dim / 2) uint8:
        LoopFM's INT4 codes packed two per byte; None when the model trained no history autoencoder."""
        autoencoder = self.task.history_autoencoder
        if autoencoder is None:
            return None
        return pack_int4(autoencoder.codes(representation.to(self.device))).cpu()

    @torch.no_grad()
    def predict(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """((B, T) per-task probabilities, (B, body.out_dim) the representation the heads read), on the CPU."""
        representation = self.task.representation(batch.to(self.device))
        return torch.sigmoid(self.task.heads(representation)).float().cpu(), representation.float().cpu()


def default_device() -> torch.device:
    """This process's GPU (LOCAL_RANK's under torchrun) when there is one, else the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


def load_plain_weights(task: GemTrainTask, path: str | Path, trained_with: str) -> None:
    """A checkpoint's model weights into a plain-torch task, in place. trained_with: the embeddings
    backend it was trained with; "torchrec" tables are read under the collection's names, their
    saved shards resharded into whole tables."""
    plain = task.state_dict()
    saved_name = {k: collection_state_key(k) if trained_with == "torchrec" else k for k in plain}
    state = {"model": {saved_name[k]: v for k, v in plain.items()}}
    # In place, into the plain task's tensors; by this rank alone (the pretraining gate loads the
    # promoted model on rank 0 while the other ranks wait at a barrier).
    checkpoint.load(path, state, alone=True)
    task.load_state_dict({k: state["model"][saved_name[k]] for k in plain})


def user_batch(user_hashes: torch.Tensor, sequences: dict[str, Jagged], tasks: tuple[str, ...]) -> Batch:
    """A batch of users alone (no ad, no request): user_id (B,) int64 hashed ids and their sequences;
    dense, labels and weights are zeros the user representation never reads."""
    b = int(user_hashes.shape[0])
    return Batch(dense=torch.zeros(b, len(DENSE_COLUMNS)),
                 sparse={"user_id": Sparse(user_hashes, torch.ones(b, dtype=torch.int32))},
                 sequences=sequences, labels=torch.zeros(b, len(tasks)),
                 label_mask=torch.zeros(b, len(tasks), dtype=torch.bool), weights=torch.zeros(b, len(tasks)),
                 tasks=tasks, impression_times=torch.zeros(b, dtype=torch.int64))

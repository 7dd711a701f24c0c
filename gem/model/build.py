"""Build the train task for a model config: embeddings + body + heads, from config alone."""

from __future__ import annotations

import torch

from gem.model.configs import ModelConfig
from gem.model.embeddings import PlainEmbeddings
from gem.model.heads import DomainExpertHeads
from gem.model.kunlun import Kunlun
from gem.model.task import GemTrainTask


def build_task(cfg: ModelConfig, tasks: tuple[str, ...], sparse_features: tuple[str, ...], dense_dim: int,
               task_weights: dict[str, float] | None = None) -> GemTrainTask:
    missing = sorted(set(sparse_features) - set(cfg.embeddings.buckets))
    if missing:
        raise ValueError(f"model.embeddings.buckets has no table for sparse features {missing}")
    if cfg.arch != "kunlun":
        raise ValueError(f"unknown arch {cfg.arch!r}")
    body = Kunlun(cfg.kunlun, sparse_features, dense_dim)
    heads = DomainExpertHeads(body.out_dim, tasks, cfg.heads.hidden, cfg.heads.shared_experts)
    weights = torch.tensor([(task_weights or {}).get(t, 1.0) for t in tasks])
    return GemTrainTask(PlainEmbeddings(cfg.embeddings), body, heads, weights)

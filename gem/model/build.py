"""Build the train task for a model config: embeddings + body + heads, from config alone."""

from __future__ import annotations

import torch

from gem.data.encode import VOCABULARIES
from gem.model.configs import ModelConfig
from gem.model.embeddings import PlainEmbeddings
from gem.model.heads import DomainExpertHeads
from gem.model.hstu import HSTU
from gem.model.kunlun import Kunlun
from gem.model.task import GemTrainTask


def build_task(cfg: ModelConfig, tasks: tuple[str, ...], sparse_features: tuple[str, ...], dense_dim: int,
               task_weights: dict[str, float] | None = None) -> GemTrainTask:
    missing = sorted(set(sparse_features) - set(cfg.embeddings.buckets))
    if missing:
        raise ValueError(f"model.embeddings.buckets has no table for sparse features {missing}")
    if cfg.arch == "kunlun":
        body: torch.nn.Module = Kunlun(cfg.kunlun, sparse_features, dense_dim)
    elif cfg.arch == "hstu":
        vocab = {name: len(values) + 1 for name, values in VOCABULARIES.items()}
        body = HSTU(cfg.hstu, sparse_features, dense_dim, vocab)
    else:
        raise ValueError(f"unknown arch {cfg.arch!r}")
    heads = DomainExpertHeads(body.out_dim, tasks, cfg.heads.hidden, cfg.heads.shared_experts)
    weights = torch.tensor([(task_weights or {}).get(t, 1.0) for t in tasks])
    return GemTrainTask(PlainEmbeddings(cfg.embeddings), body, heads, weights)

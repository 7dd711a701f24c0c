"""Build the train task for a model config: embeddings + body + heads, from config alone."""

from __future__ import annotations

import torch

from gem.data.encode import VOCABULARIES
from gem.model.configs import ModelConfig
from gem.model.dlrm import DLRM
from gem.model.embeddings import PlainEmbeddings
from gem.model.heads import DomainExpertHeads
from gem.model.hstu import HSTU
from gem.model.interformer import InterFormer
from gem.model.kunlun import Kunlun
from gem.model.task import GemTrainTask
from gem.model.wukong import WukongModel


def build_body(cfg: ModelConfig, sparse_features: tuple[str, ...], dense_dim: int) -> torch.nn.Module:
    """The dense body `cfg.arch` names: (sparse embeddings, dense, sequences) -> (B, body.out_dim)."""
    vocab = {name: len(values) + 1 for name, values in VOCABULARIES.items()}
    if cfg.arch == "kunlun":
        return Kunlun(cfg.kunlun, sparse_features, dense_dim)
    if cfg.arch == "hstu":
        return HSTU(cfg.hstu, sparse_features, dense_dim, vocab)
    if cfg.arch == "interformer":
        return InterFormer(cfg.interformer, sparse_features, dense_dim, vocab)
    if cfg.arch == "wukong":
        return WukongModel(cfg.wukong, sparse_features, dense_dim)
    if cfg.arch == "dlrm":
        return DLRM(cfg.dlrm, sparse_features, dense_dim)
    raise ValueError(f"unknown arch {cfg.arch!r}")


def build_task(cfg: ModelConfig, tasks: tuple[str, ...], sparse_features: tuple[str, ...], dense_dim: int,
               task_weights: dict[str, float] | None = None, sparse_backend: str | None = None,
               events: tuple[str, ...] = ("impression", "click", "conversion")) -> GemTrainTask:
    """sparse_backend (default: cfg.embeddings.backend) "torch": plain nn.Embedding tables (no
    torchrec; runs anywhere); "torchrec": the same tables in a torchrec EmbeddingCollection fed by
    the batch's KJTs (gem.model.sparse), to be sharded by gem.train.sharding."""
    sparse_backend = sparse_backend or cfg.embeddings.backend
    missing = sorted(set(sparse_features) - set(cfg.embeddings.buckets))
    if missing:
        raise ValueError(f"model.embeddings.buckets has no table for sparse features {missing}")
    body = build_body(cfg, sparse_features, dense_dim)
    heads = DomainExpertHeads(body.out_dim, tasks, cfg.heads.hidden, cfg.heads.shared_experts)
    weights = torch.tensor([(task_weights or {}).get(t, 1.0) for t in tasks])
    if sparse_backend == "torch":
        embeddings: torch.nn.Module = PlainEmbeddings(cfg.embeddings)
    elif sparse_backend == "torchrec":
        from gem.model.sparse import TorchrecEmbeddings

        embeddings = TorchrecEmbeddings(cfg.embeddings, events)
    else:
        raise ValueError(f"sparse_backend must be 'torch' or 'torchrec', got {sparse_backend!r}")
    return GemTrainTask(embeddings, body, heads, weights)

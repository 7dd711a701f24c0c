"""Build the train task for a model config: embeddings + body + heads, from config alone."""

from __future__ import annotations

import torch

from gem.data.encode import VOCABULARIES
from gem.model.configs import EmbeddingConfig, ModelConfig
from gem.model.dlrm import DLRM
from gem.model.embeddings import PlainEmbeddings
from gem.model.heads import DomainExpertHeads
from gem.model.history_code_autoencoder import HistoryCodeAutoencoder
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


def build_embeddings(cfg: EmbeddingConfig, backend: str, events: tuple[str, ...]) -> torch.nn.Module:
    """The id tables: "torch" PlainEmbeddings, or "torchrec" TorchrecEmbeddings (imported only then)."""
    if backend == "torch":
        return PlainEmbeddings(cfg)
    if backend == "torchrec":
        from gem.model.sparse import TorchrecEmbeddings  # noqa: PLC0415 - torchrec is optional

        return TorchrecEmbeddings(cfg, events)
    raise ValueError(f"sparse_backend must be 'torch' or 'torchrec', got {backend!r}")


def task_weight_vector(tasks: tuple[str, ...], task_weights: dict[str, float] | None) -> torch.Tensor:
    """(T,) loss weight of each task, 1 where task_weights does not name it."""
    return torch.tensor([(task_weights or {}).get(t, 1.0) for t in tasks])


def build_task(cfg: ModelConfig, tasks: tuple[str, ...], sparse_features: tuple[str, ...], dense_dim: int,
               task_weights: dict[str, float] | None = None, sparse_backend: str | None = None,
               events: tuple[str, ...] = ("impression", "click", "conversion")) -> GemTrainTask:
    """sparse_backend (default: cfg.embeddings.backend) "torch": plain nn.Embedding tables (no
    torchrec; runs anywhere); "torchrec": the same tables in a torchrec EmbeddingCollection fed by
    the batch's KJTs (gem.model.sparse), to be sharded by gem.train.sharding. With
    cfg.history_codes.enabled the task also trains LoopFM's autoencoder on its representation."""
    sparse_backend = sparse_backend or cfg.embeddings.backend
    missing = sorted(set(sparse_features) - set(cfg.embeddings.buckets))
    if missing:
        raise ValueError(f"model.embeddings.buckets has no table for sparse features {missing}")
    body = build_body(cfg, sparse_features, dense_dim)
    heads = DomainExpertHeads(body.out_dim, tasks, cfg.heads.hidden, cfg.heads.shared_experts)
    weights = task_weight_vector(tasks, task_weights)
    embeddings = build_embeddings(cfg.embeddings, sparse_backend, events)
    autoencoder = HistoryCodeAutoencoder(body.out_dim, cfg.history_codes) if cfg.history_codes.enabled else None
    return GemTrainTask(embeddings, body, heads, weights, history_autoencoder=autoencoder)

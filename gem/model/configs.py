"""Model configs: typed, validated, torch-free (gem.config embeds them; checkpoints store them).

One config type per architecture; `ModelConfig` picks the architecture and holds the parts every
architecture shares (embeddings, heads).
"""

from __future__ import annotations

from dataclasses import dataclass, field

ARCHITECTURES = ("kunlun", "hstu")


@dataclass(frozen=True)
class EventConfig:
    width: int = 32
    activations: tuple[str, ...] = ("silu", "gelu")  # one per head
    seeds: int = 8  # HSP seeds (overcomplete)
    summary_tokens: int = 2  # HSP output tokens T_e
    kron_rank: int = 2
    depth: int = 2  # layers the sequence takes part in (it keeps its last H_e afterwards)
    window: int = 32  # sliding-window self-attention
    max_len: int = 64  # longest prefix fed (the loader's max length for the type)


@dataclass(frozen=True)
class KunlunConfig:
    dim: int = 32
    layers: int = 2
    summary_tokens: int = 4
    dense_tokens: int = 2
    experts: int = 2
    expert_layers: int = 1
    wukong_rank: int = 4
    mlp_hidden: int = 64
    time_buckets: int = 24
    vocab_sizes: dict[str, int] = field(default_factory=lambda: {"surface": 7, "objective": 6, "conversion_type": 4})
    events: dict[str, EventConfig] = field(default_factory=lambda: {
        "impression": EventConfig(width=32, depth=2, window=32, max_len=64),
        "click": EventConfig(width=32, depth=2, window=16, max_len=32),
        "conversion": EventConfig(width=16, activations=("silu",), summary_tokens=2, depth=1, window=8, max_len=8),
    })

    def __post_init__(self) -> None:
        tokens = self.summary_tokens + sum(e.summary_tokens for e in self.events.values())
        if tokens % self.experts or tokens // self.experts < 2:
            raise ValueError(f"{tokens} interaction tokens must split into {self.experts} experts of >= 2 tokens")
        for name, e in self.events.items():
            if e.width % len(e.activations):
                raise ValueError(f"events.{name}: width {e.width} not divisible by {len(e.activations)} heads")
            if not 1 <= e.depth <= self.layers:
                raise ValueError(f"events.{name}: depth must be in [1, {self.layers}], got {e.depth}")

    @property
    def interaction_tokens(self) -> int:
        return self.summary_tokens + sum(e.summary_tokens for e in self.events.values())


def _default_buckets() -> dict[str, int]:
    return {"user_id": 50_000, "ad_id": 10_000, "advertiser_id": 1_000, "campaign_id": 5_000,
            "surface": 8, "objective": 8, "creative_type": 8, "position": 65}


@dataclass(frozen=True)
class EmbeddingConfig:
    dim: int = 32
    buckets: dict[str, int] = field(default_factory=_default_buckets)
    sequence_table: str = "ad_id"  # the table sequence elements' ids are looked up in


def _default_hstu_lengths() -> dict[str, int]:
    return {"impression": 64, "click": 32, "conversion": 8}


@dataclass(frozen=True)
class HSTUConfig:
    dim: int = 32
    heads: int = 2
    layers: int = 2
    mlp_hidden: int = 64
    rab_buckets: int = 12
    time_buckets: int = 24
    # Most recent events per type in the one merged sequence.
    max_len: dict[str, int] = field(default_factory=_default_hstu_lengths)

    def __post_init__(self) -> None:
        if self.dim % self.heads:
            raise ValueError(f"hstu.dim {self.dim} not divisible by {self.heads} heads")


@dataclass(frozen=True)
class HeadConfig:
    hidden: int = 64
    shared_experts: int = 2


@dataclass(frozen=True)
class ModelConfig:
    arch: str = "kunlun"
    kunlun: KunlunConfig = field(default_factory=KunlunConfig)
    hstu: HSTUConfig = field(default_factory=HSTUConfig)
    embeddings: EmbeddingConfig = field(default_factory=EmbeddingConfig)
    heads: HeadConfig = field(default_factory=HeadConfig)

    def __post_init__(self) -> None:
        if self.arch not in ARCHITECTURES:
            raise ValueError(f"model.arch must be one of {ARCHITECTURES}, got {self.arch!r}")
        body_dim = {"kunlun": self.kunlun.dim, "hstu": self.hstu.dim}[self.arch]
        if self.embeddings.dim != body_dim:
            raise ValueError(f"embeddings.dim={self.embeddings.dim} must equal {self.arch}.dim={body_dim}")

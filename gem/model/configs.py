"""Model configs: typed, validated, torch-free (gem.config embeds them; checkpoints store them).

One config type per architecture; `ModelConfig` picks the architecture and holds the parts every
architecture shares (embeddings, heads).
"""

from __future__ import annotations

from dataclasses import field, replace
from typing import Annotated, Any, Literal, Self, get_args

from pydantic import Field, model_validator
from pydantic.dataclasses import dataclass

from gem.config_types import SECTION, NonNegativeFloat, PositiveFloat, PositiveInt

Architecture = Literal["kunlun", "hstu", "interformer", "wukong", "dlrm"]
ARCHITECTURES = get_args(Architecture)
KunlunAttention = Literal["gdpa", "softmax"]
KUNLUN_ATTENTIONS = get_args(KunlunAttention)
KunlunPooling = Literal["hsp", "mean"]
KUNLUN_POOLINGS = get_args(KunlunPooling)
SequenceLayout = Literal["jagged", "padded"]
SEQUENCE_LAYOUTS = get_args(SequenceLayout)


@dataclass(frozen=True, config=SECTION)
class EventConfig:
    width: PositiveInt = 32
    activations: tuple[str, ...] = ("silu", "gelu")  # one per head
    seeds: PositiveInt = 8  # HSP seeds (overcomplete)
    summary_tokens: PositiveInt = 2  # HSP output tokens T_e
    kron_rank: PositiveInt = 2
    depth: PositiveInt = 2  # layers the sequence takes part in (it keeps its last H_e afterwards)
    window: PositiveInt = 32  # sliding-window self-attention
    max_len: PositiveInt = 64  # longest prefix fed (the loader's max length for the type)


@dataclass(frozen=True, config=SECTION)
class KunlunConfig:
    """Kunlun (arXiv 2602.10016). The last six fields are ablation switches over the paper's parts;
    their defaults are the full model, so configs and checkpoints written before them load unchanged.

    attention: "gdpa" (per-head activations, no softmax) or "softmax" (scaled_dot_product_attention
        semantics, same masks; `activations` then only sets the head count) in the personalized and
        sliding-window sequence layers and in HSP's seed attention.
    pooling: "hsp" (hierarchical seed pooling) or "mean" (each sequence's masked mean projected to the
        same T_e tokens of width dim: the interaction arch sees as many tokens either way).
    compskip: odd layers reuse the HSP output cached by the layer before (CompSkip); off, every layer
        pools afresh. On the default config off costs 512,000 more forward FLOPs per example (layer 1's
        HSP of impressions and clicks: +9.5% with the pipeline's 8 sparse ids, 210 dense inputs and
        24 tasks; gem.model.flops.kunlun_flops, checked in tests/unit/test_kunlun.py).
    sliding_window: odd layers' causal self-attention within each event's `window`; off, causal
        attention over the whole sequence (GDPA's scale 1/window becomes 1/max_len).
    event_personalization: each event type its own width, heads, seeds, summary tokens, rank, depth
        and window; off, every type takes `shared_event`'s (each keeps its own max_len, i.e. the data).
    """

    dim: PositiveInt = 32
    layers: PositiveInt = 2
    summary_tokens: PositiveInt = 4
    dense_tokens: PositiveInt = 2
    experts: PositiveInt = 2
    expert_layers: PositiveInt = 1
    wukong_rank: PositiveInt = 4
    mlp_hidden: PositiveInt = 64
    time_buckets: PositiveInt = 24
    vocab_sizes: dict[str, PositiveInt] = field(default_factory=lambda: {"surface": 7, "objective": 6, "conversion_type": 4})
    events: dict[str, EventConfig] = field(default_factory=lambda: {
        "impression": EventConfig(width=32, depth=2, window=32, max_len=64),
        "click": EventConfig(width=32, depth=2, window=16, max_len=32),
        "conversion": EventConfig(width=16, activations=("silu",), summary_tokens=2, depth=1, window=8, max_len=8),
    })
    # "jagged": each event type's sequences stay a stream of real tokens through every layer
    # (gem.model.ops.jagged_attention), so no padded position is computed. "padded": (B, L) blocks
    # under masks, the reference the jagged layout is tested against (the same outputs and gradients).
    sequence_layout: SequenceLayout = "jagged"
    # Padded layout only: the batch computed in this many groups of similar sequence lengths, each
    # padded to its own longest (gem.model.ops.length_groups).
    length_groups: PositiveInt = 1
    attention: KunlunAttention = "gdpa"
    pooling: KunlunPooling = "hsp"
    compskip: bool = True
    sliding_window: bool = True
    event_personalization: bool = True
    shared_event: str = "impression"  # whose settings every type takes when event_personalization is off

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        if self.length_groups > 1 and self.sequence_layout != "padded":
            raise ValueError("length_groups pads each group of the batch: it needs sequence_layout 'padded'")
        if not self.event_personalization and self.shared_event not in self.events:
            raise ValueError(f"shared_event {self.shared_event!r} is not an event type: {sorted(self.events)}")
        tokens = self.interaction_tokens
        if tokens % self.experts or tokens // self.experts < 2:
            raise ValueError(f"{tokens} interaction tokens must split into {self.experts} experts of >= 2 tokens")
        for name, e in self.effective_events.items():
            if e.width % len(e.activations):
                raise ValueError(f"events.{name}: width {e.width} not divisible by {len(e.activations)} heads")
            if e.depth > self.layers:
                raise ValueError(f"events.{name}: depth must be in [1, {self.layers}], got {e.depth}")
        return self

    @property
    def effective_events(self) -> dict[str, EventConfig]:
        """The per-type settings the model is built with: `events`, or with event_personalization off
        `shared_event`'s settings for every type (each keeping its own max_len)."""
        if self.event_personalization:
            return dict(self.events)
        shared = self.events[self.shared_event]
        return {name: replace(shared, max_len=e.max_len) for name, e in self.events.items()}

    @property
    def interaction_tokens(self) -> int:
        return self.summary_tokens + sum(e.summary_tokens for e in self.effective_events.values())

    def pools_afresh(self, layer: int) -> bool:
        """Whether `layer` runs HSP (or mean pooling) itself: the personalized (even) layers, or every
        layer with compskip off; the others reuse the pooled tokens cached before them."""
        return not self.compskip or self.personalized(layer)

    @staticmethod
    def personalized(layer: int) -> bool:
        """Even layers attend from the sequence to X_sum; odd layers are causal self-attention."""
        return layer % 2 == 0

    def self_attention_window(self, event: EventConfig) -> int | None:
        """The odd layers' window for one event type; None (the whole causal prefix) with
        sliding_window off."""
        return event.window if self.sliding_window else None


# Kunlun fields that choose how the same function is computed, not what it is.
COMPUTE_ONLY_FIELDS = ("sequence_layout", "length_groups")


def weights_config(model: dict[str, Any]) -> dict[str, Any]:
    """A model config (as a dict, e.g. a checkpoint's) without COMPUTE_ONLY_FIELDS: two configs equal
    here give weights that fit and mean the same in either (a model trained padded warm-starts jagged)."""
    kunlun = {k: v for k, v in (model.get("kunlun") or {}).items() if k not in COMPUTE_ONLY_FIELDS}
    return {**model, "kunlun": kunlun} if "kunlun" in model else dict(model)


EmbeddingBackend = Literal["torch", "torchrec"]
EMBEDDING_BACKENDS = get_args(EmbeddingBackend)


def _default_buckets() -> dict[str, int]:
    return {"user_id": 50_000, "ad_id": 10_000, "advertiser_id": 1_000, "campaign_id": 5_000,
            "surface": 8, "objective": 8, "creative_type": 8, "position": 65}


@dataclass(frozen=True, config=SECTION)
class EmbeddingConfig:
    dim: PositiveInt = 32
    buckets: dict[str, PositiveInt] = field(default_factory=_default_buckets)
    sequence_table: str = "ad_id"  # the table sequence elements' ids are looked up in
    # "torch": plain nn.Embedding tables (runs anywhere, e.g. a GPU machine without fbgemm);
    # "torchrec": one EmbeddingCollection on the batch's KJTs, sharded by an explicit plan in training.
    backend: EmbeddingBackend = "torch"


def _default_history_lengths() -> dict[str, int]:
    return {"impression": 64, "click": 32, "conversion": 8}


@dataclass(frozen=True, config=SECTION)
class HSTUConfig:
    dim: PositiveInt = 32
    heads: PositiveInt = 2
    layers: PositiveInt = 2
    mlp_hidden: PositiveInt = 64
    rab_buckets: PositiveInt = 12
    time_buckets: PositiveInt = 24
    # Most recent events per type in the one merged sequence.
    max_len: dict[str, PositiveInt] = field(default_factory=_default_history_lengths)

    @model_validator(mode="after")
    def _heads_split_dim(self) -> Self:
        if self.dim % self.heads:
            raise ValueError(f"hstu.dim {self.dim} not divisible by {self.heads} heads")
        return self


@dataclass(frozen=True, config=SECTION)
class InterFormerConfig:
    """InterFormer (arXiv 2411.09852): cross, interaction and sequence arches, per layer."""

    dim: PositiveInt = 32
    layers: PositiveInt = 2
    heads: PositiveInt = 2
    summary_tokens: PositiveInt = 4  # X_sum tokens (cross arch: Gate(LCE(X)))
    dense_tokens: PositiveInt = 2
    cls_tokens: PositiveInt = 4  # learnable tokens prepended to S at layer 1 (paper config: 4 CLS, 2 PMA, 2 recent)
    pma_tokens: PositiveInt = 2
    recent_tokens: PositiveInt = 2
    wukong_rank: PositiveInt = 4
    mlp_hidden: PositiveInt = 64
    time_buckets: PositiveInt = 24
    max_len: dict[str, PositiveInt] = field(default_factory=_default_history_lengths)

    @model_validator(mode="after")
    def _heads_of_even_width(self) -> Self:
        if self.dim % self.heads or (self.dim // self.heads) % 2:
            raise ValueError(f"interformer.dim {self.dim} must split into {self.heads} heads of even width (RoPE)")
        return self

    @property
    def sequence_summary_tokens(self) -> int:
        return self.cls_tokens + self.pma_tokens + self.recent_tokens


@dataclass(frozen=True, config=SECTION)
class WukongConfig:
    """Wukong (arXiv 2403.02545) alone: the interaction stack over feature tokens; each sequence
    enters as one mean-pooled token of its most recent `max_len` ids (no sequence model)."""

    dim: PositiveInt = 32
    layers: PositiveInt = 3
    rank: PositiveInt = 4
    dense_tokens: PositiveInt = 2
    mlp_hidden: PositiveInt = 64
    max_len: dict[str, PositiveInt] = field(default_factory=_default_history_lengths)


@dataclass(frozen=True, config=SECTION)
class DLRMConfig:
    """DLRM as in torchrec.models.dlrm: DenseArch MLP, pairwise dot InteractionArch, OverArch MLP.
    Sequences enter as mean-pooled bags of their most recent `max_len` ids (an EmbeddingBag each)."""

    dim: PositiveInt = 32
    dense_arch: tuple[PositiveInt, ...] = (64, 32)  # the last size must equal dim (dot products with embeddings)
    # The last size is the representation the task heads read; at least one layer.
    over_arch: Annotated[tuple[PositiveInt, ...], Field(min_length=1)] = (128, 64)
    max_len: dict[str, PositiveInt] = field(default_factory=_default_history_lengths)

    @model_validator(mode="after")
    def _dense_arch_ends_in_dim(self) -> Self:
        if not self.dense_arch or self.dense_arch[-1] != self.dim:
            raise ValueError(f"dlrm.dense_arch must end in dim={self.dim}, got {self.dense_arch}")
        return self


@dataclass(frozen=True, config=SECTION)
class HeadConfig:
    hidden: PositiveInt = 64
    # DomainExpertHeads mixes at least one shared expert.
    shared_experts: PositiveInt = 2


@dataclass(frozen=True, config=SECTION)
class HistoryCodesConfig:
    """LoopFM (arXiv 2605.29280): an autoencoder trained during pretraining that compresses the
    foundation model's representation of each example (the task heads' input, stop-gradient) to
    `code_dim` INT4 codes, kept per user as a time-ordered history a student reads
    (gem.model.history_code_autoencoder).

    enabled: pretraining trains the autoencoder beside the model (its loss never reaches the model)
        and precompute writes the codes to gold.fm_history_codes; off, LoopFM students have nothing to read.
    code_dim: codes per event; even (two per byte): code_dim / 2 bytes per event.
    prefix_lengths: Matryoshka reconstruction from the first n codes, for each n; the last is code_dim,
        so any prefix of a stored code is itself a usable, shorter code.
    hidden: width of the encoder's and the decoder's hidden layer.
    """

    enabled: bool = True
    code_dim: Annotated[int, Field(ge=2, multiple_of=2)] = 32  # two INT4 codes per byte
    prefix_lengths: tuple[PositiveInt, ...] = (8, 16, 32)
    hidden: PositiveInt = 128

    @model_validator(mode="after")
    def _prefixes_end_at_code_dim(self) -> Self:
        prefixes = self.prefix_lengths
        if not prefixes or list(prefixes) != sorted(set(prefixes)) or prefixes[0] < 1 or prefixes[-1] != self.code_dim:
            raise ValueError(f"history_codes.prefix_lengths must increase from >= 1 to code_dim={self.code_dim}, "
                             f"got {prefixes}")
        return self

    @property
    def bytes_per_event(self) -> int:
        """Packed size of one event's codes."""
        return self.code_dim // 2


@dataclass(frozen=True, config=SECTION)
class ModelConfig:
    arch: Architecture = "kunlun"
    kunlun: KunlunConfig = field(default_factory=KunlunConfig)
    hstu: HSTUConfig = field(default_factory=HSTUConfig)
    interformer: InterFormerConfig = field(default_factory=InterFormerConfig)
    wukong: WukongConfig = field(default_factory=WukongConfig)
    dlrm: DLRMConfig = field(default_factory=DLRMConfig)
    embeddings: EmbeddingConfig = field(default_factory=EmbeddingConfig)
    heads: HeadConfig = field(default_factory=HeadConfig)
    history_codes: HistoryCodesConfig = field(default_factory=HistoryCodesConfig)

    @model_validator(mode="after")
    def _embeddings_fit_the_body(self) -> Self:
        body_dim = self.body_config().dim
        if self.embeddings.dim != body_dim:
            raise ValueError(f"embeddings.dim={self.embeddings.dim} must equal {self.arch}.dim={body_dim}")
        return self

    def body_config(self) -> KunlunConfig | HSTUConfig | InterFormerConfig | WukongConfig | DLRMConfig:
        """The config of the architecture `arch` selects."""
        return getattr(self, self.arch)

    def sequence_lengths(self) -> dict[str, int]:
        """Event type -> how many of the most recent events the selected architecture reads."""
        body = self.body_config()
        if isinstance(body, KunlunConfig):
            return {e: c.max_len for e, c in body.effective_events.items()}
        return dict(body.max_len)


# A student variant is the set of foundation-model signals it learns from:
#   aux_head       ExFM auxiliary distillation head on the FM's logged predictions
#   adapter        ExFM student adapter: its fresh-label correction of the FM is a second target
#   history_codes  LoopFM: the user's past FM codes as a sequence feature
STUDENT_VARIANTS: dict[str, tuple[str, ...]] = {
    "baseline": (),
    "kd": ("aux_head",),
    "kd_adapter": ("aux_head", "adapter"),
    "kd_loopfm": ("aux_head", "history_codes"),
    "kd_adapter_loopfm": ("aux_head", "adapter", "history_codes"),
}
StudentVariant = Literal[tuple(STUDENT_VARIANTS)]


@dataclass(frozen=True, config=SECTION)
class DistillationConfig:
    """ExFM (arXiv 2502.17494) knowledge distillation from the foundation model's logged predictions.

    The serving head learns from true labels only. A separate distillation head on the same body
    learns weight * BCE(y_d, alpha * y_FM); the body receives beta times that loss's gradient
    (gem.model.ops.grad_scale). With the adapter on, a small MLP on y_FM learns the fresh labels and
    the distillation head also learns adapter_weight * BCE(y_d, stop_gradient(adapter(y_FM))).
    The defaults are starting values, to be chosen on the validation day.
    """

    # In (0, 1]: alpha * y_FM is a probability.
    alpha: Annotated[float, Field(gt=0.0, le=1.0)] = 1.0
    beta: NonNegativeFloat = 0.5
    weight: NonNegativeFloat = 1.0
    adapter_hidden: PositiveInt = 16
    adapter_weight: NonNegativeFloat = 1.0


@dataclass(frozen=True, config=SECTION)
class HistoryCodeFeatureConfig:
    """The student's LoopFM feature: of the user's coded events strictly before the example, the most
    recent `max_codes` within `max_age_days`, pooled by mean and by target attention
    (gem.model.history_code_feature)."""

    max_codes: PositiveInt = 200
    max_age_days: PositiveFloat = 30.0
    time_buckets: PositiveInt = 24


def _student_buckets() -> dict[str, int]:
    return {"user_id": 20_000, "ad_id": 5_000, "advertiser_id": 500, "campaign_id": 2_000,
            "surface": 8, "objective": 8, "creative_type": 8, "position": 65}


@dataclass(frozen=True, config=SECTION)
class StudentConfig:
    """A per-surface serving model (gem.model.student): a DLRM body over the surface's sparse ids,
    counters and short sequences, with the FM signals its `variant` names (STUDENT_VARIANTS)."""

    variant: StudentVariant = "kd_loopfm"
    dlrm: DLRMConfig = field(default_factory=lambda: DLRMConfig(
        dim=16, dense_arch=(64, 16), over_arch=(64, 32), max_len={"impression": 16, "click": 8, "conversion": 4}))
    embeddings: EmbeddingConfig = field(default_factory=lambda: EmbeddingConfig(dim=16, buckets=_student_buckets()))
    heads: HeadConfig = field(default_factory=lambda: HeadConfig(hidden=32, shared_experts=1))
    distillation: DistillationConfig = field(default_factory=DistillationConfig)
    history_codes: HistoryCodeFeatureConfig = field(default_factory=HistoryCodeFeatureConfig)

    @model_validator(mode="after")
    def _embeddings_fit_the_body(self) -> Self:
        if self.embeddings.dim != self.dlrm.dim:
            raise ValueError(f"student.embeddings.dim={self.embeddings.dim} must equal student.dlrm.dim={self.dlrm.dim}")
        return self

    def uses(self, signal: str) -> bool:
        """Whether the variant learns from `signal`: "aux_head", "adapter" or "history_codes"."""
        return signal in STUDENT_VARIANTS[self.variant]

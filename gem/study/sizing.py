"""Matched compute: each architecture's config sized to a target forward FLOPs per example.

FLOPs per example come from gem.model.flops.model_flops (the same count the rest of the project
uses). Each architecture has one family of shapes (`family`): width `dim` (embeddings included,
as ModelConfig requires), its default depth, and one hidden size `hidden` for its MLPs and the task
heads. `size_to` searches every admissible width and, per width, the hidden size by bisection (FLOPs
grow monotonically with it), and keeps the shape within `tolerance` of the target whose hidden/width
ratio is closest to `HIDDEN_RATIO` (a balanced shape, not a width-1 MLP or a huge one).

Example:
    >>> shape = size_to("kunlun", 2e6, SizingContext(lengths={"impression": 32, "click": 16, "conversion": 4},
    ...                 tasks=24, surfaces=6, buckets={"user_id": 512, "ad_id": 64, "surface": 8, "position": 32}))
    >>> abs(shape.flops / 2e6 - 1) <= 0.1
    True
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from gem.model.configs import (
    DLRMConfig,
    EmbeddingConfig,
    EventConfig,
    HeadConfig,
    HSTUConfig,
    InterFormerConfig,
    KunlunConfig,
    ModelConfig,
    WukongConfig,
)
from gem.model.flops import model_flops
from gem.study.traffic import DENSE_DIM, SPARSE

HIDDEN_RATIO = 2.0  # preferred hidden / width
WIDTHS = tuple(range(8, 257, 4))  # multiples of 4: InterFormer's 2 heads need an even head width
DEPTH = {"kunlun": 2, "hstu": 2, "interformer": 2, "wukong": 3, "dlrm": 2}
# Sliding windows of Kunlun's self-attention layers per event type (capped at the type's length).
WINDOWS = {"impression": 16, "click": 8, "conversion": 4}


@dataclass(frozen=True)
class SizingContext:
    """What FLOPs depend on besides the shape: sequence lengths, task count, id tables."""

    lengths: dict[str, int]  # event type -> max_len, the same for every architecture
    tasks: int
    surfaces: int
    buckets: dict[str, int]
    backend: str = "torch"
    kunlun_switches: dict[str, Any] = field(default_factory=dict)  # ablation switches set on KunlunConfig


@dataclass(frozen=True)
class Shape:
    arch: str
    dim: int
    hidden: int
    flops: int
    config: ModelConfig

    def describe(self) -> str:
        return f"dim {self.dim}, hidden {self.hidden}, depth {DEPTH[self.arch]}"


def kunlun_switch_names() -> tuple[str, ...]:
    """The ablation switches KunlunConfig has in this checkout (empty before they exist)."""
    wanted = ("attention", "pooling", "compskip", "sliding_window", "event_personalization")
    have = {f.name for f in dataclasses.fields(KunlunConfig)}
    return tuple(n for n in wanted if n in have)


def family(arch: str, dim: int, hidden: int, ctx: SizingContext) -> ModelConfig:
    """The config of `arch` at width `dim` and hidden size `hidden` (depth: DEPTH[arch])."""
    lengths = dict(ctx.lengths)
    depth = DEPTH[arch]
    bodies: dict[str, Any] = {}
    if arch == "kunlun":
        events = {
            "impression": EventConfig(width=dim, depth=depth, window=min(WINDOWS["impression"], lengths["impression"]),
                                      max_len=lengths["impression"]),
            "click": EventConfig(width=dim, depth=depth, window=min(WINDOWS["click"], lengths["click"]),
                                 max_len=lengths["click"]),
            "conversion": EventConfig(width=max(4, dim // 2), activations=("silu",), depth=1,
                                      window=min(WINDOWS["conversion"], lengths["conversion"]),
                                      max_len=lengths["conversion"]),
        }
        bodies["kunlun"] = KunlunConfig(dim=dim, layers=depth, mlp_hidden=hidden, events=events, **ctx.kunlun_switches)
    elif arch == "hstu":
        bodies["hstu"] = HSTUConfig(dim=dim, layers=depth, mlp_hidden=hidden, max_len=lengths)
    elif arch == "interformer":
        bodies["interformer"] = InterFormerConfig(dim=dim, layers=depth, mlp_hidden=hidden, max_len=lengths)
    elif arch == "wukong":
        bodies["wukong"] = WukongConfig(dim=dim, layers=depth, mlp_hidden=hidden, max_len=lengths)
    elif arch == "dlrm":
        bodies["dlrm"] = DLRMConfig(dim=dim, dense_arch=(hidden, dim), over_arch=(2 * hidden, hidden), max_len=lengths)
    else:
        raise ValueError(f"unknown arch {arch!r}")
    return ModelConfig(arch=arch, **bodies, embeddings=EmbeddingConfig(dim=dim, buckets=dict(ctx.buckets),
                                                                        backend=ctx.backend),
                       heads=HeadConfig(hidden=hidden, shared_experts=2))


def flops_of(cfg: ModelConfig, ctx: SizingContext) -> int:
    """Forward FLOPs per example of a config in this study's setting."""
    return int(model_flops(cfg, len(SPARSE), DENSE_DIM, ctx.tasks, ctx.surfaces)["total"])


def _closest_hidden(arch: str, dim: int, target: float, ctx: SizingContext) -> tuple[int, int]:
    """(hidden, flops) with flops closest to target, hidden in [4, 16 * dim] (bisection: monotone)."""
    lo, hi = 4, 16 * dim
    if flops_of(family(arch, dim, lo, ctx), ctx) >= target:
        return lo, flops_of(family(arch, dim, lo, ctx), ctx)
    if flops_of(family(arch, dim, hi, ctx), ctx) <= target:
        return hi, flops_of(family(arch, dim, hi, ctx), ctx)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if flops_of(family(arch, dim, mid, ctx), ctx) < target:
            lo = mid
        else:
            hi = mid
    candidates = [(h, flops_of(family(arch, dim, h, ctx), ctx)) for h in (lo, hi)]
    return min(candidates, key=lambda c: abs(c[1] - target))


def size_to(arch: str, target: float, ctx: SizingContext, tolerance: float = 0.05) -> Shape:
    """The shape of `arch` with forward FLOPs per example within `tolerance` of `target` and the most
    balanced hidden/width ratio; ValueError when no width reaches it."""
    best: Shape | None = None
    for dim in WIDTHS:
        try:
            hidden, flops = _closest_hidden(arch, dim, target, ctx)
        except ValueError:  # a width this architecture's config rejects
            continue
        if abs(flops / target - 1) > tolerance:
            continue
        shape = Shape(arch, dim, hidden, flops, family(arch, dim, hidden, ctx))
        if best is None or abs(math.log(hidden / dim / HIDDEN_RATIO)) < abs(math.log(best.hidden / best.dim / HIDDEN_RATIO)):
            best = shape
    if best is None:
        raise ValueError(f"{arch}: no shape within {tolerance:.0%} of {target:.3g} FLOPs per example "
                         f"(widths {WIDTHS[0]}..{WIDTHS[-1]})")
    return best

"""What one precompute day computes, decided once by the driver before any task starts.

Model refresh: a day is a refresh day when no precompute ran in the precompute.model_refresh_days
before it, or its pinned model was pinned that many days ago or more. A refresh pins the newest
model promoted for ds or an earlier day (gem.train.promotion.as_of) and recomputes every user with a
sequence snapshot; any other day keeps the pinned model (so every valid embedding of a day comes from
one model) and recomputes only the users whose snapshot changed since the last precompute day: the
users with a silver.user_sequences row in (last precompute day, ds]. The others carry forward: their
rows stay where they are (gold.fm_user_embeddings is read as "latest row with ds' <= ds",
gem.precompute.read). The user representation reads only the user's sequences and id
(Kunlun.user_representation); the dense counters, which change for everyone every day, are not an
input of it, so a counter change alone recomputes nobody.

The plan travels to the executors inside the Spark tasks (gem.precompute.executors): it holds the
full config and every input's pinned version, so a task needs nothing else to compute its shard.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from gem.config import GemConfig, load_config
from gem.data.delta_log import read_table
from gem.days import shift_day
from gem.lakehouse import completions, stages
from gem.precompute.model import ModelPin, PromotedModelMissing
from gem.train import checkpoint, promotion
from gem.train.daily import checkpoint_root
from schemas.precompute import GOLD_PRECOMPUTE_STATS

STAGE = "precompute"


@dataclass(frozen=True)
class TableAt:
    """A Delta table read at a pinned version."""

    path: str
    version: int


@dataclass(frozen=True)
class DayPlan:
    ds: str
    run_id: str
    shards: int
    model: ModelPin
    refreshed: bool
    since_ds: str | None  # None on a refresh: every user; else users with sequences in (since_ds, ds]
    sequence_days: tuple[str, ...]  # the silver.user_sequences partitions to read, oldest first
    examples_ds: str | None  # the held-out example day whose impressions get predictions
    sequences: TableAt
    user_features: TableAt
    ad_features: TableAt
    examples: TableAt | None
    popular_ads: tuple[str, ...]
    input_versions: dict[str, int]
    config: dict[str, Any]

    @cached_property
    def cfg(self) -> GemConfig:
        return load_config(overrides=self.config, environ={})


@dataclass(frozen=True)
class PreviousDay:
    """The last precompute day before ds within the refresh period, from its gold.precompute_stats row."""

    ds: str
    pin: ModelPin


def previous_day(cfg: GemConfig, ds: str, promoted_tasks: dict[str, tuple[str, ...]]) -> PreviousDay | None:
    """The newest precompute record of the model_refresh_days before ds, with its pinned model;
    None when there is none (ds is then a refresh day). promoted_tasks: mix day -> the tasks its
    promotion lists."""
    for back in range(1, cfg.precompute.model_refresh_days + 1):
        day = shift_day(ds, -back)
        if day < cfg.start_ds:
            return None
        record = completions.completion(cfg, STAGE, day)
        if record is None:
            continue
        version = record["table_versions"][GOLD_PRECOMPUTE_STATS.name]
        (row,) = read_table(GOLD_PRECOMPUTE_STATS.path(cfg.lakehouse_uri), version, where={"ds": day}).to_pylist()
        model_ds = row["model_ds"].isoformat()
        pin = ModelPin(row["model_checkpoint"], row["model_version"], model_ds, row["refresh_ds"].isoformat(),
                       promoted_tasks.get(model_ds, ()))
        return PreviousDay(day, pin)
    return None


def choose_model(cfg: GemConfig, ds: str) -> tuple[ModelPin, PreviousDay | None]:
    """(the model ds runs, the previous precompute day); a refresh pin when the period is over.
    PromotedModelMissing when a refresh finds no promoted model."""
    root, arch = checkpoint_root(cfg), cfg.model.arch
    promoted = promotion.promotions(root, arch)
    previous = previous_day(cfg, ds, {p.mix_ds: p.tasks for p in promoted})
    days_since_refresh = None if previous is None else (
        dt.date.fromisoformat(ds) - dt.date.fromisoformat(previous.pin.refresh_ds)).days
    if previous is not None and days_since_refresh < cfg.precompute.model_refresh_days:
        if not previous.pin.tasks:
            raise PromotedModelMissing(f"precompute ds={ds}: the pinned model {previous.pin.version} has no promotion "
                                       f"listing its tasks any more; rerun `python -m jobs.pretrain --ds "
                                       f"{previous.pin.model_ds}`")
        return previous.pin, previous
    promo = promotion.as_of(root, arch, ds)
    if promo is None:
        raise PromotedModelMissing(
            f"precompute ds={ds}: no {arch} model is promoted for {ds} or an earlier day under "
            f"{checkpoint.child(checkpoint.child(root, 'promoted'), arch)}; pretraining must promote one first: "
            f"`python -m jobs.pretrain --ds {ds}`")
    if not promo.tasks:
        raise PromotedModelMissing(f"precompute ds={ds}: the promotion of {promo.version} lists no tasks (promoted "
                                   f"before they were recorded); rerun `python -m jobs.pretrain --ds {promo.mix_ds}`")
    return ModelPin(str(promo.checkpoint), promo.version, promo.mix_ds, ds, promo.tasks), previous


def sequence_days(cfg: GemConfig, ds: str, since_ds: str | None, present: set[str]) -> tuple[str, ...]:
    """The silver.user_sequences partitions a day reads: all up to ds on a refresh, else (since_ds, ds]."""
    first = cfg.start_ds if since_ds is None else shift_day(since_ds, 1)
    return tuple(sorted(d for d in present if first <= d <= ds))


def examples_day(cfg: GemConfig, ds: str) -> str | None:
    """The held-out example day of ds's mixture, whose impressions get predictions."""
    (day,) = stages.held_out_day(cfg, ds) or [None]
    return day

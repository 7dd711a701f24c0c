"""No leakage: a student never reads, for day D, an FM output computed by a model trained on D or later.

Precompute writes gold.fm_predictions and gold.fm_history_codes of example day D (the held-out day of
its run) with the model it pinned; gold.precompute_stats names that model's mixture day, and the
model's promotion records `trained_through`, the newest example day it or any model it warm-started
from trained on (gem.train.promotion). So for each day D whose FM outputs a student reads:

    trained_through(model that wrote D's outputs) < D

`fm_models_by_day` finds that model per day; `check` raises LeakageError for any day that breaks the
rule or cannot show it (a promotion without trained_through), naming the day and the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gem.data.delta_log import read_table
from gem.lakehouse import tables
from gem.precompute.plan import examples_day
from gem.train import promotion
from gem.train.daily import checkpoint_root
from schemas.precompute import GOLD_PRECOMPUTE_STATS

if TYPE_CHECKING:
    from gem.config import GemConfig


class LeakageError(RuntimeError):
    """An FM output a student would read was computed by a model that trained on that day or later."""


@dataclass(frozen=True)
class FmModel:
    """The foundation model whose outputs a day holds."""

    day: str  # the example day of the outputs
    precompute_ds: str  # the precompute run that wrote them
    version: str
    model_ds: str
    trained_through: str | None


def fm_models_by_day(cfg: GemConfig, stats_version: int) -> dict[str, FmModel]:
    """Example day -> the FM that wrote its predictions and codes, from gold.precompute_stats at
    `stats_version` and the architecture's promotions."""
    stats = read_table(tables.table_path(cfg, GOLD_PRECOMPUTE_STATS), stats_version,
                       columns=["ds", "model_version", "model_ds"]).to_pylist()
    root = checkpoint_root(cfg)
    promoted = {p.mix_ds: p for p in promotion.promotions(root, cfg.model.arch)}
    out = {}
    for row in stats:
        ds, model_ds = row["ds"].isoformat(), row["model_ds"].isoformat()
        day = examples_day(cfg, ds)
        if day is None:
            continue
        found = promoted.get(model_ds)
        out[day] = FmModel(day, ds, row["model_version"], model_ds, found.trained_through if found else None)
    return out


def check(models: dict[str, FmModel], days: list[str]) -> dict[str, FmModel]:
    """The FM of each of `days`, once each is shown to precede it; LeakageError otherwise."""
    for day in days:
        model = models.get(day)
        if model is None:
            raise LeakageError(f"no precompute record names the model that wrote the FM outputs of {day}")
        if model.trained_through is None:
            raise LeakageError(f"FM outputs of {day} come from {model.version}, whose promotion does not say "
                               f"which days it trained on; rerun its pretraining (jobs.pretrain --ds {model.model_ds})")
        if model.trained_through >= day:
            raise LeakageError(f"FM outputs of {day} come from {model.version}, trained through "
                               f"{model.trained_through}: a student of {day} would learn from a model that saw it")
    return {d: models[d] for d in days}

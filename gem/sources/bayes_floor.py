"""The generator's Bayes floor: the NE its own true probabilities score on a day's impressions.

No model can beat the world's true probabilities on average, so every model's held-out NE is read
against this floor, per task (surface x label type), computed with the labels the simulation drew:

- click: p = sigmoid(click logit) of the impression (gem.sources.simulation.click_logit), label =
  the impression was clicked;
- conversion of type t: p = p_click * sigmoid(conversion logit) * P(the conversion arrives by the
  end of the impression's day + attribution_window_days | the click's time) for ads whose objective
  converts as t (0 for the others); label = the click converted and the conversion arrived in
  that window (what last-click attribution labels; a user clicking one ad twice within the
  window, whose conversion goes to the later click, is the rare case where the two differ).

NE = mean log loss / entropy of the task's positive rate, as gem.model.metrics.ne computes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from gem.lakehouse.landing import completed_manifest
from gem.sources.simulation import ChunkEvents
from gem.sources.world import CONVERSION_DELAY_BETA, CONVERSION_MAX_DELAY_DAYS, DAY_MS, OBJECTIVE_CONVERSION_TYPE, World
from schemas.tasks import CONVERSION_TYPES, OBJECTIVES, pooled_groups

CONVERTS_AS = np.array([OBJECTIVE_CONVERSION_TYPE[o] for o in OBJECTIVES])  # objective index -> conversion type

EPS = 1e-7  # as gem.model.metrics clamps predictions
# The conversion delay's CDF, from a fixed sample: numpy has no Beta CDF, and a seeded grid of
# quantiles keeps the floor deterministic.
_DELAY_QUANTILES = np.sort(np.random.default_rng(0).beta(*CONVERSION_DELAY_BETA, size=200_000))


def delay_cdf(fraction_of_max_delay: np.ndarray) -> np.ndarray:
    """P(conversion delay <= x * CONVERSION_MAX_DELAY_DAYS) for each x."""
    return np.searchsorted(_DELAY_QUANTILES, fraction_of_max_delay, side="right") / len(_DELAY_QUANTILES)


def _log_loss_sum(p: np.ndarray, y: np.ndarray) -> float:
    p = np.clip(p, EPS, 1 - EPS)
    return float(-(y * np.log(p) + (1 - y) * np.log(1 - p)).sum())


@dataclass
class FloorAccumulator:
    """Sums of log loss, examples and positives per task over a day's chunks."""

    window_end_ms: int  # end of the impression day + attribution_window_days, epoch ms
    sums: dict[str, list[float]] = field(default_factory=dict)  # task -> [log loss, examples, positives]

    def _add(self, task: str, p: np.ndarray, y: np.ndarray) -> None:
        s = self.sums.setdefault(task, [0.0, 0.0, 0.0])
        s[0] += _log_loss_sum(p, y)
        s[1] += len(y)
        s[2] += float(y.sum())

    def add_chunk(self, world: World, chunk: ChunkEvents) -> None:
        """Add one chunk's impressions (chunk.p_click and chunk.p_convert: their true click and
        conversion-given-click probabilities)."""
        n = len(chunk.user)
        clicked_rows = np.flatnonzero(chunk.clicked)  # (clicks,)
        converted_rows = clicked_rows[chunk.converted]  # (conversions,)
        conversion_label = np.zeros(n, dtype=bool)
        conversion_label[converted_rows] = chunk.conversion_time < self.window_end_ms
        # The click follows its impression by minutes; the window is days: P(arrival in the window)
        # is taken at the impression's time.
        room = (self.window_end_ms - chunk.impression_time) / (CONVERSION_MAX_DELAY_DAYS * DAY_MS)  # (n,)
        p_conversion = chunk.p_click * chunk.p_convert * delay_cdf(room)  # (n,)
        converts_as = CONVERTS_AS[world.ad_objective[chunk.ad]]  # (n,) conversion type of each ad
        for s_index, s_name in enumerate(world.surfaces):
            on = chunk.surface == s_index
            self._add(f"{s_name}/click", chunk.p_click[on], chunk.clicked[on].astype(np.float64))
            for conversion_type in CONVERSION_TYPES:
                mine = converts_as[on] == conversion_type
                self._add(f"{s_name}/{conversion_type}", np.where(mine, p_conversion[on], 0.0),
                          (conversion_label[on] & mine).astype(np.float64))

    def result(self) -> dict[str, dict[str, float]]:
        """task -> {"examples", "positives", "log_loss", "ne"} (ne None for a task without positives)."""
        return {task: {"examples": int(n), "positives": int(pos), "log_loss": float(loss), "ne": sums_ne(loss, n, pos)}
                for task, (loss, n, pos) in sorted(self.sums.items())}


def sums_ne(loss: float, n: float, pos: float) -> float | None:
    """NE of summed log loss over n examples with pos positives (None without a positive)."""
    rate = min(max(pos / n, EPS), 1 - EPS) if n else 0.0
    entropy = -(rate * np.log(rate) + (1 - rate) * np.log(1 - rate)) if n else 0.0
    return float(loss / n / entropy) if n and pos else None


def reported_floor(landing_root: str, ds: str, tasks: Sequence[str] = ()) -> dict[str, float | None] | None:
    """The floor per task the generator recorded in ds's landing manifest (None for a day it did not
    generate, e.g. imported data), and each label type pooled over `tasks` of two or more surfaces,
    as "all/<label type>" (schemas.tasks.pooled_groups): the same tasks a model's pooled NE covers."""
    manifest = completed_manifest(landing_root, ds) or {}
    if "bayes_floor" not in manifest:
        return None
    recorded = manifest["bayes_floor"]
    out = {task: f["ne"] for task, f in recorded.items()}
    for name, members in pooled_groups(list(tasks)).items():
        if all("log_loss" in recorded.get(t, {}) for t in members):  # older manifests hold no sums
            sums = [sum(recorded[t][k] for t in members) for k in ("log_loss", "examples", "positives")]
            out[name] = sums_ne(*sums)
    return out

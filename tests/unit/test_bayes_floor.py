"""gem.sources.bayes_floor: the NE of the world's true probabilities, per task, on a generated day."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from gem.model import metrics
from gem.sources.bayes_floor import FloorAccumulator, delay_cdf, reported_floor, sums_ne
from gem.sources.engagement import EngagementState
from gem.sources.simulation import simulate_chunk
from gem.sources.synthetic_day import generate_day
from gem.sources.world import DAY_MS, build_world
from schemas.tasks import LABEL_TYPES
from tests.support import make_config

GEN = {"users": 800, "ads": 300, "advertisers": 30, "events_per_day": 20_000, "chunk_impressions": 7_000}


def test_the_floor_counts_every_impression_and_click_of_the_day(tmp_path):
    cfg = make_config(tmp_path, generator=GEN)
    manifest = generate_day(cfg, "2026-01-01")
    floor = manifest["bayes_floor"]
    clicks = {t: f for t, f in floor.items() if t.endswith("/click")}
    assert {t.split("/")[0] for t in clicks} == set(cfg.surfaces)
    assert sum(f["examples"] for f in clicks.values()) == manifest["events"]["impression"]
    assert sum(f["positives"] for f in clicks.values()) == manifest["events"]["click"]
    converted = sum(f["positives"] for t, f in floor.items() if not t.endswith("/click"))
    assert 0 < converted <= manifest["events"]["conversion"]  # those arriving within the attribution window
    # The world carries click signal: its own probabilities beat the base rate on every surface.
    assert all(0 < f["ne"] < 1 for f in clicks.values()), clicks
    # Each label type pooled over the tasks a model reads: every surface, or a subset.
    pooled = reported_floor(cfg.landing_root, "2026-01-01", list(floor))
    click = [t for t in floor if t.endswith("/click")]
    loss, n, pos = (sum(floor[t][k] for t in click) for k in ("log_loss", "examples", "positives"))
    assert pooled["all/click"] == pytest.approx(sums_ne(loss, n, pos)) and n == manifest["events"]["impression"]
    two = reported_floor(cfg.landing_root, "2026-01-01", ["reels/click", "fb_feed/click", "reels/lead"])
    loss, n, pos = (sum(floor[t][k] for t in ("reels/click", "fb_feed/click")) for k in ("log_loss", "examples", "positives"))
    assert two["all/click"] == pytest.approx(sums_ne(loss, n, pos)) and "all/lead" not in two


def test_the_floor_is_gem_model_metrics_ne_of_the_true_probabilities(tmp_path):
    """Cross-checked against the NE the models are scored with, on one simulated chunk."""
    cfg = make_config(tmp_path, generator=GEN)
    world = build_world(cfg)
    state = EngagementState.fresh(world)
    rng = np.random.default_rng(3)
    times = np.sort(rng.integers(0, DAY_MS, size=5_000)).astype(np.int64)
    chunk = simulate_chunk(world, state, 1.0, rng, times, 0, 8 * DAY_MS)
    acc = FloorAccumulator(window_end_ms=2 * DAY_MS)
    acc.add_chunk(world, chunk)
    result = acc.result()
    on = chunk.surface == world.surfaces.index("fb_feed")
    p, y = torch.tensor(chunk.p_click[on]), torch.tensor(chunk.clicked[on], dtype=torch.float64)
    expected = float(metrics.ne(p, y, torch.ones_like(p)))
    assert abs(result["fb_feed/click"]["ne"] - expected) < 1e-9
    # Pooled over every surface from the recorded sums, as the held-out tables pool a model's pairs.
    p, y = torch.tensor(chunk.p_click), torch.tensor(chunk.clicked, dtype=torch.float64)
    click = [f for t, f in result.items() if t.endswith("/click")]
    pooled = sums_ne(*(sum(f[k] for f in click) for k in ("log_loss", "examples", "positives")))
    assert abs(pooled - float(metrics.ne(p, y, torch.ones_like(p)))) < 1e-9
    assert {t.split("/")[1] for t in result} == set(LABEL_TYPES)


def test_delay_cdf_is_a_cdf():
    x = np.linspace(-0.5, 1.5, 41)
    cdf = delay_cdf(x)
    assert cdf[0] == 0 and cdf[-1] == 1 and np.all(np.diff(cdf) >= 0)
    assert 0.5 < delay_cdf(np.array([0.2]))[0] < 0.95  # Beta(0.5, 4): most conversions come early

"""Batches straight from the event generator's world (jobs.generate_events), without Spark, for
the learning tests: the same users, ads, click model and recent-engagement history that the
landing files come from, but at a size where every architecture trains in seconds on a CPU.

days of traffic are simulated in time-ordered chunks exactly as `_simulate_day` does (the clicked-ad
history decays and grows chunk by chunk); each impression becomes one example of its surface's click
task, with the user's impressions and clicks STRICTLY BEFORE its time as sequences (most recent
`max_len`), as the loader cuts them from a snapshot. Only the click label is used: conversions are
too rare at this size to measure.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import numpy as np
import torch

from gem.config import load_config
from gem.data.batch import Batch, Jagged, Sparse
from gem.sources.engagement import EngagementState
from gem.sources.simulation import day_start_ms, simulate_day
from gem.sources.world import DAY_MS, build_world

SPARSE = ("user_id", "ad_id", "surface", "position")
DENSE_DIM = 2
CHUNK = 2_000


@dataclass
class Traffic:
    time_ms: np.ndarray  # (n,) int64, sorted
    user: np.ndarray
    ad: np.ndarray
    surface: np.ndarray
    position: np.ndarray
    clicked: np.ndarray  # (n,) bool
    click_time_ms: np.ndarray  # (n,) int64, meaningful where clicked
    day: np.ndarray  # (n,) int64, 0-based
    objective: np.ndarray  # (ads,) objective index per ad
    surfaces: tuple[str, ...]


def simulate(days: int, impressions_per_day: int, users: int, ads: int, seed: int = 7,
             history_weight: float | None = None) -> Traffic:
    generator = {"users": users, "ads": ads, "advertisers": max(2, ads // 10), "seed": seed,
                 "events_per_day": impressions_per_day, "chunk_impressions": CHUNK}
    if history_weight is not None:
        generator["history_weight"] = history_weight
    cfg = load_config(overrides={"generator": generator}, environ={})
    world = build_world(cfg)
    state = EngagementState.fresh(world)
    parts = []
    for day in range(days):
        ds = (dt.date.fromisoformat(cfg.start_ds) + dt.timedelta(days=day)).isoformat()
        origin = day_start_ms(cfg.start_ds)
        for chunk in simulate_day(cfg, world, state, ds, day_start_ms(ds) + 30 * DAY_MS):
            n = len(chunk.user)
            click_time = np.zeros(n, dtype=np.int64)
            click_time[chunk.clicked] = chunk.click_time - origin
            parts.append((chunk.impression_time - origin, chunk.user, chunk.ad, chunk.surface, chunk.position,
                          chunk.clicked, click_time, np.full(n, day)))
    cols = [np.concatenate(c) for c in zip(*parts, strict=True)]
    return Traffic(*cols, objective=world.ad_objective, surfaces=world.surfaces)


class _History:
    """One event type's events sorted by (user, time), for "the user's last n events before t" queries."""

    def __init__(self, owner: np.ndarray, times: np.ndarray) -> None:
        self.order = np.lexsort((times, owner))
        self.user = owner[self.order]
        self.key = self.user.astype(np.float64) * 1e14 + times[self.order]

    def before(self, user: np.ndarray, time_ms: np.ndarray, max_len: int) -> tuple[np.ndarray, np.ndarray]:
        """Per query, indices of the user's last `max_len` events strictly before time_ms, oldest
        first -> (flat indices into the unsorted events, offsets (B+1,))."""
        block_start = np.searchsorted(self.user, user, side="left")
        end = np.searchsorted(self.key, user.astype(np.float64) * 1e14 + time_ms, side="left")  # strictly before
        begin = np.maximum(block_start, end - max_len)
        flat = [self.order[b:e] for b, e in zip(begin, end, strict=True)]
        flat_idx = np.concatenate(flat) if flat else np.zeros(0, dtype=np.int64)
        return flat_idx.astype(np.int64), np.concatenate([[0], np.cumsum(end - begin)]).astype(np.int64)


def batches(t: Traffic, days: tuple[int, ...], batch_size: int, max_len: dict[str, int], sequences: bool = True,
            seed: int = 0, shuffle: bool = True) -> list[Batch]:
    """Examples of the given days (every impression, its surface's click task), as Batches."""
    rows = np.flatnonzero(np.isin(t.day, days))
    if shuffle:
        rows = np.random.default_rng(seed).permutation(rows)
    tasks = tuple(f"{s}/click" for s in t.surfaces)
    clicks = np.flatnonzero(t.clicked)
    events = {  # event type -> (index into the impressions, event time)
        "impression": (np.arange(len(t.user)), t.time_ms),
        "click": (clicks, t.click_time_ms[clicks]),
        "conversion": (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)),
    }
    history = {e: _History(t.user[idx], times) for e, (idx, times) in events.items()}
    out = []
    for lo in range(0, len(rows), batch_size):
        r = rows[lo: lo + batch_size]
        b = len(r)
        seqs = {}
        for event, (owner_idx, event_time) in events.items():
            n_max = max_len[event] if sequences else 0
            flat, offsets = history[event].before(t.user[r], t.time_ms[r], n_max)
            src = owner_idx[flat]
            gap = (np.repeat(t.time_ms[r], np.diff(offsets)) - event_time[flat]) / 1000.0
            seqs[event] = Jagged({"ad_id": torch.from_numpy(t.ad[src]),
                                  "surface": torch.from_numpy(t.surface[src] + 1),
                                  "objective": torch.from_numpy(t.objective[t.ad[src]] + 1),
                                  "gap_s": torch.from_numpy(gap.astype(np.float32))}, torch.from_numpy(offsets))
        mask = torch.zeros(b, len(tasks), dtype=torch.bool)
        mask[torch.arange(b), torch.from_numpy(t.surface[r])] = True
        labels = mask.float() * torch.from_numpy(t.clicked[r]).float()[:, None]
        ones = torch.ones(b, dtype=torch.int32)
        out.append(Batch(
            dense=torch.from_numpy(np.stack([t.position[r] / 10.0, np.ones(b)], 1).astype(np.float32)),
            sparse={"user_id": Sparse(torch.from_numpy(t.user[r]), ones), "ad_id": Sparse(torch.from_numpy(t.ad[r]), ones),
                    "surface": Sparse(torch.from_numpy(t.surface[r] + 1), ones),
                    "position": Sparse(torch.from_numpy(t.position[r] + 1), ones)},
            sequences=seqs, labels=labels, label_mask=mask, weights=mask.float(), tasks=tasks,
            impression_times=torch.from_numpy(t.time_ms[r] * 1000),
        ))
    return out

"""Batches straight from the event generator's world (jobs.generate_events), without Spark: the same
users, ads, click and conversion model and recent-engagement history that the landing files come
from, at a size where every architecture trains in seconds to minutes on a CPU.

Days are simulated by the generator's own day loop (gem.sources.simulation.simulate_day: the users'
engagement, fatigue and interest move chunk by chunk and day by day). Every task is (surface, label type) (schemas.tasks). An impression
is an example of its surface's click task and of the conversion task its ad's objective produces
(gem.sources.world.OBJECTIVE_CONVERSION_TYPE); the conversion label is 1 when the impression was
clicked and that click converted (ChunkEvents.converted: conversions up to 7 days later, i.e. the
whole attribution window). Sequences are the user's impressions, clicks and conversions STRICTLY
BEFORE the impression's time (most recent `max_len` of each), as the loader cuts them from a
snapshot.

Training examples are drawn per task as the real loader does (gem.data.loader): positives always,
negatives with probability `negative_rate[label type]`, each kept negative weighted 1 / p, so the
weighted loss and weighted calibration estimate the unsampled data's.

Days have three roles (`DayRoles`): training days, a validation day (only for choosing
hyper-parameters) and a separate held-out day (only for the reported numbers). Per day, the Bayes
floor per task (the NE of the world's true probabilities on exactly the examples the model is scored
on) comes from gem.sources.bayes_floor.FloorAccumulator.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np
import torch

from gem.config import load_config
from gem.data.batch import Batch, Jagged, Sparse
from gem.sources.bayes_floor import CONVERTS_AS, FloorAccumulator, sums_ne
from gem.sources.simulation import ChunkEvents, day_start_ms, simulate_day, start_state
from gem.sources.world import DAY_MS, World, build_world
from schemas.tasks import CONVERSION_TYPES, LABEL_TYPES

SPARSE = ("user_id", "ad_id", "surface", "position")
DENSE_DIM = 2
CHUNK = 2_000
# Far beyond the last conversion the simulation can draw: the floor's conversion labels are then
# ChunkEvents.converted and its probabilities p_click * p_convert (no window truncation).
NO_WINDOW_END_MS = 10**15


@dataclass(frozen=True)
class DayRoles:
    """Which simulated days train, choose hyper-parameters, and give the reported numbers."""

    train: tuple[int, ...]
    validation: int
    held_out: int

    def __post_init__(self) -> None:
        if self.validation == self.held_out or {self.validation, self.held_out} & set(self.train):
            raise ValueError(f"day roles must be distinct: train {self.train}, validation {self.validation}, "
                             f"held out {self.held_out}")

    @classmethod
    def consecutive(cls, train_days: int, warmup_days: int = 0) -> DayRoles:
        """After `warmup_days` untrained days, `train_days` days train, the next day validates, the
        one after is held out."""
        first = warmup_days
        return cls(tuple(range(first, first + train_days)), first + train_days, first + train_days + 1)

    @property
    def days(self) -> int:
        return max(*self.train, self.validation, self.held_out) + 1


@dataclass
class Traffic:
    """Every simulated impression, time-sorted; per-impression arrays are (n,)."""

    time_ms: np.ndarray  # int64, sorted
    user: np.ndarray  # int64
    ad: np.ndarray  # int64
    surface: np.ndarray  # int64 index into `surfaces`
    position: np.ndarray  # int64
    clicked: np.ndarray  # bool
    click_time_ms: np.ndarray  # int64, meaningful where clicked
    converted: np.ndarray  # bool: clicked and that click converted
    conversion_time_ms: np.ndarray  # int64, meaningful where converted
    day: np.ndarray  # int64, 0-based
    objective: np.ndarray  # (ads,) objective index per ad
    surfaces: tuple[str, ...]
    floor_sums: dict[int, dict[str, list[float]]]  # day -> task -> the floor's [log loss, examples, positives]

    @property
    def conversion_type(self) -> np.ndarray:
        """(n,) the conversion type (a name in CONVERSION_TYPES) each impression's ad produces."""
        return CONVERTS_AS[self.objective[self.ad]]

    def floor(self, day: int, tasks: tuple[str, ...]) -> float | None:
        """The Bayes floor (NE of the true probabilities) of `tasks` pooled, on day `day`'s examples."""
        return floor_ne(self.floor_sums[day], tasks)

    def tasks(self, label_types: tuple[str, ...] = LABEL_TYPES) -> tuple[str, ...]:
        return tuple(f"{s}/{lt}" for s in self.surfaces for lt in label_types)

    def eligible(self, task: str) -> np.ndarray:
        """(n,) bool: the impressions that are examples of `task` (its surface; for a conversion
        task, ads whose objective converts as that type)."""
        surface, label_type = task.split("/")
        on = self.surface == self.surfaces.index(surface)
        return on if label_type == "click" else on & (self.conversion_type == label_type)

    def label(self, task: str) -> np.ndarray:
        """(n,) bool label of `task` (meaningful where eligible)."""
        return self.clicked if task.endswith("/click") else self.converted


def _chunk_subset(chunk: ChunkEvents, rows: np.ndarray) -> ChunkEvents:
    """The chunk restricted to impressions `rows` (bool (n,)), with their clicks and conversions."""
    clicked_rows = np.flatnonzero(chunk.clicked)
    keep_clicks = rows[clicked_rows]
    keep_conversions = keep_clicks[chunk.converted]
    return replace(
        chunk, impression_index=chunk.impression_index[rows], impression_time=chunk.impression_time[rows],
        user=chunk.user[rows], ad=chunk.ad[rows], surface=chunk.surface[rows], position=chunk.position[rows],
        clicked=chunk.clicked[rows], click_time=chunk.click_time[keep_clicks], converted=chunk.converted[keep_clicks],
        conversion_time=chunk.conversion_time[keep_conversions], p_click=chunk.p_click[rows],
        p_convert=chunk.p_convert[rows])


class _DayFloor:
    """The Bayes floor of one day on the study's example populations: the click tasks over every
    impression, each conversion task over the impressions whose ad converts as its type."""

    def __init__(self) -> None:
        self.all = FloorAccumulator(window_end_ms=NO_WINDOW_END_MS)
        self.by_type = {t: FloorAccumulator(window_end_ms=NO_WINDOW_END_MS) for t in CONVERSION_TYPES}

    def add(self, world: World, chunk: ChunkEvents) -> None:
        self.all.add_chunk(world, chunk)
        converts_as = CONVERTS_AS[world.ad_objective[chunk.ad]]
        for conversion_type, acc in self.by_type.items():
            acc.add_chunk(world, _chunk_subset(chunk, converts_as == conversion_type))

    def sums(self) -> dict[str, list[float]]:
        """task -> [log loss, examples, positives] (FloorAccumulator.sums) on the study's populations."""
        out = {t: v for t, v in self.all.sums.items() if t.endswith("/click")}
        for conversion_type, acc in self.by_type.items():
            out.update({t: v for t, v in acc.sums.items() if t.endswith(f"/{conversion_type}")})
        return out


def floor_ne(sums: dict[str, list[float]], tasks: tuple[str, ...]) -> float | None:
    """The floor's NE over the (example, task) pairs of `tasks` pooled together, as a model's pooled
    NE is computed: gem.sources.bayes_floor.sums_ne of the summed [log loss, examples, positives]."""
    total = [sum(sums[t][i] for t in tasks if t in sums) for i in range(3)]
    return sums_ne(*total) if total[1] else None


def world_chunks(days: int, impressions_per_day: int, users: int, ads: int, seed: int,
                 history_weight: float | None) -> Iterator[tuple[World, int, int, ChunkEvents]]:
    """(world, day, origin ms, chunk) for each time-ordered chunk of `days` days of traffic from the
    config's start day (origin: the start day's first millisecond).

    The ONE place this module calls the generator (gem.sources): a change of the world's or the
    simulation's signature is fixed here.
    """
    generator = {"users": users, "ads": ads, "advertisers": max(2, ads // 10), "seed": seed,
                 "events_per_day": impressions_per_day, "chunk_impressions": CHUNK}
    if history_weight is not None:
        generator["history_weight"] = history_weight
    cfg = load_config(overrides={"generator": generator}, environ={})
    world = build_world(cfg)
    state = start_state(cfg, world)
    origin = day_start_ms(cfg.start_ds)
    for day in range(days):
        ds = (dt.date.fromisoformat(cfg.start_ds) + dt.timedelta(days=day)).isoformat()
        for chunk in simulate_day(cfg, world, state, ds, day_start_ms(ds) + 30 * DAY_MS):
            yield world, day, origin, chunk


def simulate(days: int, impressions_per_day: int, users: int, ads: int, seed: int = 7,
             history_weight: float | None = None) -> Traffic:
    """`days` days of `impressions_per_day` impressions of the world of `seed`, with each day's floor."""
    parts, floors = [], {}
    world = None
    for world, day, origin, chunk in world_chunks(days, impressions_per_day, users, ads, seed, history_weight):
        n = len(chunk.user)
        click_time = np.zeros(n, dtype=np.int64)
        click_time[chunk.clicked] = chunk.click_time - origin
        converted = np.zeros(n, dtype=bool)
        conversion_time = np.zeros(n, dtype=np.int64)
        converted_rows = np.flatnonzero(chunk.clicked)[chunk.converted]
        converted[converted_rows] = True
        conversion_time[converted_rows] = chunk.conversion_time - origin
        parts.append((chunk.impression_time - origin, chunk.user, chunk.ad, chunk.surface, chunk.position, chunk.clicked,
                      click_time, converted, conversion_time, np.full(n, day)))
        floors.setdefault(day, _DayFloor()).add(world, chunk)
    assert world is not None, "no traffic simulated"
    cols = [np.concatenate(c) for c in zip(*parts, strict=True)]
    return Traffic(*cols, objective=world.ad_objective, surfaces=world.surfaces,
                   floor_sums={d: f.sums() for d, f in floors.items()})


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


def draw(t: Traffic, days: tuple[int, ...], tasks: tuple[str, ...], negative_rate: dict[str, float] | None = None,
         seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per task, which impressions of `days` are drawn, and their importance weights.

    A task's eligible positives are always drawn; its eligible negatives with probability
    negative_rate[label type] (default 1), weighted 1 / that. The draw of (impression, task) depends
    only on (seed, task, impression), so a model of one task sees exactly the examples of that task
    that a model of many tasks sees.

    -> (rows (R,) impressions drawn for some task, mask (R, T) bool, weights (R, T) float32)
    """
    in_days = np.isin(t.day, days)
    mask = np.zeros((len(t.user), len(tasks)), dtype=bool)
    weights = np.zeros((len(t.user), len(tasks)), dtype=np.float32)
    for j, task in enumerate(tasks):
        label_type = task.split("/")[1]
        rate = (negative_rate or {}).get(label_type, 1.0)
        label = t.label(task)
        u = np.random.default_rng([seed, LABEL_TYPES.index(label_type), t.surfaces.index(task.split("/")[0])]).random(
            len(t.user))
        p = np.where(label, 1.0, rate)
        mask[:, j] = in_days & t.eligible(task) & (u < p)
        weights[:, j] = np.where(mask[:, j], 1.0 / p, 0.0)
    rows = np.flatnonzero(mask.any(axis=1))
    return rows, mask[rows], weights[rows]


def batches(t: Traffic, days: tuple[int, ...], batch_size: int, max_len: dict[str, int], sequences: bool = True,
            seed: int = 0, shuffle: bool = True, label_types: tuple[str, ...] = LABEL_TYPES,
            tasks: tuple[str, ...] | None = None, negative_rate: dict[str, float] | None = None) -> list[Batch]:
    """Examples of the given days as Batches: every impression drawn for one of `tasks` (default:
    every surface's `label_types`), labelled and masked per task, weighted 1 / draw probability."""
    tasks = tasks or t.tasks(label_types)
    rows, mask, weights = draw(t, days, tasks, negative_rate, seed)
    if shuffle:
        order = np.random.default_rng(seed).permutation(len(rows))
        rows, mask, weights = rows[order], mask[order], weights[order]
    labels = np.stack([t.label(task) for task in tasks], 1)  # (n, T)
    clicks, conversions = np.flatnonzero(t.clicked), np.flatnonzero(t.converted)
    events = {  # event type -> (index into the impressions, event time)
        "impression": (np.arange(len(t.user)), t.time_ms),
        "click": (clicks, t.click_time_ms[clicks]),
        "conversion": (conversions, t.conversion_time_ms[conversions]),
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
        m = torch.from_numpy(mask[lo: lo + batch_size])
        ones = torch.ones(b, dtype=torch.int32)
        out.append(Batch(
            dense=torch.from_numpy(np.stack([t.position[r] / 10.0, np.ones(b)], 1).astype(np.float32)),
            sparse={"user_id": Sparse(torch.from_numpy(t.user[r]), ones), "ad_id": Sparse(torch.from_numpy(t.ad[r]), ones),
                    "surface": Sparse(torch.from_numpy(t.surface[r] + 1), ones),
                    "position": Sparse(torch.from_numpy(t.position[r] + 1), ones)},
            sequences=seqs, labels=m.float() * torch.from_numpy(labels[r]).float(), label_mask=m,
            weights=torch.from_numpy(weights[lo: lo + batch_size]), tasks=tasks,
            impression_times=torch.from_numpy(t.time_ms[r] * 1000),
        ))
    return out

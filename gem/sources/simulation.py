"""A day's traffic as time-ordered chunks: impressions, the clicks they draw, the conversions those
clicks draw, vectorized with numpy (bounded memory: at most `generator.chunk_impressions` at a time).

`simulate_day` is the one day loop (the landing generator and the in-memory study traffic both use
it): it advances the users' interest drift for the day, then simulates at least
`generator.min_chunks_per_day` chunks, updating the users' engagement and fatigue after each.
Impression times follow a diurnal curve; the click logit adds the surface's base rate, position
bias, the user's (drifting) interest . ad, recent clicks (+), recent impressions (fatigue, -) and
the ad's quality bias; conversions follow clicks by up to 7 days and depend on the same interest,
the campaign objective and the user's intent for the conversion type (see gem.sources.world).
"""

from __future__ import annotations

import datetime as dt
import itertools
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from gem import storage
from gem.config import GemConfig
from gem.sources.engagement import EngagementState, MissingGeneratorState, load_state, state_dir, state_path
from gem.sources.world import (
    CLICK_DELAY_MAX_S,
    CLICK_DELAY_MEDIAN_S,
    CLICK_DELAY_SIGMA,
    CONVERSION_DELAY_BETA,
    CONVERSION_MAX_DELAY_DAYS,
    CVR_AFFINITY_WEIGHT,
    DAY_MS,
    DIURNAL_AMPLITUDE,
    DIURNAL_PEAK_HOUR,
    EPOCH,
    FATIGUE_WEIGHT,
    MAX_POSITION,
    POSITION_GEOMETRIC_P,
    SIMULATION_STREAM,
    World,
    sample_from_cdf,
)

# ==================================================================================================
# Time of day.


@dataclass(frozen=True)
class DiurnalClock:
    """Inverse CDF of the daily traffic curve: quantile of the day's traffic -> ms since midnight."""

    cdf: np.ndarray  # (1441,) float64, 0 -> 1
    ms: np.ndarray  # (1441,) float64, 0 -> DAY_MS

    @classmethod
    def build(cls) -> DiurnalClock:
        minutes = np.arange(1440, dtype=np.float64) + 0.5
        intensity = 1.0 + DIURNAL_AMPLITUDE * np.cos(2 * np.pi * (minutes / 60.0 - DIURNAL_PEAK_HOUR) / 24.0)
        cdf = np.concatenate([[0.0], np.cumsum(intensity)])
        return cls(cdf=cdf / cdf[-1], ms=np.arange(1441, dtype=np.float64) * 60_000.0)

    def ms_of_day(self, quantiles: np.ndarray) -> np.ndarray:
        """Milliseconds after midnight (int64, < DAY_MS) at which these traffic quantiles fall."""
        return np.minimum(np.interp(quantiles, self.cdf, self.ms).astype(np.int64), DAY_MS - 1)


# ==================================================================================================
# One chunk of the day's simulation.


@dataclass(frozen=True)
class ChunkEvents:
    """The events caused by one time-ordered chunk of impressions (index arrays, no objects)."""

    impression_index: np.ndarray  # (n,) int64: impression number within the day
    impression_time: np.ndarray  # (n,) int64 epoch ms, sorted
    user: np.ndarray  # (n,) int64
    ad: np.ndarray  # (n,) int64
    surface: np.ndarray  # (n,) int64 index into World.surfaces
    position: np.ndarray  # (n,) int64
    clicked: np.ndarray  # (n,) bool
    click_time: np.ndarray  # (clicks,) int64 epoch ms, for impressions where clicked
    converted: np.ndarray  # (clicks,) bool
    conversion_time: np.ndarray  # (conversions,) int64 epoch ms, for clicks where converted
    p_click: np.ndarray  # (n,) float64: the true click probability of each impression
    p_convert: np.ndarray  # (n,) float64: the true conversion probability were it clicked


def _draw_impressions(
    world: World, rng: np.random.Generator, n: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Who saw which ad where: users by activity, surface by the user's preference, ad, position."""
    user = sample_from_cdf(world.user_activity_cdf, rng.random(n))
    surface_cdf = world.user_surface_cdf[user]  # (n, surfaces)
    surface = np.minimum((rng.random(n)[:, None] >= surface_cdf).sum(axis=1), len(world.surfaces) - 1)
    ad = sample_from_cdf(world.ad_popularity_cdf, rng.random(n))
    position = np.minimum(rng.geometric(POSITION_GEOMETRIC_P, size=n) - 1, MAX_POSITION)
    return user, surface.astype(np.int64), ad, position.astype(np.int64)


def interest(world: World, state: EngagementState, user: np.ndarray) -> np.ndarray:
    """The users' interest vectors today: static interest + drift; shape (n, dim)."""
    return world.user_latent[user] + state.drift[user].astype(np.float32)


def click_logit(
    world: World,
    state: EngagementState,
    history_weight: float,
    user: np.ndarray,
    ad: np.ndarray,
    surface: np.ndarray,
    position: np.ndarray,
) -> np.ndarray:
    """logit(base_ctr[surface]) - decay[surface]*position + i_u.a + w * h_u.a - w_f * f_u.a + ad bias + user bias; (n,).

    i_u the user's interest today, h_u the decayed mean of recently clicked ad vectors, f_u the
    decayed mean of recently impressed ones (fatigue)."""
    ad_vectors = world.ad_latent[ad]  # (n, dim)
    affinity = np.einsum("nd,nd->n", interest(world, state, user), ad_vectors)
    history = state.recent_clicks(user)  # (n, dim)
    recency = np.einsum("nd,nd->n", history, ad_vectors)
    seen = state.recent_impressions(user)  # (n, dim)
    fatigue = np.einsum("nd,nd->n", seen, ad_vectors)
    return (
        world.surface_base_logit[surface]
        - world.surface_position_decay[surface] * position
        + affinity
        + history_weight * recency
        - FATIGUE_WEIGHT * fatigue
        + world.ad_bias[ad]
        + world.user_bias[user]
    )


def conversion_logit(world: World, state: EngagementState, user: np.ndarray, ad: np.ndarray) -> np.ndarray:
    """logit(base CVR of the ad's objective) + affinity weight * i_u.a + the user's intent for the ad's
    conversion type; shape (n,)."""
    affinity = np.einsum("nd,nd->n", interest(world, state, user), world.ad_latent[ad])
    intent = world.user_intent[user, world.ad_conversion_type[ad]]
    return world.ad_base_cvr_logit[ad] + CVR_AFFINITY_WEIGHT * affinity + intent


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def simulate_chunk(
    world: World,
    state: EngagementState,
    history_weight: float,
    rng: np.random.Generator,
    impression_times: np.ndarray,
    first_index: int,
    last_arrival_end_ms: int,
) -> ChunkEvents:
    """Impressions at the given sorted times, their clicks, and the clicks' conversions.

    Conversions are clipped to end before `last_arrival_end_ms` (the end of day D+7), which only
    affects clicks after midnight with delays near 7 days.
    """
    n = len(impression_times)
    user, surface, ad, position = _draw_impressions(world, rng, n)
    p_click = _sigmoid(click_logit(world, state, history_weight, user, ad, surface, position))
    clicked = rng.random(n) < p_click
    n_clicks = int(clicked.sum())
    click_delay_s = np.minimum(
        rng.lognormal(np.log(CLICK_DELAY_MEDIAN_S), CLICK_DELAY_SIGMA, size=n_clicks), CLICK_DELAY_MAX_S
    )
    click_time = impression_times[clicked] + (1000.0 * click_delay_s).astype(np.int64)

    p_convert = _sigmoid(conversion_logit(world, state, user, ad))  # (n,), used for the clicked ones
    converted = rng.random(len(click_time)) < p_convert[clicked]
    delay_fraction = rng.beta(*CONVERSION_DELAY_BETA, size=int(converted.sum()))
    max_delay_ms = CONVERSION_MAX_DELAY_DAYS * DAY_MS
    conversion_delay = np.minimum((delay_fraction * max_delay_ms).astype(np.int64), max_delay_ms - 1)
    conversion_time = np.minimum(click_time[converted] + conversion_delay, last_arrival_end_ms - 1)
    return ChunkEvents(
        impression_index=np.arange(first_index, first_index + n, dtype=np.int64),
        impression_time=impression_times,
        user=user,
        ad=ad,
        surface=surface,
        position=position,
        clicked=clicked,
        click_time=click_time,
        converted=converted,
        conversion_time=conversion_time,
        p_click=p_click,
        p_convert=p_convert,
    )


# ==================================================================================================
# The day.


def day_start_ms(ds: str) -> int:
    """Epoch milliseconds of the start of day `ds` (UTC)."""
    return (dt.date.fromisoformat(ds) - EPOCH).days * DAY_MS


def chunk_count(cfg: GemConfig) -> int:
    """Chunks a day is simulated in: enough to bound memory, and at least min_chunks_per_day so the
    users' engagement and fatigue move within the day (time-gap effects)."""
    g = cfg.generator
    if g.chunk_impressions <= 0 or g.min_chunks_per_day <= 0:
        raise ValueError(f"generator.chunk_impressions and min_chunks_per_day must be positive, got "
                         f"{g.chunk_impressions}, {g.min_chunks_per_day}")
    return max(-(-g.events_per_day // g.chunk_impressions), min(g.min_chunks_per_day, max(g.events_per_day, 1)))


def simulate_day(cfg: GemConfig, world: World, state: EngagementState, ds: str,
                 last_arrival_end_ms: int) -> Iterator[ChunkEvents]:
    """Day `ds`'s traffic, chunk by chunk in time order; `state` (the end of ds-1) ends as the end of ds.

    Chunk k covers the traffic quantiles [k/K, (k+1)/K) of the diurnal curve (K = chunk_count), so
    chunks are time-ordered and the memories decay by the wall-clock span each chunk covers. Each
    chunk's state update happens before it is yielded, so a consumer that stops early still leaves a
    consistent state for the chunks it saw.
    """
    g = cfg.generator
    ymd = int(dt.date.fromisoformat(ds).strftime("%Y%m%d"))
    rng = np.random.default_rng([g.seed, SIMULATION_STREAM, ymd])
    clock = DiurnalClock.build()
    start_ms = day_start_ms(ds)
    state.start_day(g.seed, ymd)
    chunks = chunk_count(cfg)
    bounds = [round(k * g.events_per_day / chunks) for k in range(chunks + 1)]
    for first, end in itertools.pairwise(bounds):
        n = end - first
        if n == 0:
            continue
        lo, hi = first / g.events_per_day, end / g.events_per_day
        times = start_ms + clock.ms_of_day(np.sort(rng.uniform(lo, hi, size=n)))
        chunk = simulate_chunk(world, state, g.history_weight, rng, times, first, last_arrival_end_ms)
        elapsed_ms = float(clock.ms_of_day(np.asarray([hi]))[0] - clock.ms_of_day(np.asarray([lo]))[0])
        state.advance(elapsed_ms, chunk.user, world.ad_latent[chunk.ad], chunk.clicked)
        yield chunk


def start_state(cfg: GemConfig, world: World) -> EngagementState:
    """The state the pipeline's first day (start_ds) starts from: fresh users carried through the
    `generator.burn_in_days` days before start_ds, simulated and thrown away. Fresh users have no
    recent clicks and no fatigue, so their click rates move for the first days (the click memory's
    half-life is a day); after the burn-in the first day is like any later one."""
    state = EngagementState.fresh(world)
    for back in range(cfg.generator.burn_in_days, 0, -1):
        ds = (dt.date.fromisoformat(cfg.start_ds) - dt.timedelta(days=back)).isoformat()
        for _ in simulate_day(cfg, world, state, ds, day_start_ms(ds) + 30 * DAY_MS):
            pass  # only the state's advance matters
    return state


def _days_with_state(cfg: GemConfig) -> list[str]:
    return sorted(storage.name(uri)[len("ds=") : -len(".npz")]
                  for uri in storage.glob(storage.join(state_dir(cfg), "ds=*.npz")))


def state_before(cfg: GemConfig, ds: str, world: World) -> EngagementState:
    """The state day `ds` starts from: the burned-in start state (start_state) on the start day or when
    no earlier day has state, else day ds-1's saved state (MissingGeneratorState if that one is missing)."""
    previous = (dt.date.fromisoformat(ds) - dt.timedelta(days=1)).isoformat()
    if ds == cfg.start_ds:
        return start_state(cfg, world)
    if storage.exists(state_path(cfg, previous)):
        return load_state(cfg, previous)
    earlier = [d for d in _days_with_state(cfg) if d < ds]
    if not earlier:
        return start_state(cfg, world)
    raise MissingGeneratorState(
        f"generator state {state_path(cfg, previous)} for ds={previous} is missing, but earlier state exists "
        f"(latest ds={earlier[-1]}); run generate_events for ds={previous} first"
    )

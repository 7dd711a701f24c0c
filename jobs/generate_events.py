"""Synthetic multi-surface ad events for one day, written as landing files by arrival day.

What: `generate_day(cfg, ds)` simulates one day D of impressions, clicks and conversions for a
static, seed-determined world of users and ads, and writes them as gzip JSON lines (the
schemas.events.LANDING_EVENTS contract) into the landing zone, one file per ARRIVAL day:
`{landing_root}/ds=X/events-from-D.json.gz` for X in D..D+7, where X is the UTC date of each
event's `event_time`. Conversions (up to 7 days after their click) and clicks just after midnight
therefore land in later partitions, exactly as late data does in production. Only ds=D is marked
complete (`_SUCCESS`, holding the run's manifest): later arrival days are completed by their own
generator day.

Why it looks the way it does:
  * Signal a model can learn: the click logit adds the surface's base rate and position bias, the
    user-ad affinity (shared latent interests across surfaces), an ad quality bias, and the user's
    recent engagement (an exponentially decayed mean of the latent vectors of ads the user clicked),
    so click sequences carry signal; conversions follow clicks, depend on affinity and on the ad's
    campaign objective.
  * Bounded memory: impressions are simulated and serialized in time-ordered chunks of
    `cfg.generator.chunk_impressions` with vectorized numpy; only the final JSON lines are Python
    strings, one chunk at a time.
  * Reproducible: the world comes from `seed`, day D's randomness from (seed, D); recent-engagement
    state is carried across days in `{lakehouse_uri}/_generator/state/ds=D.npz`. Rerunning a ds
    writes byte-identical landing files, sidecars, marker and state.
  * Known dirt: each landing file gets `floor(dirty_fraction * clean_lines)` EXTRA lines, cycling
    through every kind in schemas.events.DIRTY_KIND_REASON, each with exactly one defect. A sidecar
    `events-from-D.manifest.json` beside each data file records its exact clean and dirty counts;
    `expected_landing_counts` sums them per arrival day for ingest tests.

Event ids: impression n of day D is `e{YYYYMMDD}-{n:012d}`; its click is that id + "-c" and the
click's conversion that id + "-v"; a dirty copy appends "-d{k}" (except duplicate_event_id lines,
which repeat a clean line verbatim).

Usage:
    python -m jobs.generate_events --ds 2026-01-01 [--users N --events M --seed S --config FILE]
"""

from __future__ import annotations

import argparse
import datetime as dt
import io
import itertools
import json
import os
import sys
import time
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gem.config import GemConfig, add_config_arg, load_config
from gem.landing import LandingFile, clear_partition_complete, mark_partition_complete, partition_dir
from schemas.events import DIRTY_KIND_REASON, ID_COLUMNS
from schemas.tasks import CREATIVE_TYPES, OBJECTIVES

PRODUCER = "generate_events"
DAY_MS = 86_400_000
HOUR_MS = 3_600_000
EPOCH = dt.date(1970, 1, 1)

# Conversions happen within [0, 7 days) of their click, so day D writes arrival days D..D+7.
CONVERSION_MAX_DELAY_DAYS = 7
ARRIVAL_DAYS = CONVERSION_MAX_DELAY_DAYS + 1

# ---- World shape (not worth a config knob each; the config holds sizes, seed and rates). --------
N_TOPICS = 12  # interest clusters shared by users and advertisers
TOPIC_NOISE = 0.8  # spread of a user's / ad's latent vector around its topic centre
USER_INTEREST_SCALE = 2.0  # norm of user latent vectors: affinity = user . ad in [-2, 2]
AD_BIAS_STD = 0.4  # per-ad quality bias in the click logit
USER_ACTIVITY_SIGMA = 1.0  # lognormal spread of user activity (heavy users)
AD_POPULARITY_SIGMA = 0.8  # lognormal spread of ad serving volume
SURFACE_PREF_CONCENTRATION = 20.0  # Dirichlet concentration around each surface's traffic share
CAMPAIGNS_PER_ADVERTISER_MEAN = 3.0
POSITION_GEOMETRIC_P = 0.35  # P(position = 0); positions are 0, 1, 2, ... geometric
MAX_POSITION = 19
DIURNAL_AMPLITUDE = 0.6  # traffic peaks at DIURNAL_PEAK_HOUR UTC and dips 12 hours later
DIURNAL_PEAK_HOUR = 20.0

# ---- Behaviour. -------------------------------------------------------------------------------
CLICK_DELAY_MEDIAN_S = 15.0  # click time = impression time + lognormal seconds, capped
CLICK_DELAY_SIGMA = 1.2
CLICK_DELAY_MAX_S = 1800.0
HISTORY_HALF_LIFE_HOURS = 24.0  # recent-engagement decay
HISTORY_PRIOR_WEIGHT = 1.0  # pseudo-count shrinking the decayed mean toward 0 for light clickers
CVR_AFFINITY_WEIGHT = 1.0
# Base conversion rate given a click, and the conversion type each campaign objective produces.
OBJECTIVE_BASE_CVR: dict[str, float] = {
    "sales": 0.06,
    "app_promotion": 0.08,
    "leads": 0.07,
    "traffic": 0.010,
    "awareness": 0.004,
}
OBJECTIVE_CONVERSION_TYPE: dict[str, str] = {
    "sales": "offsite_purchase",
    "app_promotion": "app_install",
    "leads": "lead",
    "traffic": "offsite_purchase",
    "awareness": "offsite_purchase",
}
OBJECTIVE_SHARE: dict[str, float] = {
    "traffic": 0.25,
    "sales": 0.30,
    "app_promotion": 0.20,
    "leads": 0.15,
    "awareness": 0.10,
}
CREATIVE_SHARE: dict[str, float] = {"image": 0.40, "video": 0.35, "carousel": 0.15, "collection": 0.10}
# Conversion delay as a fraction of 7 days ~ Beta(a, b): most conversions come early.
CONVERSION_DELAY_BETA = (0.5, 4.0)

# ---- Demographics (user_attrs). ---------------------------------------------------------------
AGE_BUCKETS: dict[str, float] = {
    "13-17": 0.05,
    "18-24": 0.18,
    "25-34": 0.27,
    "35-44": 0.21,
    "45-54": 0.14,
    "55-64": 0.09,
    "65+": 0.06,
}
GENDERS: dict[str, float] = {"female": 0.49, "male": 0.48, "unknown": 0.03}
COUNTRIES: dict[str, float] = {
    "US": 0.30,
    "IN": 0.16,
    "BR": 0.10,
    "ID": 0.08,
    "MX": 0.07,
    "GB": 0.06,
    "DE": 0.06,
    "FR": 0.06,
    "JP": 0.06,
    "NG": 0.05,
}

# ---- Dirty rows. ------------------------------------------------------------------------------
DIRTY_KINDS: tuple[str, ...] = tuple(DIRTY_KIND_REASON)
UNKNOWN_SURFACES: tuple[str, ...] = ("tiktok", "snapchat", "youtube_shorts")
FAR_FUTURE_MS = int((dt.date(2100, 1, 1) - EPOCH).days) * DAY_MS

# Independent random streams per (seed, purpose[, day]) so changing one never shifts another.
WORLD_STREAM = 0
SIMULATION_STREAM = 1
DIRTY_STREAM = 2


class MissingGeneratorState(FileNotFoundError):
    """Day D needs day D-1's engagement state, which is absent although earlier days have state."""


class IncompatibleGeneratorState(ValueError):
    """A saved engagement state was produced for a different world (seed, sizes, surfaces)."""


# ==================================================================================================
# The static world.


@dataclass(frozen=True)
class JsonFragments:
    """Pre-rendered pieces of landing lines, so serializing an event is a few gathers and one f-string.

    Each piece ends with the comma that follows it (user_attrs, the last column, closes the object);
    object arrays so a chunk's pieces are gathered with numpy fancy indexing.
    """

    user_id: np.ndarray  # (users,) object: '"user_id":"u12",'
    user_attrs: np.ndarray  # (users,) object: '"user_attrs":{"age":"25-34",...}}'
    ad_fields: np.ndarray  # (ads,) object: '"ad_id":"a3","advertiser_id":...,"creative_type":"video",'
    conversion_tail: np.ndarray  # (ads,) object: '"position":null,"conversion_type":"lead",'
    surface: np.ndarray  # (surfaces,) object: '"surface":"reels",'
    # (surfaces * (MAX_POSITION + 1),) object, index surface * (MAX_POSITION + 1) + position:
    # '"surface":"reels","position":3,"conversion_type":null,'
    surface_position: np.ndarray


def _render_fragments(
    surfaces: Sequence[str],
    user_attrs: list[dict[str, str]],
    ad_advertiser: np.ndarray,
    ad_campaign: np.ndarray,
    ad_objective: np.ndarray,
    ad_creative: np.ndarray,
) -> JsonFragments:
    """The JSON pieces of every user, ad and (surface, position) of the world."""
    ad_fields = [
        f'"ad_id":"a{a}","advertiser_id":"adv{adv}","campaign_id":"c{c}",'
        f'"objective":"{OBJECTIVES[o]}","creative_type":"{CREATIVE_TYPES[k]}",'
        for a, (adv, c, o, k) in enumerate(
            zip(ad_advertiser.tolist(), ad_campaign.tolist(), ad_objective.tolist(), ad_creative.tolist())
        )
    ]
    conversion_tail = [
        f'"position":null,"conversion_type":"{OBJECTIVE_CONVERSION_TYPE[OBJECTIVES[o]]}",'
        for o in ad_objective.tolist()
    ]
    surface_position = [
        f'"surface":"{s}","position":{p},"conversion_type":null,' for s in surfaces for p in range(MAX_POSITION + 1)
    ]
    return JsonFragments(
        user_id=_object_array([f'"user_id":"u{u}",' for u in range(len(user_attrs))]),
        user_attrs=_object_array(['"user_attrs":' + _compact_json(a) + "}" for a in user_attrs]),
        ad_fields=_object_array(ad_fields),
        conversion_tail=_object_array(conversion_tail),
        surface=_object_array([f'"surface":"{s}",' for s in surfaces]),
        surface_position=_object_array(surface_position),
    )


def _object_array(strings: list[str]) -> np.ndarray:
    out = np.empty(len(strings), dtype=object)
    out[:] = strings
    return out


def _compact_json(obj: dict[str, Any]) -> str:
    return json.dumps(obj, separators=(",", ":"))


@dataclass(frozen=True)
class World:
    """Users, ads and surfaces of one seed, plus their pre-rendered JSON fragments."""

    surfaces: tuple[str, ...]
    surface_base_logit: np.ndarray  # (surfaces,) float32: logit of each surface's base CTR
    surface_position_decay: np.ndarray  # (surfaces,) float32: logit drop per position
    user_latent: np.ndarray  # (users, dim) float32
    user_activity_cdf: np.ndarray  # (users,) float64, last entry 1.0
    user_surface_cdf: np.ndarray  # (users, surfaces) float64, last column 1.0
    user_attrs: list[dict[str, str]]  # per user: age, gender, country
    ad_latent: np.ndarray  # (ads, dim) float32, unit norm
    ad_bias: np.ndarray  # (ads,) float32
    ad_popularity_cdf: np.ndarray  # (ads,) float64, last entry 1.0
    ad_advertiser: np.ndarray  # (ads,) int64 advertiser index
    ad_campaign: np.ndarray  # (ads,) int64 campaign index (global)
    ad_objective: np.ndarray  # (ads,) int64 index into OBJECTIVES
    ad_creative: np.ndarray  # (ads,) int64 index into CREATIVE_TYPES
    ad_base_cvr_logit: np.ndarray  # (ads,) float32: logit of the objective's base CVR
    fragments: JsonFragments

    @property
    def n_users(self) -> int:
        return int(self.user_latent.shape[0])

    @property
    def n_ads(self) -> int:
        return int(self.ad_latent.shape[0])

    @property
    def latent_dim(self) -> int:
        return int(self.user_latent.shape[1])


def _probabilities(shares: dict[str, float]) -> tuple[list[str], np.ndarray]:
    """Names and normalized probabilities of a {name: share} table."""
    names = list(shares)
    p = np.asarray([shares[n] for n in names], dtype=np.float64)
    return names, p / p.sum()


def _unit_rows(x: np.ndarray) -> np.ndarray:
    """Rows of x scaled to unit L2 norm."""
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def _cdf(weights: np.ndarray) -> np.ndarray:
    """Cumulative distribution of positive weights along the last axis, ending exactly at 1."""
    cdf = np.cumsum(weights, axis=-1, dtype=np.float64)
    cdf /= cdf[..., -1:]
    cdf[..., -1] = 1.0
    return cdf


def _logit(p: np.ndarray | float) -> np.ndarray:
    p = np.asarray(p, dtype=np.float64)
    return np.log(p) - np.log1p(-p)


def _sample_from_cdf(cdf: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Indices drawn from a 1-d CDF by uniforms u (inverse-CDF sampling)."""
    return np.minimum(np.searchsorted(cdf, u, side="right"), len(cdf) - 1)


def _sample_user_attrs(n_users: int, rng: np.random.Generator) -> list[dict[str, str]]:
    """Age bucket, gender and country per user, drawn from fixed population shares."""
    columns = {}
    for key, table in (("age", AGE_BUCKETS), ("gender", GENDERS), ("country", COUNTRIES)):
        names, p = _probabilities(table)
        columns[key] = [names[i] for i in rng.choice(len(names), size=n_users, p=p).tolist()]
    return [{key: columns[key][u] for key in columns} for u in range(n_users)]


def _campaigns_of_ads(ad_advertiser: np.ndarray, n_advertisers: int, rng: np.random.Generator) -> np.ndarray:
    """A global campaign index per ad: each advertiser owns 1 + Poisson campaigns, ads pick one."""
    per_advertiser = 1 + rng.poisson(CAMPAIGNS_PER_ADVERTISER_MEAN - 1.0, size=n_advertisers)
    first_campaign = np.concatenate([[0], np.cumsum(per_advertiser)[:-1]])  # (advertisers,)
    pick = np.floor(rng.random(len(ad_advertiser)) * per_advertiser[ad_advertiser]).astype(np.int64)
    return first_campaign[ad_advertiser] + pick


def build_world(cfg: GemConfig) -> World:
    """The static users/ads world of `cfg.generator.seed`; cheap, so regenerated on every run."""
    g = cfg.generator
    rng = np.random.default_rng([g.seed, WORLD_STREAM])
    dim = g.latent_dim

    # Interest topics shared by users and advertisers make affinity clustered, not pure noise.
    topic_centres = _unit_rows(rng.standard_normal((N_TOPICS, dim)))  # (topics, dim)

    user_topic = rng.integers(0, N_TOPICS, size=g.users)
    user_noise = TOPIC_NOISE * rng.standard_normal((g.users, dim)) / np.sqrt(dim)  # (users, dim), norm ~ TOPIC_NOISE
    user_latent = (USER_INTEREST_SCALE * _unit_rows(topic_centres[user_topic] + user_noise)).astype(np.float32)
    user_activity = rng.lognormal(0.0, USER_ACTIVITY_SIGMA, size=g.users)
    shares = np.asarray([g.surface_params[s].traffic_share for s in cfg.surfaces], dtype=np.float64)
    shares = shares / shares.sum()
    user_surface_pref = rng.dirichlet(SURFACE_PREF_CONCENTRATION * shares, size=g.users)  # (users, surfaces)
    user_attrs = _sample_user_attrs(g.users, rng)

    advertiser_topic = rng.integers(0, N_TOPICS, size=g.advertisers)
    advertiser_size = rng.lognormal(0.0, 1.0, size=g.advertisers)
    ad_advertiser = _sample_from_cdf(_cdf(advertiser_size), rng.random(g.ads))
    ad_campaign = _campaigns_of_ads(ad_advertiser, g.advertisers, rng)
    n_campaigns = int(ad_campaign.max()) + 1 if g.ads else 0
    objective_names, objective_p = _probabilities(OBJECTIVE_SHARE)
    campaign_objective = np.asarray(
        [
            OBJECTIVES.index(objective_names[i])
            for i in rng.choice(len(objective_names), size=n_campaigns, p=objective_p)
        ],
        dtype=np.int64,
    )
    ad_objective = campaign_objective[ad_campaign]
    creative_names, creative_p = _probabilities(CREATIVE_SHARE)
    ad_creative = np.asarray(
        [CREATIVE_TYPES.index(creative_names[i]) for i in rng.choice(len(creative_names), size=g.ads, p=creative_p)],
        dtype=np.int64,
    )
    ad_noise = TOPIC_NOISE * rng.standard_normal((g.ads, dim)) / np.sqrt(dim)  # (ads, dim)
    ad_latent = _unit_rows(topic_centres[advertiser_topic[ad_advertiser]] + ad_noise).astype(np.float32)  # (ads, dim)
    ad_bias = (AD_BIAS_STD * rng.standard_normal(g.ads)).astype(np.float32)
    ad_popularity = rng.lognormal(0.0, AD_POPULARITY_SIGMA, size=g.ads)
    ad_base_cvr_logit = _logit(np.asarray([OBJECTIVE_BASE_CVR[OBJECTIVES[o]] for o in ad_objective.tolist()])).astype(
        np.float32
    )

    base_ctr = np.asarray([g.surface_params[s].base_ctr for s in cfg.surfaces])
    return World(
        surfaces=tuple(cfg.surfaces),
        surface_base_logit=_logit(base_ctr).astype(np.float32),
        surface_position_decay=np.asarray([g.surface_params[s].position_decay for s in cfg.surfaces], dtype=np.float32),
        user_latent=user_latent,
        user_activity_cdf=_cdf(user_activity),
        user_surface_cdf=_cdf(user_surface_pref),
        user_attrs=user_attrs,
        ad_latent=ad_latent,
        ad_bias=ad_bias,
        ad_popularity_cdf=_cdf(ad_popularity),
        ad_advertiser=ad_advertiser,
        ad_campaign=ad_campaign,
        ad_objective=ad_objective,
        ad_creative=ad_creative,
        ad_base_cvr_logit=ad_base_cvr_logit,
        fragments=_render_fragments(cfg.surfaces, user_attrs, ad_advertiser, ad_campaign, ad_objective, ad_creative),
    )


# ==================================================================================================
# Recent-engagement state, carried across days.


@dataclass
class EngagementState:
    """Per-user exponentially decayed sum (and weight) of the latent vectors of clicked ads."""

    clicked_sum: np.ndarray  # (users, dim) float64
    clicked_weight: np.ndarray  # (users,) float64

    @classmethod
    def fresh(cls, n_users: int, dim: int) -> EngagementState:
        return cls(np.zeros((n_users, dim), dtype=np.float64), np.zeros(n_users, dtype=np.float64))

    def decay_and_add(self, decay: float, users: np.ndarray, ad_vectors: np.ndarray) -> None:
        """Age the state by `decay` in (0, 1], then add one unit of weight per click (users[i], ad_vectors[i])."""
        self.clicked_sum *= decay
        self.clicked_weight *= decay
        np.add.at(self.clicked_sum, users, ad_vectors.astype(np.float64))
        np.add.at(self.clicked_weight, users, 1.0)


def recent_engagement(state: EngagementState) -> np.ndarray:
    """h_u: the decayed mean clicked-ad vector, shrunk toward 0 for users with few recent clicks.

    Shape (users, dim), float32. A user with no clicks has h = 0, so history adds nothing.
    """
    return (state.clicked_sum / (state.clicked_weight + HISTORY_PRIOR_WEIGHT)[:, None]).astype(np.float32)


def state_dir(cfg: GemConfig) -> Path:
    uri = cfg.lakehouse_uri
    return Path(uri.removeprefix("file://")) / "_generator" / "state"


def state_path(cfg: GemConfig, ds: str) -> Path:
    """Where the engagement state at the end of day `ds` lives."""
    return state_dir(cfg) / f"ds={ds}.npz"


def _world_fingerprint(cfg: GemConfig) -> str:
    """What a saved state must match to be reused: the world's seed, sizes and surfaces."""
    g = cfg.generator
    keys = {"seed": g.seed, "users": g.users, "ads": g.ads, "advertisers": g.advertisers, "latent_dim": g.latent_dim}
    return json.dumps({**keys, "surfaces": list(cfg.surfaces)}, sort_keys=True)


def _write_npz_atomically(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """An .npz (readable by np.load) with fixed zip timestamps, so equal arrays give equal bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, array in arrays.items():
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, np.asanyarray(array), allow_pickle=False)
            zf.writestr(zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0)), buffer.getvalue())
    os.replace(tmp, path)


def save_state(cfg: GemConfig, ds: str, state: EngagementState) -> Path:
    """Persist the end-of-day state for `ds` atomically (tmp file + rename)."""
    path = state_path(cfg, ds)
    _write_npz_atomically(
        path,
        {
            "clicked_sum": state.clicked_sum,
            "clicked_weight": state.clicked_weight,
            "world": np.asarray(_world_fingerprint(cfg)),
            "ds": np.asarray(ds),
        },
    )
    return path


def load_state(cfg: GemConfig, ds: str) -> EngagementState:
    """The saved end-of-day state of `ds`, checked against this config's world."""
    path = state_path(cfg, ds)
    with np.load(path, allow_pickle=False) as saved:
        saved_world = str(saved["world"])
        if saved_world != _world_fingerprint(cfg):
            raise IncompatibleGeneratorState(
                f"generator state {path} was written for world {saved_world}, "
                f"but this config's world is {_world_fingerprint(cfg)}; regenerate from the start day"
            )
        return EngagementState(saved["clicked_sum"].copy(), saved["clicked_weight"].copy())


def _days_with_state(cfg: GemConfig) -> list[str]:
    return sorted(p.name[len("ds=") : -len(".npz")] for p in state_dir(cfg).glob("ds=*.npz"))


def state_before(cfg: GemConfig, ds: str, world: World) -> EngagementState:
    """The state day `ds` starts from: fresh on the start day or when no earlier day has state,
    else day ds-1's state (MissingGeneratorState if that one is missing)."""
    previous = (dt.date.fromisoformat(ds) - dt.timedelta(days=1)).isoformat()
    if ds == cfg.start_ds:
        return EngagementState.fresh(world.n_users, world.latent_dim)
    if state_path(cfg, previous).is_file():
        return load_state(cfg, previous)
    earlier = [d for d in _days_with_state(cfg) if d < ds]
    if not earlier:
        return EngagementState.fresh(world.n_users, world.latent_dim)
    raise MissingGeneratorState(
        f"generator state {state_path(cfg, previous)} for ds={previous} is missing, but earlier state exists "
        f"(latest ds={earlier[-1]}); run generate_events for ds={previous} first"
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


def _draw_impressions(
    world: World, rng: np.random.Generator, n: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Who saw which ad where: users by activity, surface by the user's preference, ad, position."""
    user = _sample_from_cdf(world.user_activity_cdf, rng.random(n))
    surface_cdf = world.user_surface_cdf[user]  # (n, surfaces)
    surface = np.minimum((rng.random(n)[:, None] >= surface_cdf).sum(axis=1), len(world.surfaces) - 1)
    ad = _sample_from_cdf(world.ad_popularity_cdf, rng.random(n))
    position = np.minimum(rng.geometric(POSITION_GEOMETRIC_P, size=n) - 1, MAX_POSITION)
    return user, surface.astype(np.int64), ad, position.astype(np.int64)


def click_logit(
    world: World,
    history: np.ndarray,
    history_weight: float,
    user: np.ndarray,
    ad: np.ndarray,
    surface: np.ndarray,
    position: np.ndarray,
) -> np.ndarray:
    """logit(base_ctr[surface]) - decay[surface]*position + u.a + w * h_u.a + ad bias; shape (n,)."""
    ad_vectors = world.ad_latent[ad]  # (n, dim)
    affinity = np.einsum("nd,nd->n", world.user_latent[user], ad_vectors)
    recency = np.einsum("nd,nd->n", history[user], ad_vectors)
    return (
        world.surface_base_logit[surface]
        - world.surface_position_decay[surface] * position
        + affinity
        + history_weight * recency
        + world.ad_bias[ad]
    )


def conversion_logit(world: World, user: np.ndarray, ad: np.ndarray) -> np.ndarray:
    """logit(base CVR of the ad's objective) + affinity weight * u.a; shape (clicks,)."""
    affinity = np.einsum("nd,nd->n", world.user_latent[user], world.ad_latent[ad])
    return world.ad_base_cvr_logit[ad] + CVR_AFFINITY_WEIGHT * affinity


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


def simulate_chunk(
    world: World,
    history: np.ndarray,
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
    p_click = _sigmoid(click_logit(world, history, history_weight, user, ad, surface, position))
    clicked = rng.random(n) < p_click
    n_clicks = int(clicked.sum())
    click_delay_s = np.minimum(
        rng.lognormal(np.log(CLICK_DELAY_MEDIAN_S), CLICK_DELAY_SIGMA, size=n_clicks), CLICK_DELAY_MAX_S
    )
    click_time = impression_times[clicked] + (1000.0 * click_delay_s).astype(np.int64)

    click_user, click_ad = user[clicked], ad[clicked]
    converted = rng.random(len(click_time)) < _sigmoid(conversion_logit(world, click_user, click_ad))
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
    )


# ==================================================================================================
# Serialization: one f-string per event over pre-rendered fragments (LANDING_EVENTS column order).


def _line_head(ymd: str, event_type: str, id_suffix: str) -> str:
    """'%'-template of a line's first three columns; fill with (impression number, event_time ms)."""
    return f'{{"event_id":"e{ymd}-%012d{id_suffix}","event_type":"{event_type}","event_time":%d,'


def positioned_lines(
    world: World, head: str, impression_rows: np.ndarray, event_time: np.ndarray, chunk: ChunkEvents
) -> list[str]:
    """JSON lines of impressions or clicks: the chunk's impressions at `impression_rows`, at `event_time`."""
    frags = world.fragments
    user, ad = chunk.user[impression_rows], chunk.ad[impression_rows]
    slot = chunk.surface[impression_rows] * (MAX_POSITION + 1) + chunk.position[impression_rows]  # (n,)
    return [
        f"{head % (i, t)}{user_id}{ad_fields}{surface_position}{user_attrs}"
        for i, t, user_id, ad_fields, surface_position, user_attrs in zip(
            chunk.impression_index[impression_rows].tolist(),
            event_time.tolist(),
            frags.user_id[user].tolist(),
            frags.ad_fields[ad].tolist(),
            frags.surface_position[slot].tolist(),
            frags.user_attrs[user].tolist(),
        )
    ]


def conversion_lines(world: World, ymd: str, chunk: ChunkEvents, conversion_rows: np.ndarray) -> list[str]:
    """JSON lines of the conversions at `conversion_rows`; position null, conversion_type set."""
    frags = world.fragments
    head = _line_head(ymd, "conversion", "-v")
    impression_rows = np.flatnonzero(chunk.clicked)[np.flatnonzero(chunk.converted)[conversion_rows]]
    user, ad = chunk.user[impression_rows], chunk.ad[impression_rows]
    return [
        f"{head % (i, t)}{user_id}{ad_fields}{surface}{conversion_tail}{user_attrs}"
        for i, t, user_id, ad_fields, surface, conversion_tail, user_attrs in zip(
            chunk.impression_index[impression_rows].tolist(),
            chunk.conversion_time[conversion_rows].tolist(),
            frags.user_id[user].tolist(),
            frags.ad_fields[ad].tolist(),
            frags.surface[chunk.surface[impression_rows]].tolist(),
            frags.conversion_tail[ad].tolist(),
            frags.user_attrs[user].tolist(),
        )
    ]


# ==================================================================================================
# Dirty rows.


def dirty_line(
    kind: str, variant: int, clean_line: str, serial: int, arrival_end_ms: int, rng: np.random.Generator
) -> str:
    """A copy of a clean line with exactly one defect of `kind`.

    `variant` (how many lines of this kind the file already has) rotates which field is broken;
    `serial` makes the fresh event id unique within the file. Each defect trips only its own ingest
    rule: the line stays valid JSON with all columns and types except where the defect says
    otherwise.
    """
    if kind == "duplicate_event_id":
        return clean_line
    event = json.loads(clean_line)
    event["event_id"] = f"{event['event_id']}-d{serial}"
    if kind == "malformed_json":
        text = _compact_json(event)
        return text[: len(text) * 2 // 3]  # cut mid-object: never parseable
    if kind == "wrong_type":
        if variant % 2 == 1 and event["position"] is not None:
            event["position"] = "3rd"
        else:
            event["event_time"] = "yesterday"
    elif kind in ("null_id", "empty_id"):
        event[ID_COLUMNS[variant % len(ID_COLUMNS)]] = None if kind == "null_id" else ""
    elif kind == "unknown_surface":
        event["surface"] = UNKNOWN_SURFACES[variant % len(UNKNOWN_SURFACES)]
    elif kind == "negative_timestamp":
        event["event_time"] = -int(rng.integers(1000, 10**9))
    elif kind == "far_future_timestamp":
        event["event_time"] = FAR_FUTURE_MS + int(rng.integers(0, 365 * DAY_MS))
    elif kind == "event_after_arrival":
        event["event_time"] = arrival_end_ms + int(rng.integers(HOUR_MS, 6 * HOUR_MS))
    else:
        raise ValueError(f"unknown dirty kind {kind!r}; known: {DIRTY_KINDS}")
    return _compact_json(event)


class DirtyPlanter:
    """Adds floor(fraction * clean lines so far) dirty lines to one landing file, streaming.

    Kinds cycle through DIRTY_KINDS in order, so any file with at least len(DIRTY_KINDS) dirty lines
    has every kind; the counts per kind are exact and go into the file's sidecar manifest.
    """

    def __init__(self, fraction: float, arrival_ds: str):
        self.fraction = fraction
        self.arrival_end_ms = (dt.date.fromisoformat(arrival_ds) - EPOCH).days * DAY_MS + DAY_MS
        self.clean = 0
        self.dirty = 0
        self.counts: dict[str, int] = {kind: 0 for kind in DIRTY_KINDS}

    def plant(self, clean_lines: list[str], rng: np.random.Generator) -> list[str]:
        """Count `clean_lines` and return the dirty lines due for them (derived from them)."""
        self.clean += len(clean_lines)
        due = int(np.floor(self.fraction * self.clean)) - self.dirty
        if due <= 0 or not clean_lines:
            return []
        sources = np.sort(rng.choice(len(clean_lines), size=min(due, len(clean_lines)), replace=False))
        out = []
        for source in sources.tolist():
            kind = DIRTY_KINDS[self.dirty % len(DIRTY_KINDS)]
            out.append(dirty_line(kind, self.counts[kind], clean_lines[source], self.dirty, self.arrival_end_ms, rng))
            self.counts[kind] += 1
            self.dirty += 1
        return out


# ==================================================================================================
# Landing output: one file (+ sidecar manifest) per arrival day.


def landing_file_name(source_ds: str) -> str:
    """Base name of the landing file generator day `source_ds` writes into each arrival day."""
    return f"events-from-{source_ds}"


def sidecar_path(landing_root: str, arrival_ds: str, source_ds: str) -> Path:
    return partition_dir(landing_root, arrival_ds) / f"{landing_file_name(source_ds)}.manifest.json"


def _write_json_atomically(path: Path, payload: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(payload, sort_keys=True, indent=1))
    os.replace(tmp, path)


class ArrivalFiles:
    """The open landing files of one generator day, keyed by arrival-day offset 0..7."""

    def __init__(self, cfg: GemConfig, source_ds: str):
        self.landing_root = cfg.landing_root
        self.source_ds = source_ds
        start = dt.date.fromisoformat(source_ds)
        self.arrival_days = [(start + dt.timedelta(days=k)).isoformat() for k in range(ARRIVAL_DAYS)]
        self.files: list[LandingFile] = []
        self.planters = [DirtyPlanter(cfg.generator.dirty_fraction, day) for day in self.arrival_days]
        self.clean_by_type = [{"impression": 0, "click": 0, "conversion": 0} for _ in self.arrival_days]
        try:
            for day in self.arrival_days:
                self.files.append(LandingFile(self.landing_root, day, landing_file_name(source_ds)))
        except BaseException:
            self.abort()
            raise

    def write(self, offset: int, lines_by_type: dict[str, list[str]], rng: np.random.Generator) -> int:
        """Write one chunk's clean lines for arrival day `offset`, then its dirty lines; lines written."""
        clean = list(itertools.chain.from_iterable(lines_by_type.values()))
        for event_type, lines in lines_by_type.items():
            self.clean_by_type[offset][event_type] += len(lines)
        dirty = self.planters[offset].plant(clean, rng)
        for block in (clean, dirty):
            if block:
                self.files[offset].write_text("\n".join(block) + "\n", len(block))
        return len(clean) + len(dirty)

    def file_manifest(self, offset: int) -> dict[str, Any]:
        planter = self.planters[offset]
        return {
            "source_ds": self.source_ds,
            "arrival_ds": self.arrival_days[offset],
            "file": self.files[offset].path.name,
            "lines": planter.clean + planter.dirty,
            "clean": planter.clean,
            "clean_by_event_type": dict(self.clean_by_type[offset]),
            "dirty": dict(planter.counts),
        }

    def commit(self) -> dict[str, dict[str, Any]]:
        """Write every sidecar, then publish every data file; the per-arrival-day manifests."""
        manifests = {}
        for offset, landing_file in enumerate(self.files):
            arrival_ds = self.arrival_days[offset]
            manifests[arrival_ds] = self.file_manifest(offset)
            _write_json_atomically(sidecar_path(self.landing_root, arrival_ds, self.source_ds), manifests[arrival_ds])
            landing_file.close(commit=True)
        return manifests

    def abort(self) -> None:
        for landing_file in self.files:
            landing_file.close(commit=False)


def expected_landing_counts(landing_root: str, ds: str) -> dict[str, Any]:
    """What ingest of arrival day `ds` must produce, from the generators' sidecars in that folder.

    Returns {"clean": rows bronze must receive, "quarantine": {reason: count}}, reasons mapped
    from dirty kinds via DIRTY_KIND_REASON; reasons with no lines are left out.
    """
    clean = 0
    quarantine: dict[str, int] = {}
    for sidecar in sorted(partition_dir(landing_root, ds).glob("*.manifest.json")):
        manifest = json.loads(sidecar.read_text())
        clean += manifest["clean"]
        for kind, count in manifest["dirty"].items():
            if count:
                reason = DIRTY_KIND_REASON[kind]
                quarantine[reason] = quarantine.get(reason, 0) + count
    return {"clean": clean, "quarantine": dict(sorted(quarantine.items()))}


# ==================================================================================================
# The day.


def _day_start_ms(ds: str) -> int:
    return (dt.date.fromisoformat(ds) - EPOCH).days * DAY_MS


def _write_chunk(
    files: ArrivalFiles, world: World, ymd: str, chunk: ChunkEvents, day_start_ms: int, rng: np.random.Generator
) -> int:
    """Route a chunk's impressions, clicks and conversions to their arrival-day files; lines written."""
    click_offset = (chunk.click_time - day_start_ms) // DAY_MS  # (clicks,) 0 or 1
    conversion_offset = (chunk.conversion_time - day_start_ms) // DAY_MS  # (conversions,) 0..7
    click_impression_rows = np.flatnonzero(chunk.clicked)  # (clicks,)
    impression_head, click_head = _line_head(ymd, "impression", ""), _line_head(ymd, "click", "-c")
    written = 0
    for offset in range(ARRIVAL_DAYS):
        clicks = np.flatnonzero(click_offset == offset)
        impressions = np.arange(len(chunk.impression_time)) if offset == 0 else np.arange(0)
        lines_by_type = {
            "impression": positioned_lines(
                world, impression_head, impressions, chunk.impression_time[impressions], chunk
            ),
            "click": positioned_lines(
                world, click_head, click_impression_rows[clicks], chunk.click_time[clicks], chunk
            ),
            "conversion": conversion_lines(world, ymd, chunk, np.flatnonzero(conversion_offset == offset)),
        }
        written += files.write(offset, lines_by_type, rng)
    return written


def _simulate_day(cfg: GemConfig, ds: str, world: World, state: EngagementState, files: ArrivalFiles) -> dict[str, int]:
    """Simulate day `ds` chunk by chunk into `files`, updating `state` after each chunk; event totals.

    Chunk k covers the traffic quantiles [k*C/N, (k+1)*C/N) of the diurnal curve, so chunks are
    time-ordered and history decays by the wall-clock span each chunk covers.
    """
    g = cfg.generator
    if g.chunk_impressions <= 0:
        raise ValueError(f"generator.chunk_impressions must be positive, got {g.chunk_impressions}")
    ymd = dt.date.fromisoformat(ds).strftime("%Y%m%d")
    sim_rng = np.random.default_rng([g.seed, SIMULATION_STREAM, int(ymd)])
    dirty_rng = np.random.default_rng([g.seed, DIRTY_STREAM, int(ymd)])
    clock = DiurnalClock.build()
    day_start_ms = _day_start_ms(ds)
    last_arrival_end_ms = day_start_ms + ARRIVAL_DAYS * DAY_MS
    half_life_ms = HISTORY_HALF_LIFE_HOURS * HOUR_MS
    totals = {"impression": 0, "click": 0, "conversion": 0}
    for first in range(0, g.events_per_day, g.chunk_impressions):
        n = min(g.chunk_impressions, g.events_per_day - first)
        lo, hi = first / g.events_per_day, (first + n) / g.events_per_day
        times = day_start_ms + clock.ms_of_day(np.sort(sim_rng.uniform(lo, hi, size=n)))
        chunk = simulate_chunk(
            world, recent_engagement(state), g.history_weight, sim_rng, times, first, last_arrival_end_ms
        )
        _write_chunk(files, world, ymd, chunk, day_start_ms, dirty_rng)
        window_ms = float(clock.ms_of_day(np.asarray([hi]))[0] - clock.ms_of_day(np.asarray([lo]))[0])
        clicked_ads = chunk.ad[chunk.clicked]
        state.decay_and_add(0.5 ** (window_ms / half_life_ms), chunk.user[chunk.clicked], world.ad_latent[clicked_ads])
        totals["impression"] += n
        totals["click"] += len(chunk.click_time)
        totals["conversion"] += len(chunk.conversion_time)
    return totals


def generate_day(cfg: GemConfig, ds: str) -> dict[str, Any]:
    """Simulate day `ds`, write its landing files and state, mark ds complete; the run's manifest.

    Order: landing files (each with its sidecar), then the day's state, then ds's `_SUCCESS` last,
    so a reader that sees the marker sees everything; a failed run leaves no marker and no state.
    """
    g = cfg.generator
    world = build_world(cfg)
    state = state_before(cfg, ds, world)
    clear_partition_complete(cfg.landing_root, ds)
    files = ArrivalFiles(cfg, ds)
    try:
        totals = _simulate_day(cfg, ds, world, state, files)
        file_manifests = files.commit()
    except BaseException:
        files.abort()
        raise

    save_state(cfg, ds, state)
    manifest = {
        "producer": PRODUCER,
        "ds": ds,
        "seed": g.seed,
        "world": json.loads(_world_fingerprint(cfg)),
        "events": totals,
        "lines": sum(m["lines"] for m in file_manifests.values()),
        "dirty": sum(sum(m["dirty"].values()) for m in file_manifests.values()),
        "files": file_manifests,
        "state": f"_generator/state/ds={ds}.npz",
    }
    mark_partition_complete(cfg.landing_root, ds, manifest)
    return manifest


# ==================================================================================================
# CLI.


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ds", required=True, help="day to generate, YYYY-MM-DD")
    parser.add_argument("--users", type=int, default=None, help="override generator.users")
    parser.add_argument("--events", type=int, default=None, help="override generator.events_per_day (impressions)")
    parser.add_argument("--seed", type=int, default=None, help="override generator.seed")
    add_config_arg(parser)
    args = parser.parse_args(argv)
    try:
        dt.date.fromisoformat(args.ds)
    except ValueError:
        parser.error(f"--ds must be YYYY-MM-DD, got {args.ds!r}")
    return args


def config_from_args(args: argparse.Namespace) -> GemConfig:
    """The config file/env config with the CLI's generator overrides on top."""
    flags = {"users": args.users, "events_per_day": args.events, "seed": args.seed}
    overrides = {k: v for k, v in flags.items() if v is not None}
    return load_config(args.config, overrides={"generator": overrides} if overrides else None)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    cfg = config_from_args(args)
    started = time.perf_counter()
    manifest = generate_day(cfg, args.ds)
    seconds = time.perf_counter() - started
    events = manifest["events"]
    print(
        f"generate_events ds={args.ds}: {manifest['lines']} lines ({events['impression']} impressions, "
        f"{events['click']} clicks, {events['conversion']} conversions, {manifest['dirty']} dirty) "
        f"in {seconds:.1f}s = {manifest['lines'] / max(seconds, 1e-9):,.0f} events/s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The synthetic world: users, ads, campaigns and surfaces of one seed, fixed across days.

`build_world(cfg)` draws it from `generator.seed` alone, so every day of one seed sees the same
world; the JSON fragments of every user, ad and (surface, position) are rendered once here, so a
day's serialization is gathers, not json.dumps.

The structure a foundation model is meant to find is planted here (static parts) and in
gem.sources.engagement (parts that evolve with time), and combined per impression by
gem.sources.simulation:

- interests shared across surfaces: users and ads share latent topic vectors (N_TOPICS clusters);
  affinity = (user interest) . ad enters the click and the conversion logit on every surface, so a
  click on one surface says something about every other;
- long-range interests that drift slowly: a user's interest is a static vector plus a drift that
  follows a per-day AR(1) process (INTEREST_DRIFT_RHO, stationary norm ~ INTEREST_DRIFT_STD), so
  what a user clicked weeks ago still points the right way but less than last week; the user's
  lifelong click sequence reveals it, while the feature counters (clicks and CTRs over 1/7/28
  days) do not say which topics;
- per-event-type signal: recent clicks raise the click logit of similar ads (history_weight *
  h_u . ad, h_u the 24 h-decayed mean clicked-ad vector), recent impressions lower it (ad fatigue,
  FATIGUE_WEIGHT * f_u . ad, f_u the FATIGUE_HALF_LIFE_HOURS-decayed mean of impressed-ad vectors),
  and conversions reveal a per-user intent for each conversion type (INTENT_STD) that clicks do
  not show: clicks, impressions and conversions say different things;
- time-gap effects: both the engagement boost and the fatigue decay with the time since the event
  (half-lives above), so an event's age (the sequences' time gap) matters, and the day is
  simulated in at least `generator.min_chunks_per_day` time-ordered chunks so this holds within a day;
- sparse conversion tasks whose signal overlaps the click tasks: the conversion logit shares the
  affinity term (CVR_AFFINITY_WEIGHT) with the click logit, so the data-rich click tasks teach the
  interests that the sparse conversion tasks need;
- heterogeneity the counters and id embeddings can learn: a per-user click propensity
  (USER_BIAS_STD) and a per-ad quality bias (AD_BIAS_STD), as real users' and ads' click rates
  differ several-fold;
- plus surface base rates and position decay and per-objective base CVRs.

Changing any of these changes the world: WORLD_VERSION is part of the saved state's fingerprint.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gem.config import GemConfig
from schemas.tasks import CONVERSION_TYPES, CREATIVE_TYPES, OBJECTIVES

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
AD_BIAS_STD = 0.8  # per-ad quality bias in the click logit (ads' CTRs differ several-fold)
USER_BIAS_STD = 0.8  # per-user click propensity in the click logit (so do users')
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
# Slow interest drift: per-day AR(1) on a vector added to the user's static interest.
INTEREST_DRIFT_RHO = 0.93  # per day: half-life ~ 10 days
INTEREST_DRIFT_STD = 1.0  # stationary norm of the drift (the static interest has norm USER_INTEREST_SCALE)
# Ad fatigue: the decayed mean of recently impressed ad vectors lowers the click logit of similar ads.
FATIGUE_HALF_LIFE_HOURS = 6.0
FATIGUE_PRIOR_WEIGHT = 2.0  # pseudo-count: a user who saw few ads lately is barely fatigued
FATIGUE_WEIGHT = 1.0
# Per-user intent per conversion type (logit offset), seen only through that user's conversions.
INTENT_STD = 1.0
# Bumped whenever the world's structure changes, so state saved by another world is refused.
WORLD_VERSION = 2
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

# Independent random streams per (seed, purpose[, day]) so changing one never shifts another.
WORLD_STREAM = 0
SIMULATION_STREAM = 1
DIRTY_STREAM = 2
DRIFT_STREAM = 3


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
        user_attrs=_object_array(['"user_attrs":' + compact_json(a) + "}" for a in user_attrs]),
        ad_fields=_object_array(ad_fields),
        conversion_tail=_object_array(conversion_tail),
        surface=_object_array([f'"surface":"{s}",' for s in surfaces]),
        surface_position=_object_array(surface_position),
    )


def _object_array(strings: list[str]) -> np.ndarray:
    out = np.empty(len(strings), dtype=object)
    out[:] = strings
    return out


def compact_json(obj: dict[str, Any]) -> str:
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
    ad_conversion_type: np.ndarray  # (ads,) int64 index into CONVERSION_TYPES of the ad's objective
    user_bias: np.ndarray  # (users,) float32: click propensity (logit offset)
    user_intent: np.ndarray  # (users, conversion types) float32: logit offset of each conversion type
    user_drift_start: np.ndarray  # (users, dim) float32: the interest drift on the start day (stationary draw)
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


def sample_from_cdf(cdf: np.ndarray, u: np.ndarray) -> np.ndarray:
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
    ad_advertiser = sample_from_cdf(_cdf(advertiser_size), rng.random(g.ads))
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

    # Drawn last, so the static world above does not depend on them.
    user_bias = (USER_BIAS_STD * rng.standard_normal(g.users)).astype(np.float32)
    user_intent = (INTENT_STD * rng.standard_normal((g.users, len(CONVERSION_TYPES)))).astype(np.float32)
    user_drift_start = (INTEREST_DRIFT_STD * rng.standard_normal((g.users, dim)) / np.sqrt(dim)).astype(np.float32)
    ad_conversion_type = np.asarray(
        [CONVERSION_TYPES.index(OBJECTIVE_CONVERSION_TYPE[OBJECTIVES[o]]) for o in ad_objective.tolist()], dtype=np.int64
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
        ad_conversion_type=ad_conversion_type,
        user_bias=user_bias,
        user_intent=user_intent,
        user_drift_start=user_drift_start,
        fragments=_render_fragments(cfg.surfaces, user_attrs, ad_advertiser, ad_campaign, ad_objective, ad_creative),
    )

"""The parts of the world that evolve with time, per user, carried across days.

- recent engagement h_u: the decayed mean of clicked-ad vectors (HISTORY_HALF_LIFE_HOURS); the
  click logit adds history_weight * h_u . ad, so click sequences carry signal;
- fatigue f_u: the decayed mean of impressed-ad vectors (FATIGUE_HALF_LIFE_HOURS, shrunk by
  FATIGUE_PRIOR_WEIGHT); the click logit subtracts FATIGUE_WEIGHT * f_u . ad, so impression
  sequences (and their time gaps) carry signal;
- interest drift: a per-day AR(1) vector added to the user's static interest (INTEREST_DRIFT_RHO),
  so long histories point where the user's interest was, recent ones where it is.

The state after day D is saved as `{lakehouse_uri}/_generator/state/ds=D.npz` (written whole
through gem.storage, so the lakehouse may be an object store; with the world's fingerprint), and day
D starts from day D-1's: rerunning a day reproduces it byte for byte.
"""

from __future__ import annotations

import io
import json
import zipfile
from dataclasses import dataclass

import numpy as np

from gem import storage
from gem.config import GemConfig
from gem.sources.world import (
    DRIFT_STREAM,
    FATIGUE_HALF_LIFE_HOURS,
    FATIGUE_PRIOR_WEIGHT,
    HISTORY_HALF_LIFE_HOURS,
    HISTORY_PRIOR_WEIGHT,
    HOUR_MS,
    INTEREST_DRIFT_RHO,
    INTEREST_DRIFT_STD,
    WORLD_VERSION,
    World,
)


class MissingGeneratorState(FileNotFoundError):
    """Day D needs day D-1's engagement state, which is absent although earlier days have state."""


class IncompatibleGeneratorState(ValueError):
    """A saved engagement state was produced for a different world (seed, sizes, surfaces)."""


# ==================================================================================================
# Recent-engagement state, carried across days.


@dataclass
class EngagementState:
    """Per user: decayed clicked-ad and impressed-ad vectors (sums and weights), interest drift."""

    clicked_sum: np.ndarray  # (users, dim) float64
    clicked_weight: np.ndarray  # (users,) float64
    impressed_sum: np.ndarray  # (users, dim) float64
    impressed_weight: np.ndarray  # (users,) float64
    drift: np.ndarray  # (users, dim) float64

    ARRAYS = ("clicked_sum", "clicked_weight", "impressed_sum", "impressed_weight", "drift")

    @classmethod
    def fresh(cls, world: World) -> EngagementState:
        """The state before the start day: no engagement yet, the drift at its stationary start draw."""
        n, dim = world.n_users, world.latent_dim
        return cls(np.zeros((n, dim)), np.zeros(n), np.zeros((n, dim)), np.zeros(n),
                   world.user_drift_start.astype(np.float64))

    def start_day(self, seed: int, ymd: int) -> None:
        """Advance the interest drift by one day: drift <- rho * drift + sqrt(1 - rho^2) * noise, with the
        noise drawn from the day's own stream, so the drift keeps its stationary spread."""
        rng = np.random.default_rng([seed, DRIFT_STREAM, ymd])
        noise = INTEREST_DRIFT_STD * rng.standard_normal(self.drift.shape) / np.sqrt(self.drift.shape[1])
        self.drift = INTEREST_DRIFT_RHO * self.drift + np.sqrt(1.0 - INTEREST_DRIFT_RHO**2) * noise

    def advance(self, elapsed_ms: float, users: np.ndarray, ad_vectors: np.ndarray, clicked: np.ndarray) -> None:
        """Age the decayed memories by `elapsed_ms`, then add a chunk's impressions (users[i] saw
        ad_vectors[i]) and, where clicked[i], its clicks."""
        click_decay = 0.5 ** (elapsed_ms / (HISTORY_HALF_LIFE_HOURS * HOUR_MS))
        self.clicked_sum *= click_decay
        self.clicked_weight *= click_decay
        impression_decay = 0.5 ** (elapsed_ms / (FATIGUE_HALF_LIFE_HOURS * HOUR_MS))
        self.impressed_sum *= impression_decay
        self.impressed_weight *= impression_decay
        vectors = ad_vectors.astype(np.float64)
        np.add.at(self.impressed_sum, users, vectors)
        np.add.at(self.impressed_weight, users, 1.0)
        np.add.at(self.clicked_sum, users[clicked], vectors[clicked])
        np.add.at(self.clicked_weight, users[clicked], 1.0)

    def recent_clicks(self, users: np.ndarray | slice = slice(None)) -> np.ndarray:
        """h_u: the decayed mean clicked-ad vector of `users` (default all), shrunk toward 0 for users
        with few recent clicks (a user with none has h = 0); shape (n, dim)."""
        return self.clicked_sum[users] / (self.clicked_weight[users] + HISTORY_PRIOR_WEIGHT)[:, None]

    def recent_impressions(self, users: np.ndarray | slice = slice(None)) -> np.ndarray:
        """f_u: the decayed mean impressed-ad vector of `users`, shrunk the same way; shape (n, dim)."""
        return self.impressed_sum[users] / (self.impressed_weight[users] + FATIGUE_PRIOR_WEIGHT)[:, None]


def state_dir(cfg: GemConfig) -> str:
    """The URI (or local path) under which the generator's end-of-day states live."""
    return storage.join(cfg.lakehouse_uri, "_generator", "state")


def state_path(cfg: GemConfig, ds: str) -> str:
    """Where the engagement state at the end of day `ds` lives."""
    return storage.join(state_dir(cfg), f"ds={ds}.npz")


def world_fingerprint(cfg: GemConfig) -> str:
    """What a saved state must match to be reused: the world's seed, sizes and surfaces."""
    g = cfg.generator
    keys = {"seed": g.seed, "users": g.users, "ads": g.ads, "advertisers": g.advertisers, "latent_dim": g.latent_dim,
            "world_version": WORLD_VERSION, "burn_in_days": g.burn_in_days}
    return json.dumps({**keys, "surfaces": list(cfg.surfaces)}, sort_keys=True)


def _write_npz(uri: str, arrays: dict[str, np.ndarray]) -> None:
    """An .npz (readable by np.load) with fixed zip timestamps, so equal arrays give equal bytes;
    built in memory and written whole (gem.storage.write), so a reader never sees part of it."""
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w", compression=zipfile.ZIP_STORED) as zf:
        for name, array in arrays.items():
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, np.asanyarray(array), allow_pickle=False)
            zf.writestr(zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0)), buffer.getvalue())
    storage.write(uri, archive.getvalue())


def save_state(cfg: GemConfig, ds: str, state: EngagementState) -> str:
    """Persist the end-of-day state for `ds`, written whole; its URI."""
    path = state_path(cfg, ds)
    _write_npz(
        path,
        {
            **{name: getattr(state, name) for name in EngagementState.ARRAYS},
            "world": np.asarray(world_fingerprint(cfg)),
            "ds": np.asarray(ds),
        },
    )
    return path


def load_state(cfg: GemConfig, ds: str) -> EngagementState:
    """The saved end-of-day state of `ds`, checked against this config's world."""
    path = state_path(cfg, ds)
    with storage.open_read(path) as f, np.load(f, allow_pickle=False) as saved:
        saved_world = str(saved["world"]) if "world" in saved.files else "(none)"
        if saved_world != world_fingerprint(cfg):
            raise IncompatibleGeneratorState(
                f"generator state {path} was written for world {saved_world}, "
                f"but this config's world is {world_fingerprint(cfg)}; regenerate from the start day"
            )
        return EngagementState(**{name: saved[name].copy() for name in EngagementState.ARRAYS})

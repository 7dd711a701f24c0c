"""Recent engagement: each user's decayed memory of the ads they clicked, carried across days.

The click logit adds h_u . ad (h_u the decayed mean of clicked-ad vectors), so click sequences
carry signal. The state after day D is saved as `{lakehouse_uri}/_generator/state/ds=D.npz`
(atomically, with the world's fingerprint), and day D starts from day D-1's: rerunning a day
reproduces it byte for byte.
"""

from __future__ import annotations

import datetime as dt
import io
import json
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gem.config import GemConfig
from gem.sources.world import HISTORY_PRIOR_WEIGHT, World


class MissingGeneratorState(FileNotFoundError):
    """Day D needs day D-1's engagement state, which is absent although earlier days have state."""


class IncompatibleGeneratorState(ValueError):
    """A saved engagement state was produced for a different world (seed, sizes, surfaces)."""


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


def world_fingerprint(cfg: GemConfig) -> str:
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
            "world": np.asarray(world_fingerprint(cfg)),
            "ds": np.asarray(ds),
        },
    )
    return path


def load_state(cfg: GemConfig, ds: str) -> EngagementState:
    """The saved end-of-day state of `ds`, checked against this config's world."""
    path = state_path(cfg, ds)
    with np.load(path, allow_pickle=False) as saved:
        saved_world = str(saved["world"])
        if saved_world != world_fingerprint(cfg):
            raise IncompatibleGeneratorState(
                f"generator state {path} was written for world {saved_world}, "
                f"but this config's world is {world_fingerprint(cfg)}; regenerate from the start day"
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

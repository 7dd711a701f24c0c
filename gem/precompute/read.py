"""Reading precomputed user embeddings without Spark: the Delta log and pyarrow.

For (user, ds): the newest precompute day P <= ds (its completion record names the table versions
to read) fixes the model in force; the user's embedding is their row with the greatest partition
day in [P's refresh day, P] (carried forward: an unchanged user keeps the row of the day it was
last computed). A hit is such a row with P's model version; a miss is a user precompute has no
valid row for (no sequences when it last ran, e.g. a new user), whom a student must serve without
the foundation model's embedding. `age_days` = ds - the row's day: how stale the cached
representation is at use.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from gem.config import GemConfig
from gem.data.delta_log import read_table
from gem.days import day_range, shift_day
from gem.lakehouse import completions, tables
from gem.precompute.plan import STAGE
from gem.precompute.shards import shard_of
from schemas.precompute import GOLD_FM_USER_EMBEDDINGS, GOLD_PRECOMPUTE_STATS


@dataclass(frozen=True)
class CachedEmbedding:
    user_id: str
    hit: bool
    embedding: np.ndarray | None  # (tokens, d) float32 on a hit
    computed_ds: str | None
    model_version: str | None
    age_days: int | None


class NoPrecomputeError(LookupError):
    """No precompute day at or before the day asked for."""


def user_embeddings(cfg: GemConfig, user_ids: list[str], ds: str) -> list[CachedEmbedding]:
    """The embedding of each of `user_ids` for day ds, in order, with its hit/miss indicator (module doc)."""
    day, record = ds, None
    while day >= cfg.start_ds and (record := completions.completion(cfg, STAGE, day)) is None:
        day = shift_day(day, -1)
    if record is None:
        raise NoPrecomputeError(f"no precompute record at or before ds={ds}; run `python -m jobs.precompute --ds {ds}`")
    versions = record["table_versions"]
    (stats,) = read_table(tables.table_path(cfg, GOLD_PRECOMPUTE_STATS), versions[GOLD_PRECOMPUTE_STATS.name],
                          columns=["model_version", "refresh_ds", "shards"], where={"ds": day}).to_pylist()
    shards = {str(s) for s in shard_of(pa.array(user_ids, pa.string()), stats["shards"])}
    valid_days = set(day_range(stats["refresh_ds"].isoformat(), day))
    rows = read_table(tables.table_path(cfg, GOLD_FM_USER_EMBEDDINGS), versions[GOLD_FM_USER_EMBEDDINGS.name],
                      columns=["ds", "user_id", "embedding", "tokens", "model_version"],
                      where={"ds": valid_days, "shard": shards})
    newest: dict[str, dict] = {}
    wanted = set(user_ids)
    for row in rows.to_pylist():
        user = row["user_id"]
        valid = user in wanted and row["model_version"] == stats["model_version"]
        if valid and (user not in newest or row["ds"] > newest[user]["ds"]):
            newest[user] = row
    asked = dt.date.fromisoformat(ds)
    out = []
    for user in user_ids:
        row = newest.get(user)
        if row is None:
            out.append(CachedEmbedding(user, False, None, None, None, None))
            continue
        flat = np.asarray(row["embedding"], dtype=np.float32)
        out.append(CachedEmbedding(user, True, flat.reshape(row["tokens"], -1), row["ds"].isoformat(),
                                   row["model_version"], (asked - row["ds"]).days))
    return out

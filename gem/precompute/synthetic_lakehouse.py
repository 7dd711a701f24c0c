"""A small lakehouse of the tables precompute reads, written without Spark: the precompute tests'
and the precompute benchmark's (bench.precompute) input.

Real Delta tables (through `deltalake`, with the schemas' constraints) of the tables precompute
reads: silver.user_sequences (each day, the active users' cumulative sequences), silver.user_features
and silver.ad_features, silver.training_examples (one row per impression of the day, held out with
attribution_window_days 0), the completion records the stage needs (stand-ins for the stages not
run here), and a promoted Kunlun checkpoint of the config's model (random weights: what precompute
is checked or timed on is writing what the model computes, not what the model learned).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import torch
from deltalake import write_deltalake

from gem.config import GemConfig
from gem.data.encode import DENSE_COLUMNS, hash_ids
from gem.data.loader import SPARSE_FEATURES
from gem.days import day_range, shift_day
from gem.lakehouse import completions, tables
from gem.model.build import build_task
from gem.train import checkpoint, promotion
from gem.train.daily import checkpoint_root
from gem.train.trainer import jsonable
from schemas.examples import SILVER_TRAINING_EXAMPLES
from schemas.features import SILVER_AD_FEATURES, SILVER_USER_FEATURES
from schemas.ids import HASHED_IDS, hash_column
from schemas.sequences import SILVER_USER_SEQUENCES
from schemas.table import TableSchema
from schemas.tasks import CREATIVE_TYPES, OBJECTIVES

TASKS = ("fb_feed/click", "fb_feed/lead", "reels/click", "reels/lead")
SURFACES = ("fb_feed", "reels")
START = "2026-01-01"


def _fill(schema: TableSchema, columns: dict[str, Any], n: int) -> pa.Table:
    """`columns` plus every other column of `schema` at a neutral value (0, the first allowed value)."""
    arrow = schema.arrow_schema()
    data = {}
    for col in schema.columns:
        if col.name in columns:
            data[col.name] = pa.array(columns[col.name], arrow.field(col.name).type)
        elif col.nullable:
            data[col.name] = pa.nulls(n, arrow.field(col.name).type)
        else:
            value = col.allowed[0] if col.allowed else 0
            data[col.name] = pa.array([value] * n).cast(arrow.field(col.name).type)
    return pa.table(data, schema=arrow)


def write_partition(cfg: GemConfig, schema: TableSchema, ds: str, columns: dict[str, Any], n: int) -> int:
    """Replace partition ds of `schema` with the rows; -> the version created."""
    path = tables.ensure_table(None, cfg, schema)
    write_deltalake(tables.delta_table(path), _fill(schema, {"ds": [dt.date.fromisoformat(ds)] * n, **columns}, n), mode="overwrite",
                    predicate=tables.predicate({"ds": ds}), partition_by=list(schema.partition_by))
    return tables.latest_version(path)


@dataclass
class World:
    """Users' events, day by day: user -> list of event dicts (oldest first) per event type."""

    users: list[str]
    ads: list[str]
    events: dict[str, dict[str, list[dict]]] = field(default_factory=dict)


def _element(ad: str, surface: str, time: dt.datetime, eid: str) -> dict:
    ids = {"ad_id": ad, "advertiser_id": f"adv{ad[1:]}", "campaign_id": f"c{ad[1:]}"}
    return {"event_time": time, "event_id": eid, **ids, "surface": surface,
            "objective": OBJECTIVES[int(ad[1:]) % len(OBJECTIVES)], **_hashes(ids)}


def _hashes(ids: dict[str, str]) -> dict[str, int]:
    """Each id's hash column, as the Spark stages write it (schemas/ids.py)."""
    return {hash_column(name): int(hash_ids(pa.array([value]))[0]) for name, value in ids.items()}


def write_day(cfg: GemConfig, world: World, ds: str, active: list[str], rng: np.random.Generator,
              impressions_per_user: int = 4) -> dict[str, int]:
    """Day ds: `active` users get impressions (some clicked); sequences, features and examples of ds
    written, their records published. -> the versions written."""
    start = dt.datetime.fromisoformat(ds).replace(tzinfo=dt.UTC)
    examples: dict[str, list] = {k: [] for k in ("impression_id", "impression_time", "user_id", "ad_id", "advertiser_id",
                                                 "campaign_id", "objective", "creative_type", "position",
                                                 "sequence_ds", "features_ds", "surface", "label_click")}
    for u in active:
        seq = world.events.setdefault(u, {"impression": [], "click": []})
        for k in range(impressions_per_user):
            ad = world.ads[int(rng.integers(len(world.ads)))]
            surface = SURFACES[int(rng.integers(len(SURFACES)))]
            when = start + dt.timedelta(seconds=int(rng.integers(1, 86_000)))
            eid = f"i-{ds}-{u}-{k}"
            seq["impression"].append(_element(ad, surface, when, eid))
            clicked = bool(rng.random() < 0.3)
            if clicked:
                seq["click"].append(_element(ad, surface, when + dt.timedelta(seconds=5), f"c-{ds}-{u}-{k}"))
            for name, value in (("impression_id", eid), ("impression_time", when), ("user_id", u), ("ad_id", ad),
                                ("advertiser_id", f"adv{ad[1:]}"), ("campaign_id", f"c{ad[1:]}"),
                                ("objective", OBJECTIVES[int(ad[1:]) % len(OBJECTIVES)]),
                                ("creative_type", CREATIVE_TYPES[0]), ("position", k),
                                ("sequence_ds", start.date()), ("features_ds", start.date()), ("surface", surface),
                                ("label_click", int(clicked))):
                examples[name].append(value)
        for events in seq.values():
            events.sort(key=lambda e: (e["event_time"], e["event_id"]))
    rows = sorted(active)
    sequences = {
        "user_id": rows,
        "impressions": [world.events[u]["impression"] for u in rows],
        "clicks": [world.events[u]["click"] for u in rows],
        "conversions": [[] for _ in rows],
        "n_impressions": [len(world.events[u]["impression"]) for u in rows],
        "n_clicks": [len(world.events[u]["click"]) for u in rows],
        "last_event_time": [max(e["event_time"] for t in world.events[u].values() for e in t) for u in rows],
    }
    n_ex = len(examples["impression_id"])
    for name in HASHED_IDS:
        examples[hash_column(name)] = hash_ids(pa.array(examples[name], pa.string())).tolist()
    counters = {c.name: rng.integers(0, 5, n_ex).tolist() for c in SILVER_TRAINING_EXAMPLES.columns
                if c.name in DENSE_COLUMNS and not c.nullable}
    versions = {
        SILVER_USER_SEQUENCES.name: write_partition(cfg, SILVER_USER_SEQUENCES, ds, sequences, len(rows)),
        SILVER_USER_FEATURES.name: write_partition(
            cfg, SILVER_USER_FEATURES, ds, {"user_id": world.users}, len(world.users)),
        SILVER_AD_FEATURES.name: write_partition(
            cfg, SILVER_AD_FEATURES, ds, {"ad_id": world.ads, "advertiser_id": [f"adv{a[1:]}" for a in world.ads],
                                          "campaign_id": [f"c{a[1:]}" for a in world.ads]}, len(world.ads)),
        SILVER_TRAINING_EXAMPLES.name: write_partition(
            cfg, SILVER_TRAINING_EXAMPLES, ds, {**examples, **counters}, n_ex),
    }
    silver = {k: v for k, v in versions.items() if k != SILVER_TRAINING_EXAMPLES.name}
    completions.publish_completion(cfg, "validate_silver", ds, f"test:{ds}", None, 0, {}, silver, reconciliation="test")
    completions.publish_completion(cfg, "validate_examples", ds, f"test:{ds}", None, 0, {},
                                   {SILVER_TRAINING_EXAMPLES.name: versions[SILVER_TRAINING_EXAMPLES.name]},
                                   reconciliation="test")
    return versions


def promote_model(cfg: GemConfig, ds: str, seed: int = 0, step: int = 1) -> Any:
    """The config's model with seeded random weights, saved and promoted as pretraining would for ds (as if
    trained through ds-1), with the mix and pretrain records of ds. -> the task (in memory, as saved)."""
    torch.manual_seed(seed)
    task = build_task(cfg.model, TASKS, SPARSE_FEATURES, len(DENSE_COLUMNS), sparse_backend="torch")
    root = checkpoint_root(cfg)
    path = checkpoint.save(checkpoint.child(root, f"{cfg.model.arch}-{ds}-{seed}"), step, {"model": task.state_dict()},
                           {"config": jsonable(cfg.to_dict())})
    promotion.promote(root, cfg.model.arch, ds, path, step, TASKS, trained_through=shift_day(ds, -1))
    publish_training_records(cfg, ds)
    return task.eval()


def publish_training_records(cfg: GemConfig, ds: str) -> None:
    """Stand-in records of the mix and pretraining of ds."""
    completions.publish_completion(cfg, "mix", ds, f"test:{ds}", None, 0, {}, {}, reconciliation="test")
    completions.publish_completion(cfg, "pretrain", ds, f"test:{ds}", None, 0, {}, {}, reconciliation="test")


def build_days(cfg: GemConfig, days: int, users: int = 40, ads: int = 12, active_share: float = 0.5,
               seed: int = 0, impressions_per_user: int = 4) -> tuple[World, list[str]]:
    """`days` days from START, a seeded `active_share` of users active each day (everyone on the first)."""
    rng = np.random.default_rng(seed)
    world = World([f"u{i:05d}" for i in range(users)], [f"a{i}" for i in range(ads)])
    dates = day_range(START, shift_day(START, days - 1))
    for k, ds in enumerate(dates):
        active = world.users if k == 0 else sorted(u for u in world.users if rng.random() < active_share)
        write_day(cfg, world, ds, active, rng, impressions_per_user)
    return world, dates

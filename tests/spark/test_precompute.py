"""Solaris precompute (gem.precompute, jobs.precompute) on a real Delta lakehouse written without
Spark (gem.precompute.synthetic_lakehouse) and a real tiny Kunlun, its shards run as Spark tasks:
what the tables hold equals what the model computes; a rerun replaces the same rows, and each Python
worker loads the model once; on a local cluster, a task killed mid-commit is rerun by Spark and the
tables equal local mode's; an incremental day equals a full recompute for the changed users and
leaves the others' rows alone; the speculative pairs' use is recorded; a missing promoted model
fails clearly, and a day without a mixture skips."""

from __future__ import annotations

import datetime as dt
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pytest
import torch
import yaml

from gem.config import load_config
from gem.data.batch import Jagged
from gem.data.delta_log import logged_files, read_table
from gem.data.encode import VOCABULARIES, hash_ids, timestamps_us, vocab_index
from gem.data.loader import EXAMPLE_COLUMNS, example_batch
from gem.days import shift_day
from gem.environment import CRASH_AT_ENV
from gem.lakehouse import completions, tables
from gem.lakehouse.commit import StageContext
from gem.lakehouse.compare import NOT_COMPARED
from gem.precompute.model import PrecomputeModel, PromotedModelMissing, user_batch
from gem.precompute.read import user_embeddings
from gem.precompute.run import run
from gem.precompute.shards import shard_of
from schemas.examples import SILVER_TRAINING_EXAMPLES
from schemas.precompute import (
    GOLD_FM_HISTORY_CODES,
    GOLD_FM_PREDICTIONS,
    GOLD_FM_SPECULATIVE_PAIRS,
    GOLD_FM_USER_EMBEDDINGS,
    GOLD_PRECOMPUTE_STATS,
    PRECOMPUTE_TABLES,
)
from tests.precompute_lakehouse import (
    World,
    build_days,
    precompute_config,
    promote_model,
    publish_training_records,
)
from tests.support import PYTHON, REPO, finished_tasks, lakehouse_rows, needs_cuda, subprocess_env

if TYPE_CHECKING:
    from gem.config import GemConfig

# In-process runs share the suite's local session (its shard tasks run in its Python workers).
pytestmark = pytest.mark.usefixtures("spark")


def contents(cfg: GemConfig, schema: Any, ds: str | None = None) -> list[dict]:
    """A table's rows (of partition ds), without the wall-clock stamp, in key order."""
    where = {"ds": ds} if ds else None
    rows = read_table(tables.table_path(cfg, schema), where=where).to_pylist()
    for r in rows:
        r.pop("computed_at", None)
        r.pop("run_id", None)
        r["input_versions"] = sorted(r.get("input_versions") or [])
    return sorted(rows, key=lambda r: tuple(str(r[k]) for k in (*schema.key, "shard") if k in r))


def partition_files(cfg: GemConfig, schema: Any, ds: str) -> set[str]:
    path = tables.table_path(cfg, schema)
    from gem.data.delta_log import table_version

    return {f.path for f in logged_files(path, table_version(path)) if f.partition["ds"] == ds}


def sequences_before(cfg: GemConfig, world: World, user: str, cut: dt.datetime) -> dict[str, Jagged]:
    """The user's sequences strictly before `cut`, the newest the model reads, encoded by hand from
    the world's events (not through the loader), gaps counted to `cut`."""
    lengths = cfg.loader.capped(cfg.model.sequence_lengths())
    cut_us = int(cut.timestamp() * 1_000_000)
    out = {}
    for event in ("impression", "click", "conversion"):
        events = [e for e in world.events.get(user, {}).get(event, []) if e["event_time"] < cut]
        events = events[len(events) - min(len(events), lengths.max_length(event)):]
        times = np.array([int(e["event_time"].timestamp() * 1_000_000) for e in events], dtype=np.int64)
        values = {
            "ad_id": torch.from_numpy(hash_ids(pa.array([e["ad_id"] for e in events], pa.string()))),
            "surface": torch.from_numpy(vocab_index(pa.array([e["surface"] for e in events], pa.string()),
                                                    VOCABULARIES["surface"])),
            "objective": torch.from_numpy(vocab_index(pa.array([e["objective"] for e in events], pa.string()),
                                                      VOCABULARIES["objective"])),
            "gap_s": torch.from_numpy(((cut_us - times) / 1e6).astype(np.float32)),
        }
        out[event] = Jagged(values, torch.tensor([0, len(events)], dtype=torch.int64))
    return out


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Three days; day 2's model promoted; precompute of day 2 (a refresh) and day 3 (incremental)."""
    cfg = precompute_config(tmp_path_factory.mktemp("precompute"))
    world, days = build_days(cfg, 3)
    model = promote_model(cfg, days[1])
    publish_training_records(cfg, days[2])  # day 3 trains nothing new: the pinned model stays
    files_day2_before = None
    results = {}
    for ds in days[1:]:
        results[ds] = run(StageContext(cfg), ds)
        if ds == days[1]:
            files_day2_before = partition_files(cfg, GOLD_FM_USER_EMBEDDINGS, ds)
    return {"cfg": cfg, "world": world, "days": days, "model": model, "results": results,
            "files_day2_before": files_day2_before}


def test_embeddings_equal_the_models_user_representation(lake: dict[str, Any]) -> None:
    cfg, world, model, day2 = lake["cfg"], lake["world"], lake["model"], lake["days"][1]
    rows = {r["user_id"]: r for r in contents(cfg, GOLD_FM_USER_EMBEDDINGS, day2)}
    assert sorted(rows) == world.users  # a refresh day computes everyone
    cut = dt.datetime.fromisoformat(shift_day(day2, 1)).replace(tzinfo=dt.UTC)
    for user in world.users[::7]:  # sampled users
        hashed = torch.from_numpy(hash_ids(pa.array([user], pa.string())))
        with torch.no_grad():
            sparse, sequences = model.body_inputs(user_batch(hashed, sequences_before(cfg, world, user, cut), ()))
            direct = model.body.user_representation(sparse, sequences)[0]  # (tokens, d)
        row = rows[user]
        stored = torch.tensor(row["embedding"]).view(row["tokens"], -1)
        torch.testing.assert_close(stored, direct, rtol=1e-5, atol=1e-6)
        assert row["model_version"] == f"kunlun@{day2}:step1"
        assert row["shard"] == int(shard_of(pa.array([user]), cfg.precompute.shards)[0])
        assert dict(row["input_versions"])["silver.user_sequences"] >= 0


def test_predictions_equal_the_models_output(lake: dict[str, Any]) -> None:
    cfg, world, model, day2 = lake["cfg"], lake["world"], lake["model"], lake["days"][1]
    examples = read_table(tables.table_path(cfg, SILVER_TRAINING_EXAMPLES), where={"ds": day2},
                          columns=[*EXAMPLE_COLUMNS, "surface"]).sort_by("impression_id")
    rows = {r["impression_id"]: r for r in contents(cfg, GOLD_FM_PREDICTIONS, day2)}
    assert sorted(rows) == examples["impression_id"].to_pylist()  # every impression, once
    for i in range(0, examples.num_rows, 9):  # sampled (user, ad) impressions
        example = examples.slice(i, 1)
        cut = example["impression_time"][0].as_py()
        ones = np.ones((1, len(model.heads.tasks)), dtype=bool)
        batch = example_batch(example, model.heads.tasks, ones, ones.astype(np.float32), {},
                              sequences_before(cfg, world, example["user_id"][0].as_py(), cut), cfg.start_ds)
        assert timestamps_us(example["impression_time"])[0] == int(cut.timestamp() * 1_000_000)
        with torch.no_grad():
            representation = model.representation(batch)
            probs = torch.sigmoid(model.heads(representation))[0]
        row = rows[example["impression_id"][0].as_py()]
        stored = dict(row["predictions"])
        torch.testing.assert_close(torch.tensor([stored[t] for t in model.heads.tasks], dtype=torch.float32), probs,
                                   rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(torch.tensor(row["representation"]), representation[0], rtol=1e-5, atol=1e-6)


def test_history_codes_are_the_autoencoders_int4_codes_of_each_logged_representation(lake: dict[str, Any]) -> None:
    """One gold.fm_history_codes row per prediction, at the impression's time: the model's own
    autoencoder applied to the stored representation, quantized and packed by hand (nibble = code + 8,
    even codes low), and the stats' bytes per user are the bytes stored over the users coded."""
    cfg, model, day2 = lake["cfg"], lake["model"], lake["days"][1]
    predictions = {r["impression_id"]: r for r in contents(cfg, GOLD_FM_PREDICTIONS, day2)}
    codes = contents(cfg, GOLD_FM_HISTORY_CODES, day2)
    assert sorted(r["impression_id"] for r in codes) == sorted(predictions)
    examples = read_table(tables.table_path(cfg, SILVER_TRAINING_EXAMPLES), where={"ds": day2},
                          columns=["impression_id", "impression_time", "user_id"]).to_pylist()
    times = {e["impression_id"]: (e["impression_time"], e["user_id"]) for e in examples}
    ae = model.history_autoencoder
    assert ae is not None
    for row in codes[::5]:
        assert (row["event_time"], row["user_id"]) == times[row["impression_id"]]
        assert row["model_version"] == predictions[row["impression_id"]]["model_version"]
        with torch.no_grad():
            z = torch.tanh(ae.encoder(ae.normalized(torch.tensor([predictions[row["impression_id"]]["representation"]]))))
        ints = [min(7, max(-8, int(v))) for v in torch.round(z * 8)[0].tolist()]
        packed = bytes((ints[i] + 8) | ((ints[i + 1] + 8) << 4) for i in range(0, len(ints), 2))
        assert row["codes"] == packed and len(packed) == cfg.model.history_codes.code_dim // 2
    (stats,) = contents(cfg, GOLD_PRECOMPUTE_STATS, day2)
    users = {r["user_id"] for r in codes}
    assert stats["history_codes"] == len(codes)
    assert stats["history_code_bytes_per_user"] == pytest.approx(len(codes) * cfg.model.history_codes.code_dim / 2
                                                                 / len(users))


def test_speculative_pairs_follow_the_policy_and_their_use_is_measured(lake: dict[str, Any]) -> None:
    cfg, world, (_, day2, day3) = lake["cfg"], lake["world"], lake["days"]
    pairs = contents(cfg, GOLD_FM_SPECULATIVE_PAIRS, day2)
    start2 = dt.datetime.fromisoformat(day2).replace(tzinfo=dt.UTC)
    # By hand from the world: the day's most impressed ads, each active user's latest distinct ads.
    todays = [(u, e["ad_id"]) for u, ev in world.events.items() for e in ev["impression"]
              if start2 <= e["event_time"] < start2 + dt.timedelta(days=1)]
    counts: dict[str, int] = {}
    for _, ad in todays:
        counts[ad] = counts.get(ad, 0) + 1
    popular = sorted(counts, key=lambda a: (-counts[a], a))[: cfg.precompute.popular_ads]
    active = sorted({u for u, _ in todays})
    expected = set()
    for u in active:
        seen = [e for e in world.events[u]["impression"] if e["event_time"] < start2 + dt.timedelta(days=1)]
        recent = list(dict.fromkeys(e["ad_id"] for e in reversed(seen)))[: cfg.precompute.recent_ads]
        expected |= {(u, a, "recent") for a in recent} | {(u, a, "popular") for a in popular if a not in recent}
    assert {(r["user_id"], r["ad_id"], r["reason"]) for r in pairs} == expected
    # Scored on day 3: day 3's impressions whose (user, ad) day 2 precomputed.
    start3 = start2 + dt.timedelta(days=1)
    impressions = [(u, e["ad_id"]) for u, ev in world.events.items() for e in ev["impression"]
                   if start3 <= e["event_time"] < start3 + dt.timedelta(days=1)]
    speculated = {(r["user_id"], r["ad_id"]) for r in pairs}
    hits = sum((u, a) in speculated for u, a in impressions)
    (stats,) = contents(cfg, GOLD_PRECOMPUTE_STATS, day3)
    assert stats["measured_ds"].isoformat() == day2
    assert (stats["impressions"], stats["hits"]) == (len(impressions), hits) and hits > 0
    assert stats["hit_rate"] == pytest.approx(hits / len(impressions))
    assert stats["wasted_share"] == pytest.approx(1 - len(speculated & set(impressions)) / len(speculated))
    assert (stats["model_age_days"], stats["input_age_days"]) == (1.0, 1.0)  # day 2's model and snapshots, used on day 3
    assert lake["results"][day3].record["rows_written"] > 0


def test_incremental_day_recomputes_changed_users_and_carries_the_others(lake: dict[str, Any]) -> None:
    cfg, world, (_, day2, day3) = lake["cfg"], lake["world"], lake["days"]
    start3 = dt.datetime.fromisoformat(day3).replace(tzinfo=dt.UTC)
    changed = sorted(u for u, ev in world.events.items()
                     if any(e["event_time"] >= start3 for t in ev.values() for e in t))
    rows = contents(cfg, GOLD_FM_USER_EMBEDDINGS, day3)
    assert [r["user_id"] for r in rows] == changed and 0 < len(changed) < len(world.users)
    (stats,) = contents(cfg, GOLD_PRECOMPUTE_STATS, day3)
    assert (stats["refreshed"], stats["users_computed"], stats["users_carried"]) == (
        False, len(changed), len(world.users) - len(changed))
    # Day 2's rows were not rewritten: the same data files as right after day 2's run.
    assert partition_files(cfg, GOLD_FM_USER_EMBEDDINGS, day2) == lake["files_day2_before"]
    # Readers: changed users get day 3's row, the others day 2's (a hit, one day old); strangers miss.
    carried = next(u for u in world.users if u not in changed)
    got = {e.user_id: e for e in user_embeddings(cfg, [changed[0], carried, "nobody"], day3)}
    assert (got[changed[0]].hit, got[changed[0]].computed_ds, got[changed[0]].age_days) == (True, day3, 0)
    assert (got[carried].hit, got[carried].computed_ds, got[carried].age_days) == (True, day2, 1)
    assert not got["nobody"].hit and got["nobody"].embedding is None
    day2_rows = {r["user_id"]: r for r in contents(cfg, GOLD_FM_USER_EMBEDDINGS, day2)}
    np.testing.assert_array_equal(got[carried].embedding.reshape(-1), np.float32(day2_rows[carried]["embedding"]))


def test_incremental_equals_a_full_recompute_for_the_changed_users(lake: dict[str, Any], tmp_path: Path) -> None:
    """The same lakehouse precomputed with a refresh every day: day 3's changed users get the same
    embeddings as the incremental run's."""
    cfg_full = precompute_config(tmp_path, model_refresh_days=1)
    world, days = build_days(cfg_full, 3)
    promote_model(cfg_full, days[1])
    publish_training_records(cfg_full, days[2])
    for ds in days[1:]:
        run(StageContext(cfg_full), ds)
    (stats,) = contents(cfg_full, GOLD_PRECOMPUTE_STATS, days[2])
    assert stats["refreshed"] and stats["users_computed"] == len(world.users)
    full = {r["user_id"]: r for r in contents(cfg_full, GOLD_FM_USER_EMBEDDINGS, days[2])}
    incremental = contents(lake["cfg"], GOLD_FM_USER_EMBEDDINGS, days[2])
    for row in incremental:
        torch.testing.assert_close(torch.tensor(row["embedding"]), torch.tensor(full[row["user_id"]]["embedding"]),
                                   rtol=1e-5, atol=1e-6)
        assert row["sequence_ds"] == full[row["user_id"]]["sequence_ds"]


def test_a_rerun_replaces_the_days_rows_and_each_python_worker_loads_the_model_once(tmp_path: Path) -> None:
    """Day 2 twice on the suite's local session: the same rows, replaced, not added; the shards' tasks
    share their Python workers' model (one load per worker, fewer than the shards)."""
    cfg = precompute_config(tmp_path)
    _, days = build_days(cfg, 2)
    promote_model(cfg, days[1])
    first = run(StageContext(cfg), days[1])
    once = {s.name: contents(cfg, s) for s in PRECOMPUTE_TABLES}
    assert all(once.values())
    again = run(StageContext(cfg), days[1])
    assert {s.name: contents(cfg, s) for s in PRECOMPUTE_TABLES} == once
    for result in (first, again):
        assert result.details["model_loads"] == result.details["python_workers"] < cfg.precompute.shards


@pytest.mark.slow  # a local cluster's executor JVMs and their Python workers start cold
def test_on_a_local_cluster_a_task_killed_mid_commit_reruns_and_the_tables_equal_local_mode(
        tmp_path: Path) -> None:
    """The job on local-cluster[2,1,1024] (a master and two executor JVMs), the first attempt of shard
    1 killed after its first table's commit: Spark reruns the task, which replaces the shard's rows;
    the five tables equal the same day's in local mode, and the tasks ran in both executors."""
    local = precompute_config(tmp_path / "local")
    events = tmp_path / "events"
    events.mkdir()
    cluster = load_config(overrides={**precompute_config(tmp_path / "cluster").to_dict(), "spark": {
        "master": "local-cluster[2,1,1024]", "shuffle_partitions": 2, "driver_memory": "1g",
        "conf": {"spark.executor.memory": "512m", "spark.eventLog.enabled": "true",
                 "spark.eventLog.dir": events.as_uri(), "spark.eventLog.compress": "false"}}}, environ={})
    for cfg in (local, cluster):  # the same seeded days and model in both lakehouses
        _, days = build_days(cfg, 2)
        promote_model(cfg, days[1])
    run(StageContext(local), days[1])
    config = tmp_path / "cluster.yaml"
    config.write_text(yaml.safe_dump(cluster.to_dict()))
    crash = f"precompute:shard=1:attempt=0:committed={GOLD_FM_USER_EMBEDDINGS.name}"
    job = subprocess.run([PYTHON, "-m", "jobs.precompute", "--ds", days[1], "--config", str(config)], check=False,
                         cwd=REPO, env={**subprocess_env(), CRASH_AT_ENV: crash}, capture_output=True, text=True, timeout=600)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    for schema in (*PRECOMPUTE_TABLES, GOLD_PRECOMPUTE_STATS):
        rows = lakehouse_rows(local, schema.name, NOT_COMPARED)
        assert rows, schema.name
        assert lakehouse_rows(cluster, schema.name, NOT_COMPARED) == rows, schema.name
    tasks = finished_tasks(events)
    assert len({t["Executor ID"] for t in tasks if t["Reason"] == "Success"} - {"driver"}) >= 2, tasks
    shard_1 = sorted((t["Attempt"], t["Reason"]) for t in tasks if t["Index"] == 1)
    assert shard_1[0][0] == 0 and shard_1[0][1] != "Success" and shard_1[-1][1] == "Success", shard_1


@needs_cuda
def test_with_a_gpu_per_task_each_shard_scores_on_the_gpu_spark_gave_it(tmp_path: Path) -> None:
    """precompute.gpus_per_task 1 on local-cluster[1,1,2048] whose worker offers GPU 0: the tasks
    score on cuda:0, and the tables match a CPU run within float tolerance."""
    cpu = precompute_config(tmp_path / "cpu")
    script = tmp_path / "gpus.sh"
    script.write_text("#!/bin/sh\necho '{\"name\": \"gpu\", \"addresses\": [\"0\"]}'\n")
    script.chmod(0o755)
    gpu = load_config(overrides={**precompute_config(tmp_path / "gpu").to_dict(),
                                 "precompute": {**cpu.to_dict()["precompute"], "gpus_per_task": 1},
                                 "spark": {"master": "local-cluster[1,1,2048]", "shuffle_partitions": 2, "conf": {
                                     "spark.worker.resource.gpu.amount": "1",
                                     "spark.worker.resource.gpu.discoveryScript": str(script),
                                     "spark.executor.resource.gpu.amount": "1",
                                     "spark.executor.resource.gpu.discoveryScript": str(script)}}}, environ={})
    for cfg in (cpu, gpu):
        _, days = build_days(cfg, 2)
        promote_model(cfg, days[1])
    run(StageContext(cpu), days[1])
    config = tmp_path / "gpu.yaml"
    config.write_text(yaml.safe_dump(gpu.to_dict()))
    job = subprocess.run([PYTHON, "-m", "jobs.precompute", "--ds", days[1], "--config", str(config)], check=False,
                         cwd=REPO, env=subprocess_env(), capture_output=True, text=True, timeout=600)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    assert "Python worker(s) on cuda:0;" in job.stdout, job.stdout
    on_cpu = {r["user_id"]: r["embedding"] for r in contents(cpu, GOLD_FM_USER_EMBEDDINGS)}
    on_gpu = {r["user_id"]: r["embedding"] for r in contents(gpu, GOLD_FM_USER_EMBEDDINGS)}
    assert on_gpu.keys() == on_cpu.keys()
    for user, embedding in on_cpu.items():
        torch.testing.assert_close(torch.tensor(on_gpu[user]), torch.tensor(embedding), rtol=1e-4, atol=1e-5)


def test_a_missing_promoted_model_fails_clearly_and_a_day_without_mixture_skips(tmp_path: Path) -> None:
    cfg = precompute_config(tmp_path)
    _, days = build_days(cfg, 2)
    skipped = run(StageContext(cfg), days[1])  # pretraining skipped: no mixture for the day
    assert not skipped.published and completions.completion(cfg, "precompute", days[1]) is None
    publish_training_records(cfg, days[1])  # pretraining ran, but promoted nothing
    with pytest.raises(PromotedModelMissing, match=r"no kunlun model is promoted for 2026-01-02 or an earlier day"):
        run(StageContext(cfg), days[1])
    assert completions.completion(cfg, "precompute", days[1]) is None


def test_the_model_loads_from_its_checkpoint_as_saved(lake: dict[str, Any]) -> None:
    from gem.precompute.plan import choose_model

    cfg, model = lake["cfg"], lake["model"]
    pin, _ = choose_model(cfg, lake["days"][2])
    loaded = PrecomputeModel.load(cfg, pin)
    assert loaded.version == pin.version and loaded.tasks == tuple(model.heads.tasks)
    for key, value in model.state_dict().items():
        torch.testing.assert_close(loaded.task.state_dict()[key], value, rtol=0, atol=0)

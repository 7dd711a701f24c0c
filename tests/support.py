"""Helpers the test modules share (instead of importing each other's): configs and paths, stand-in
completion records, and a tiny model, batch and trainer for the torch tests."""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from gem.config import GemConfig, TrainConfig, load_config
from gem.data.batch import Batch, Jagged, Sparse
from gem.lakehouse.compare import lakehouse_rows  # noqa: F401 - the tests import it from here
from gem.lakehouse.spark import C1_JVM_CONF
from gem.model.configs import (
    DLRMConfig,
    EmbeddingConfig,
    HSTUConfig,
    InterFormerConfig,
    KunlunConfig,
    ModelConfig,
    WukongConfig,
)
from gem.model.embeddings import PlainEmbeddings
from gem.model.heads import DomainExpertHeads
from gem.model.kunlun import Kunlun
from gem.model.task import GemTrainTask
from gem.train.trainer import CyclingStream

REPO = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures"
# Subprocess runs of `python -m jobs...` use the same interpreter and import path.
PYTHON = sys.executable

STAND_IN = "test stand-in: no stage ran"

# The GPU tier: tests (or cases) that need CUDA carry `gpu` and skip cleanly without it.
NEEDS_CUDA = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def needs_cuda(test):
    """Put a test in the GPU tier."""
    for mark in NEEDS_CUDA:
        test = mark(test)
    return test


# Run a torch test on the CPU and, where there is one, on the GPU.
ON_DEVICES = pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=NEEDS_CUDA)])


def stand_in_records(stage: str, days: list[str], rows_written: dict[str, int] | None = None,
                     table_versions: dict[str, int] | None = None) -> list[dict[str, Any]]:
    """Completion records of `stage` for `days`, standing in for a stage a test does not run (e.g.
    the data-quality stages); rows for `_ops.completions` with every column of its schema."""
    now = dt.datetime(2026, 2, 1)
    return [{"stage": stage, "ds": dt.date.fromisoformat(d), "run_id": f"test:{d}", "rows_in": None,
             "rows_written": (rows_written or {}).get(d, 0), "rows_quarantined": 0, "quarantined_by_reason": {},
             "table_versions": dict(table_versions or {}), "input_versions": {}, "reconciliation": STAND_IN,
             "completed_at": now} for d in days]


def make_config(tmp_path: Path, **overrides) -> GemConfig:
    """A config whose lakehouse and landing live under tmp_path; small generator defaults."""
    base = {
        "lakehouse_uri": str(tmp_path / "lakehouse"),
        # Jobs a test starts as subprocesses get short-lived JVMs: C1 only, as in the demo (the
        # in-process tests share the session fixture's JVM, which this does not touch).
        "spark": {"master": "local[2]", "shuffle_partitions": 2, "driver_memory": "2g",
                  "conf": C1_JVM_CONF},
        "generator": {"users": 500, "ads": 100, "advertisers": 20, "events_per_day": 5000, "chunk_impressions": 2000},
    }
    for k, v in overrides.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            base[k] = {**base[k], **v}
        else:
            base[k] = v
    return load_config(overrides=base, environ={})


def subprocess_env(cfg_path: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GEM__")}
    env["PYTHONPATH"] = str(REPO)
    if cfg_path is not None:
        env["GEM_CONFIG"] = str(cfg_path)
    return env


# The lakehouse tables each task of the daily DAG writes (its Airflow Assets), written out by hand.
DAG_OUTLETS = {
    "ingest_events": {"bronze.ad_events", "bronze.quarantine"},
    "build_sequences": {"silver.user_sequences", "silver.user_sequences_compacted"},
    "build_features": {"silver.user_daily_counts", "silver.ad_daily_counts", "silver.user_features",
                       "silver.ad_features"},
    "assemble_examples": {"silver.training_examples", "silver.attribution_quarantine", "silver.click_quarantine"},
    "mix": {"gold.mixture_manifest"},
    "pretrain": {"gold.metrics"},
    "precompute": {"gold.fm_user_embeddings", "gold.fm_predictions", "gold.fm_history_codes",
                   "gold.fm_speculative_pairs", "gold.precompute_stats"},
    "distill": {"gold.metrics"},
}


def airflow_test_env(airflow_home: Path, cfg_path: Path, **extra: str) -> dict[str, str]:
    """A clean environment for a real Airflow run: nothing from the developer's Airflow home, DB or
    GEM_ / GEM__ settings leaks in; Airflow's files under airflow_home, the jobs on cfg_path, task
    retries off (a broken job fails the run now instead of after two 5-minute waits), plus `extra`."""
    from gem.pipeline.airflow.orchestration import RETRIES_ENV

    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "GEM_"))}
    return env | {"AIRFLOW_HOME": str(airflow_home), "GEM_CONFIG": str(cfg_path), RETRIES_ENV: "0"} | extra


def query_db(db: Path, sql: str, *args: Any) -> list[tuple[Any, ...]]:
    """Rows of a query on an Airflow SQLite metadata DB."""
    import sqlite3

    with sqlite3.connect(db) as conn:
        return conn.execute(sql, args).fetchall()


# --- a tiny model, batch and trainer for the torch tests ----------------------------------------

TINY_TASKS = ("reels/click", "reels/lead", "fb_feed/click", "fb_feed/lead")
TINY_SPARSE = ("user_id", "ad_id", "surface")


def tiny_batch(b: int = 16, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    sequences = {}
    for e, n_max in (("impression", 9), ("click", 4), ("conversion", 2)):
        lengths = torch.randint(0, n_max + 1, (b,), generator=g)
        n = int(lengths.sum())
        sequences[e] = Jagged({"ad_id": torch.randint(0, 1 << 40, (n,), generator=g),
                               "surface": torch.randint(0, 7, (n,), generator=g),
                               "objective": torch.randint(0, 6, (n,), generator=g),
                               "gap_s": torch.rand(n, generator=g) * 1e5},
                              torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]))
    surface_is_reels = torch.rand(b, generator=g) < 0.5
    mask = torch.stack([surface_is_reels, surface_is_reels, ~surface_is_reels, ~surface_is_reels], 1)
    return Batch(
        dense=torch.randn(b, 6, generator=g),
        sparse={f: Sparse(torch.randint(0, 1 << 40, (b,), generator=g), torch.ones(b, dtype=torch.int32))
                for f in TINY_SPARSE},
        sequences=sequences,
        labels=(torch.rand(b, 4, generator=g) < 0.3).float() * mask,
        label_mask=mask, weights=mask.float() * (1 + torch.rand(b, 4, generator=g)), tasks=TINY_TASKS,
        impression_times=torch.zeros(b, dtype=torch.long),
    )


def tiny_task(backend: str = "torch", length_groups: int | None = None) -> GemTrainTask:
    """A small Kunlun task; backend "torchrec" puts the same tables in a torchrec EmbeddingCollection.
    length_groups: None for the jagged layout (the default), else the padded one in that many groups."""
    torch.manual_seed(0)
    emb_cfg = EmbeddingConfig(dim=16, buckets={"user_id": 100, "ad_id": 50, "surface": 8}, backend=backend)
    layout = {} if length_groups is None else {"sequence_layout": "padded", "length_groups": length_groups}
    cfg = KunlunConfig(dim=16, mlp_hidden=32, **layout)
    body = Kunlun(cfg, TINY_SPARSE, dense_dim=6)
    if backend == "torchrec":
        from gem.model.sparse import TorchrecEmbeddings

        embeddings: torch.nn.Module = TorchrecEmbeddings(emb_cfg, ("impression", "click", "conversion"))
    else:
        embeddings = PlainEmbeddings(emb_cfg)
    return GemTrainTask(embeddings, body, DomainExpertHeads(body.out_dim, TINY_TASKS, 32, 2), torch.ones(4))


STUDENT_TASKS = ("reels/click", "reels/lead")  # one surface's tasks
DAY_US = 86_400 * 1_000_000
STUDENT_DAY_US = 20_454 * DAY_US  # 2026-01-01 00:00 UTC in microseconds


def student_batch(b: int = 16, seed: int = 0, code_dim: int = 8, max_codes: int = 6) -> Batch:
    """A tiny_batch as one surface's student sees it: two reels tasks, every example drawn for both,
    impressions during one day, the FM's predictions (informative: near the label, 10% missing) and
    each user's coded events (time-ordered, from 40 days before the impression to 10 days after it,
    so some are too old and some too late for the example)."""
    from dataclasses import replace

    from gem.model.ops.int4 import pack_int4

    g = torch.Generator().manual_seed(seed + 1000)
    labels = (torch.rand(b, 2, generator=g) < 0.3).float()
    times = STUDENT_DAY_US + torch.randint(0, DAY_US, (b,), generator=g)
    fm = (0.15 + 0.7 * labels + 0.1 * torch.randn(b, 2, generator=g)).clamp(0.01, 0.99)
    lengths = torch.randint(0, max_codes + 1, (b,), generator=g)
    event_times = []
    for i in range(b):
        before = torch.rand(int(lengths[i]), generator=g) * (50 * DAY_US)  # how long before t + 10 days
        event_times.append(torch.sort(times[i] + 10 * DAY_US - before.long()).values)  # oldest first
    codes = torch.randint(-8, 8, (int(lengths.sum()), code_dim), generator=g, dtype=torch.int8)
    history = Jagged({"codes": pack_int4(codes), "time_us": torch.cat(event_times)},
                     torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)]))
    return replace(tiny_batch(b, seed), labels=labels, label_mask=torch.ones(b, 2, dtype=torch.bool),
                   weights=1 + torch.rand(b, 2, generator=g), tasks=STUDENT_TASKS, impression_times=times,
                   fm_predictions=fm, fm_prediction_mask=torch.rand(b, 2, generator=g) < 0.9,
                   fm_history_codes=history)


TINY_DIM = 16


def tiny_model_config(arch: str) -> ModelConfig:
    return ModelConfig(
        arch=arch,
        kunlun=KunlunConfig(dim=TINY_DIM, mlp_hidden=32), hstu=HSTUConfig(dim=TINY_DIM),
        interformer=InterFormerConfig(dim=TINY_DIM), wukong=WukongConfig(dim=TINY_DIM),
        dlrm=DLRMConfig(dim=TINY_DIM, dense_arch=(32, TINY_DIM), over_arch=(32, 16)),
        embeddings=EmbeddingConfig(dim=TINY_DIM, buckets={"user_id": 100, "ad_id": 50, "surface": 8}),
    )


class ListStream(CyclingStream):
    """A resumable stream over `n` tiny batches (the real loader's resume is tested in test_loader)."""

    def __init__(self, n: int = 6) -> None:
        super().__init__([tiny_batch(seed=i) for i in range(n)])


TINY_TRAIN = TrainConfig(steps=10, lr=3e-3, checkpoint_every=4)


def tiny_trainer(run_dir: Path, length_groups: int | None = None, cfg: TrainConfig = TINY_TRAIN) -> Any:
    """A gem.train.trainer.Trainer of the tiny task over ListStream."""
    from gem.train.trainer import Trainer

    torch.manual_seed(0)
    return Trainer(tiny_task(length_groups=length_groups), ListStream(), cfg, run_dir)


def run_two_ranks(worker: Any, tmp_path: Path) -> tuple[Any, Any]:
    """Spawn `worker(rank, init_file, out_dir)` on 2 gloo ranks; -> what each saved as rank{r}.pt."""
    import torch.multiprocessing as mp

    mp.start_processes(worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=2, join=True,
                       start_method="spawn")
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1))
    return r0, r1


def checkpoint_tensors(step_dir: Path) -> dict[str, Any]:
    """Every tensor of a torch.distributed.checkpoint folder (gem.train.checkpoint), read whole without
    a process group, under flat dotted keys: "model.heads.bias", "optimizer.heads.bias.exp_avg",
    "embedding_optimizer.state.<table>.<table>.momentum1"."""
    import tempfile

    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory() as scratch:
        dcp_to_torch_save(step_dir, Path(scratch) / "whole.pt")
        nested = torch.load(Path(scratch) / "whole.pt", weights_only=False)
    flat, todo = {}, [("", nested)]
    while todo:
        prefix, level = todo.pop()
        for key, value in level.items():
            if isinstance(value, dict):
                todo.append((f"{prefix}{key}.", value))
            else:
                flat[prefix + key] = value
    return flat


def ruff_path() -> str:
    """The pinned ruff of this venv (else one on PATH); a missing ruff fails the calling test."""
    local = Path(sys.executable).parent / "ruff"
    found = str(local) if local.exists() else shutil.which("ruff")
    assert found is not None, "ruff is pinned in requirements.txt; run `make setup`"
    return found


def spark_events(event_log: Path, live: bool = False) -> list[dict[str, Any]]:
    """Every event of the Spark event logs under event_log, in order per log (live: logs being
    written, whose last line may be partial). Spark 4 writes each application's log as a folder of
    rolled files (eventlog_v2_<app>/events_*), beside an empty appstatus_* marker."""
    events = []
    for log in sorted(event_log.rglob("events_*")):
        for line in filter(None, log.read_text().splitlines()):
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                if live:
                    continue
                raise
    return events


def finished_tasks(event_log: Path, live: bool = False) -> list[dict[str, Any]]:
    """The Task Info of every finished task in the event logs (executor, index, attempt,
    speculative, failed), with the end reason's name added as "Reason"."""
    return [{**e["Task Info"], "Reason": e["Task End Reason"]["Reason"]}
            for e in spark_events(event_log, live) if e.get("Event") == "SparkListenerTaskEnd"]

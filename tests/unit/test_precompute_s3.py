"""Solaris precompute with the lakehouse on an object store (the local S3 API, moto, server mode):
the run's folder (plan.json, current.json, the shards' leases and `.done` markers) lives under the
lakehouse URI, worker processes join it by that URI, the pinned checkpoint is the URI the promotion
gives, and a day precomputed by two workers there writes the same gold.fm_* rows as the same day
precomputed on a local lakehouse."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gem import storage
from gem.config import load_config
from gem.data.delta_log import read_table
from gem.lakehouse.commit import StageContext
from gem.lakehouse.compare import NOT_COMPARED
from gem.precompute.plan import current_run_folder, day_folder
from gem.precompute.run import run
from gem.precompute.shards import ShardBoard
from schemas.precompute import GOLD_PRECOMPUTE_STATS, PRECOMPUTE_TABLES
from tests.precompute_lakehouse import build_days, precompute_config, promote_model
from tests.support import REPO, lakehouse_rows


def test_a_day_precomputed_on_s3_by_two_workers_equals_the_local_one(
        tmp_path: Path, s3_bucket: str, capfd: pytest.CaptureFixture[str]) -> None:
    local = precompute_config(tmp_path / "local")
    on_s3 = load_config(overrides={**local.to_dict(), "lakehouse_uri": s3_bucket + "/lake"}, environ={})
    days = {}
    for cfg in (local, on_s3):  # the same seeded days and model in both lakehouses
        _, days[cfg.lakehouse_uri] = build_days(cfg, 2)
        promote_model(cfg, days[cfg.lakehouse_uri][1])
    ds = days[local.lakehouse_uri][1]
    assert days[on_s3.lakehouse_uri][1] == ds

    run(StageContext(local), ds, workers=1)
    capfd.readouterr()
    result = run(StageContext(on_s3), ds, workers=2)
    assert result.published
    out = capfd.readouterr().out
    # The helper process joined the run by its folder's URI (handed on its stdin) and exited cleanly.
    assert len(re.findall(r"^\[[^\]]+\] shards \[[0-9, ]*\]: \d+ users", out, re.MULTILINE)) == 1, out
    assert "exited with an error" not in out

    for schema in (*PRECOMPUTE_TABLES, GOLD_PRECOMPUTE_STATS):
        rows = lakehouse_rows(local, schema.name, NOT_COMPARED)
        assert rows, schema.name
        assert lakehouse_rows(on_s3, schema.name, NOT_COMPARED) == rows, schema.name

    # The run's folder is under the bucket, every shard has its marker and no lease is left.
    folder = current_run_folder(on_s3, ds)
    assert folder.startswith(day_folder(on_s3, ds) + "/") and folder.startswith(s3_bucket + "/lake/_ops/precompute/")
    shards = on_s3.precompute.shards
    names = [storage.name(uri) for uri in storage.listdir(folder)]
    assert names == ["plan.json", *(f"shard-{s:04d}.done" for s in range(shards))]
    assert ShardBoard(folder, shards, on_s3.precompute.lease_expiry_s).remaining() == []
    assert storage.read_json(storage.join(folder, "plan.json"))["model"]["checkpoint"].startswith(s3_bucket + "/lake/")
    (stats,) = read_table(GOLD_PRECOMPUTE_STATS.path(on_s3.lakehouse_uri)).to_pylist()
    assert stats["model_checkpoint"].startswith(s3_bucket + "/lake/_checkpoints/")  # the promotion's URI, as is
    assert not (REPO / "s3:").exists()  # no S3 URI was taken for a local path

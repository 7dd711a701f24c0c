"""Solaris precompute with the lakehouse on an object store (the local S3 API, moto, server mode):
the shard tasks read their inputs and the pinned checkpoint by the lakehouse's URI and commit their
parts there, and the day writes the same gold.fm_* rows as the same day precomputed on a local
lakehouse."""

from __future__ import annotations

from pathlib import Path

import pytest

from gem.config import load_config
from gem.data.delta_log import read_table
from gem.lakehouse.commit import StageContext
from gem.lakehouse.compare import NOT_COMPARED
from gem.precompute.run import run
from schemas.precompute import GOLD_PRECOMPUTE_STATS, PRECOMPUTE_TABLES
from tests.precompute_lakehouse import build_days, precompute_config, promote_model
from tests.support import REPO, lakehouse_rows

pytestmark = pytest.mark.usefixtures("spark")


def test_a_day_precomputed_on_s3_equals_the_local_one(tmp_path: Path, s3_bucket: str) -> None:
    local = precompute_config(tmp_path / "local")
    on_s3 = load_config(overrides={**local.to_dict(), "lakehouse_uri": s3_bucket + "/lake"}, environ={})
    days = {}
    for cfg in (local, on_s3):  # the same seeded days and model in both lakehouses
        _, days[cfg.lakehouse_uri] = build_days(cfg, 2)
        promote_model(cfg, days[cfg.lakehouse_uri][1])
    ds = days[local.lakehouse_uri][1]
    assert days[on_s3.lakehouse_uri][1] == ds

    run(StageContext(local), ds)
    result = run(StageContext(on_s3), ds)
    assert result.published and result.details["model_loads"] >= 1

    for schema in (*PRECOMPUTE_TABLES, GOLD_PRECOMPUTE_STATS):
        rows = lakehouse_rows(local, schema.name, NOT_COMPARED)
        assert rows, schema.name
        assert lakehouse_rows(on_s3, schema.name, NOT_COMPARED) == rows, schema.name
    (stats,) = read_table(GOLD_PRECOMPUTE_STATS.path(on_s3.lakehouse_uri)).to_pylist()
    assert stats["model_checkpoint"].startswith(s3_bucket + "/lake/_checkpoints/")  # the promotion's URI, as is
    assert not (REPO / "s3:").exists()  # no S3 URI was taken for a local path

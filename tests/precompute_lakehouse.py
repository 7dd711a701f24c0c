"""The precompute tests' config over the small lakehouse of gem.precompute.synthetic_lakehouse
(written without Spark; the precompute benchmark writes the same)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gem.config import GemConfig
from gem.data.loader import SPARSE_FEATURES
from gem.precompute.synthetic_lakehouse import (  # noqa: F401 - the tests import them from here
    START,
    World,
    build_days,
    promote_model,
    publish_training_records,
    write_partition,
)
from tests.support import make_config


def precompute_config(tmp_path: Path, **precompute: Any) -> GemConfig:
    """A tiny Kunlun, a same-day attribution window, small shards and batches, and students of 3
    steps (a few passes over the small days) that ship no serving artifact (tests/spark/test_serve_distill.py
    turns the export on)."""
    buckets = {f: 97 for f in SPARSE_FEATURES}
    return make_config(
        tmp_path, start_ds=START, attribution_window_days=0, student_train={"steps": 3, "checkpoint_every": 3, "export": False},
        model={"arch": "kunlun", "kunlun": {"dim": 16, "mlp_hidden": 32},
               "embeddings": {"dim": 16, "buckets": buckets}},
        precompute={"shards": 4, "batch_size": 8, "popular_ads": 3, "recent_ads": 3,
                    **precompute},
    )

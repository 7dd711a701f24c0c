"""A small synthetic world: the whole pipeline, training included, in minutes a day.

The backfill benchmark (bench.backfill), the fault drill (drills.faults) and the end-to-end backfill
tests run the real jobs on it, so what they compare or kill is the pipeline's own code at a size a
2-core machine runs many times over.
"""

from __future__ import annotations

from pathlib import Path

import yaml

from gem.lakehouse.spark import C1_JVM_CONF

START_DS = "2026-01-01"


def world_config(root: Path, events_per_day: int = 4000, users: int = 400, ads: int = 80) -> Path:
    """A small world's config in root/gem.yaml (its lakehouse in root/lakehouse): one training day per
    mixture, 4 training steps; short-lived C1-only job JVMs."""
    root.mkdir(parents=True, exist_ok=True)
    path = root / "gem.yaml"
    path.write_text(yaml.safe_dump({
        "lakehouse_uri": str(root / "lakehouse"), "start_ds": START_DS, "attribution_window_days": 0,
        "spark": {"master": "local[2]", "shuffle_partitions": 2, "driver_memory": "2g",
                  "conf": C1_JVM_CONF},
        "generator": {"users": users, "ads": ads, "advertisers": max(1, ads // 5), "events_per_day": events_per_day,
                      "chunk_impressions": 2000},
        "mix": {"train_days": 1, "validation_days": 0},
        "loader": {"batch_size": 128, "num_workers": 0},
        "train": {"steps": 4, "checkpoint_every": 2},
    }))
    return path

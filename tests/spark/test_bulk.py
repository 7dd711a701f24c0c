"""The bulk path writes what the daily runs write: two days through every Spark stage by
`gem.pipeline.bulk.run_range` (one process, the suite's Spark session) against the same two days run as the
DAG's tasks run them (`python -m jobs.<module> ...`, one process and JVM per stage and day, in
registry order), each into its own lakehouse; every table's rows and every completion record's
counts agree (run ids, timestamps and versions aside)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from gem.lakehouse.commit import StageContext
from gem.pipeline.airflow.orchestration import NOTHING_READY_EXIT
from gem.pipeline.bulk import run_range, stages_through
from schemas import TABLES
from schemas.ops import COMPLETIONS
from tests.support import C1_JVM_CONF, PYTHON, lakehouse_rows

pytestmark = pytest.mark.slow  # 16 job processes, each with its own JVM (many minutes on 2 cores)

DAYS = ("2026-01-01", "2026-01-02")
LAST_SPARK_STAGE = "validate_examples"


def _config(root: Path) -> Path:
    """A small two-day world in its own lakehouse under root (the Spark settings of tests.support)."""
    import yaml

    path = root / "gem.yaml"
    root.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({
        "lakehouse_uri": str(root / "lakehouse"), "start_ds": DAYS[0], "attribution_window_days": 0,
        "spark": {"master": "local[2]", "shuffle_partitions": 2, "driver_memory": "2g",
                  "conf": C1_JVM_CONF},
        "generator": {"users": 500, "ads": 100, "advertisers": 20, "events_per_day": 5000, "chunk_impressions": 2000},
    }))
    return path


def test_bulk_days_equal_the_daily_jobs_run_one_process_each(spark, tmp_path: Path):
    from gem.config import load_config

    bulk_cfg = load_config(str(_config(tmp_path / "bulk")))
    daily_path = _config(tmp_path / "daily")
    daily_cfg = load_config(str(daily_path))

    runs = list(run_range(bulk_cfg, DAYS[0], DAYS[-1], LAST_SPARK_STAGE, ctx=StageContext(bulk_cfg, spark)))
    assert [r.state for r in runs] == ["success"] * len(runs), runs

    for day in DAYS:
        for stage in stages_through(LAST_SPARK_STAGE):
            day_flag = "--ready-on" if stage.ready_on else "--ds"
            cmd = [PYTHON, "-m", f"jobs.{stage.module}", day_flag, day, "--config", str(daily_path)]
            cmd += stage.extra_args.split()
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
            assert done.returncode in (0, NOTHING_READY_EXIT), (stage.name, day, done.stdout[-2000:], done.stderr[-3000:])

    compared = 0
    for name in TABLES:
        bulk_rows, daily_rows = lakehouse_rows(bulk_cfg, name), lakehouse_rows(daily_cfg, name)
        assert bulk_rows == daily_rows, name
        compared += bool(bulk_rows)
    assert compared >= 8  # bronze, quarantine, sequences, features, counts, examples, completions...
    assert lakehouse_rows(bulk_cfg, COMPLETIONS.name)

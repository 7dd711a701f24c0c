"""The bulk path (gem.pipeline.bulk) without a JVM: it calls each stage's own entry point, in registry order,
day by day, and reports what a DAG task would (success or skipped). The Spark stages run under it
in `make demo` (its first day)."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from gem.lakehouse.landing import SUCCESS_MARKER, partition_dir
from gem.lakehouse.stages import STAGES
from gem.pipeline.bulk import entry_point, run_range, stages_through
from tests.support import make_config


def test_every_stage_has_an_entry_point_taking_ctx_and_ds():
    for stage in STAGES:
        params = list(inspect.signature(entry_point(stage)).parameters)
        assert params[:2] == ["ctx", "ds"], (stage.name, params)
        # A stage declared with ranges runs a range in one call: entry(ctx, first, through=last).
        assert ("through" in params) == stage.ranges, (stage.name, params)


def test_stages_through_stops_at_the_named_stage_and_refuses_an_unknown_one():
    assert [s.name for s in stages_through("ingest_events")] == ["generate_events", "ingest_events"]
    assert stages_through(None) == STAGES
    with pytest.raises(ValueError, match="no stage 'ingest'"):
        stages_through("ingest")


def test_generator_days_write_landing_in_order(tmp_path: Path):
    cfg = make_config(tmp_path, start_ds="2026-01-01", generator={"events_per_day": 300, "users": 50, "ads": 10})
    runs = list(run_range(cfg, "2026-01-01", "2026-01-02", through_stage="generate_events"))
    assert [(r.run_day, r.stage, r.state) for r in runs] == [
        ("2026-01-01", "generate_events", "success"), ("2026-01-02", "generate_events", "success")]
    for day in ("2026-01-01", "2026-01-02"):
        assert (Path(partition_dir(cfg.landing_root, day)) / SUCCESS_MARKER).is_file()


def test_a_landing_source_skips_the_generator(tmp_path: Path):
    cfg = make_config(tmp_path, start_ds="2026-01-01", source="landing")
    runs = list(run_range(cfg, "2026-01-01", "2026-01-01", through_stage="generate_events"))
    assert [(r.stage, r.state) for r in runs] == [("generate_events", "skipped")]
    assert not Path(cfg.landing_root).exists() or not any(Path(cfg.landing_root).iterdir())


def test_a_range_before_start_ds_or_reversed_is_refused(tmp_path: Path):
    cfg = make_config(tmp_path, start_ds="2026-01-05")
    with pytest.raises(ValueError, match="before the pipeline's start_ds"):
        list(run_range(cfg, "2026-01-01", "2026-01-06"))
    with pytest.raises(ValueError, match="empty range"):
        list(run_range(cfg, "2026-01-07", "2026-01-06"))

"""The bulk path's ranged stages write what day-by-day runs write: four run days through every Spark
stage by `gem.pipeline.bulk.run_range` (ingest .. validate_examples each ONE call over the range) against the
same days with every stage run once per day (`day_by_day=True`, the daily runs' order), each into
its own lakehouse, on the suite's Spark session. The world has an attribution window of one day (so
the example days' windows overlap) and compacts sequences every second day (a compaction inside the
range). Every table's rows and every completion record's counts agree (run ids, timestamps and
versions aside)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gem.lakehouse import completions
from gem.lakehouse.commit import StageContext
from gem.pipeline.bulk import run_range, stages_through
from schemas import TABLES
from schemas.ops import COMPLETIONS
from tests.support import lakehouse_rows, make_config

DAYS = ("2026-01-01", "2026-01-04")
LAST_SPARK_STAGE = "validate_examples"
RECORD_COUNTS = ("rows_in", "rows_written", "rows_quarantined", "quarantined_by_reason")

# The slow tier: two four-day chains of every Spark stage. The quick tier checks each ranged stage
# against its days one by one in that stage's own test module (test_ingest_events, test_build_sequences,
# test_build_features, test_assemble_examples); this one checks the chain the bulk path runs.
pytestmark = pytest.mark.slow


def _config(root: Path):
    return make_config(root, start_ds=DAYS[0], attribution_window_days=1, sequence_compaction_days=2,
                       generator={"users": 300, "ads": 60, "advertisers": 12, "events_per_day": 3000,
                                  "chunk_impressions": 1500})


def test_ranged_stages_equal_the_stages_run_day_by_day(spark, tmp_path: Path):
    ranged_cfg, daily_cfg = _config(tmp_path / "ranged"), _config(tmp_path / "daily")

    ranged = list(run_range(ranged_cfg, *DAYS, LAST_SPARK_STAGE, ctx=StageContext(ranged_cfg, spark)))
    daily = list(run_range(daily_cfg, *DAYS, LAST_SPARK_STAGE, ctx=StageContext(daily_cfg, spark), day_by_day=True))

    spark_stages = [s.name for s in stages_through(LAST_SPARK_STAGE) if s.ranges]
    # One run per ranged stage, each over the whole range; the generator still runs day by day.
    assert [r.stage for r in ranged if r.through is not None] == spark_stages
    assert {r.state for r in ranged} == {"success"}, ranged
    assert len(daily) == 4 * len(stages_through(LAST_SPARK_STAGE))

    compared = 0
    for name in TABLES:
        if name == COMPLETIONS.name:
            continue
        ranged_rows, daily_rows = lakehouse_rows(ranged_cfg, name), lakehouse_rows(daily_cfg, name)
        assert ranged_rows == daily_rows, name
        compared += bool(ranged_rows)
    assert compared >= 9  # bronze, quarantine, sequences (+ compacted), counts, features, examples...

    published = 0
    for stage in spark_stages:
        for day in ("2026-01-01", "2026-01-02", "2026-01-03", "2026-01-04"):
            a, b = completions.completion(ranged_cfg, stage, day), completions.completion(daily_cfg, stage, day)
            assert (a is None) == (b is None), (stage, day)
            if a is not None:
                assert {k: a[k] for k in RECORD_COUNTS} == {k: b[k] for k in RECORD_COUNTS}, (stage, day)
                # The same rows, written in other commits and files: the same fingerprints.
                assert a["table_fingerprints"] == b["table_fingerprints"] and a["table_fingerprints"], (stage, day)
                published += 1
    assert published == 4 * 5 + 3 * 2  # the example stages: the days whose window closed by the 4th

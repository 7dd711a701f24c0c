"""gem.lakehouse.stages: the registry's day rules agree with the jobs, the DAG edges are the producers of each
stage's needs (each drawn once), and missing inputs are found from real completion records and
named with the command to run."""

from __future__ import annotations

import pytest

from gem.days import day_range, shift_day
from gem.lakehouse import completions, stages
from gem.silver.compaction import is_compaction_day
from jobs import mix
from tests.support import make_config

S = "2026-01-01"


def test_needs_resolve_to_days_relative_to_the_stage_day(tmp_path):
    cfg = make_config(tmp_path, start_ds=S, attribution_window_days=2)
    assemble = stages.stage("assemble_examples")
    assert assemble.ds(cfg, "2026-01-05") == "2026-01-03"
    assert assemble.ds(cfg, "2026-01-02") is None  # no window has closed yet
    # Arrival days ds-2W-1 .. ds+W, clipped at start_ds; silver of ds.
    assert assemble.needed(cfg, "2026-01-03") == [
        *(("validate_events", d) for d in day_range(S, "2026-01-05")), ("validate_silver", "2026-01-03")]
    assert assemble.needed(cfg, "2026-01-09")[0] == ("validate_events", "2026-01-04")
    sequences = stages.stage("build_sequences")
    assert sequences.needed(cfg, S) == [("validate_events", S)]  # the first day has no previous day
    assert sequences.needed(cfg, "2026-01-04") == [("validate_events", "2026-01-04"), ("build_sequences", "2026-01-03")]
    # The daily-count partitions a run MAY replace: the window (a --full rebuild); the daily run
    # replaces ds-1's alone, a subset the commit checks.
    window = day_range(S, "2026-01-03")
    assert stages.stage("build_features").partitions(cfg, "2026-01-04") == {
        "silver.user_daily_counts": window, "silver.ad_daily_counts": window,
        "silver.user_features": ["2026-01-04"], "silver.ad_features": ["2026-01-04"]}


@pytest.mark.parametrize("validation_days", [0, 1, 2])
def test_schedules_and_windows_agree_with_the_jobs(tmp_path, validation_days):
    cfg = make_config(tmp_path, start_ds=S, attribution_window_days=1, sequence_compaction_days=7,
                      mix={"train_days": 3, "validation_days": validation_days})
    for ds in day_range(S, shift_day(S, 30)):
        compacts = stages.stage("build_sequences").partitions(cfg, ds).get("silver.user_sequences_compacted")
        assert (compacts == [ds]) == is_compaction_day(cfg, ds), ds
        days = mix.mix_days(cfg, ds)
        # Every day the mix reads, validation days included, is gated; a day with nothing to train on needs none.
        expected = [] if days is None else [*days.train, *days.validation, days.eval]
        needed = stages.stage("mix").needed(cfg, ds)  # the examples and the sequences of the mixed days, validated
        assert needed == [("validate_examples", d) for d in expected] + [("validate_silver", d) for d in expected], ds
        assert days is None or len(days.validation) == validation_days
    # The first run day that mixes: a training day, then the validation days, then the held-out day.
    first = shift_day(S, 1 + validation_days + 1)
    assert mix.mix_days(cfg, shift_day(first, -1)) is None
    assert stages.mixed_days(cfg, first) == day_range(S, shift_day(first, -1))


def test_dag_edges_are_the_producers_of_needs_each_drawn_once():
    # assemble_examples needs validate_events and validate_silver; validate_silver already waits
    # (through the sequences and features) for validate_events, so only that edge is drawn.
    assert stages.upstream("assemble_examples") == {"validate_silver"}
    assert stages.upstream("ingest_events") == {"generate_events"}  # `after`: landing files, no record
    assert stages.upstream("build_sequences") == {"validate_events"}  # its own previous day is no edge
    with pytest.raises(KeyError, match="no stage 'nope'"):
        stages.stage("nope")


def test_missing_inputs_come_from_real_completion_records(tmp_path):
    cfg = make_config(tmp_path, start_ds=S, attribution_window_days=1)

    def completed(stage: str, day: str):
        return completions.completion(cfg, stage, day)

    assert stages.missing_inputs("build_sequences", cfg, "2026-01-02", completed) == [
        ("validate_events", "2026-01-02"), ("build_sequences", "2026-01-01")]
    for stage, day in (("validate_events", "2026-01-02"), ("build_sequences", "2026-01-01")):
        completions.publish_completion(cfg, stage, day, f"test:{day}", 1, 1, {}, {})
    assert stages.missing_inputs("build_sequences", cfg, "2026-01-02", completed) == []
    missing = stages.missing_inputs("validate_examples", cfg, "2026-01-01", completed)
    assert missing == [("assemble_examples", "2026-01-01")]
    assert stages.describe_missing("validate_examples", "2026-01-01", missing) == (
        "validate_examples ds=2026-01-01 needs records that do not exist yet: assemble_examples ds=2026-01-01; "
        "run `python -m jobs.assemble_examples --ds 2026-01-01` first")
    message = stages.describe_missing("mix", "2026-01-03", [("validate_examples", "2026-01-02")])
    assert message.endswith("run `python -m jobs.validate_silver --ds 2026-01-02 --examples` first")


def test_the_registry_prints_as_a_table_of_days_needs_and_writes(capsys):
    from jobs import status

    assert status.main(["--registry"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["stage", "day", "needs", "writes", "runs"]
    by_stage = {line.split()[0]: line for line in lines[1:]}
    assert list(by_stage) == [s.name for s in stages.STAGES]
    assert "landing (after generate_events)" in by_stage["ingest_events"] and "ranges" in by_stage["ingest_events"]
    assert "silver.user_sequences_compacted[compaction_days]" in by_stage["build_sequences"]
    assert "validate_events[feature_window_days]" in by_stage["build_features"]


def test_the_architecture_page_shows_the_registry_as_it_is():
    from tests.support import REPO

    page = (REPO / "docs" / "architecture.md").read_text()
    rows = [line for line in page.splitlines() if line.startswith("| `") and line.count(" | ") == 4]
    shown = [tuple(c.strip().strip("`") for c in line.strip("|").split(" | ")) for line in rows]
    assert shown == stages.describe()

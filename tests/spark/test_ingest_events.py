"""bronze ingestion: every dirty-row kind quarantined with its reason, counts reconcile, reruns are
idempotent, crashes leave nothing a reader would use, schema drift fails loudly."""

from __future__ import annotations

import json
import subprocess

import pytest

from gem import lakehouse
from gem.commit import StageContext
from gem.landing import MissingLandingPartition, partition_dir
from jobs import ingest_events
from schemas.events import BRONZE_AD_EVENTS, BRONZE_QUARANTINE, QUARANTINE_REASONS
from tests.landing_lines import CLEAN_LINES, DAY, DIRTY_LINES, all_dirty_lines, line, write_day
from tests.support import PYTHON, REPO, make_config, subprocess_env

EXTRA_CLEAN = [line(f"k{i}", user_id=f"u{i}") for i in range(20)]


def _rows(spark, cfg, schema, ds=DAY):
    df = lakehouse.read_table(spark, cfg, schema).where(f"ds = DATE'{ds}'")
    return sorted(tuple(str(v) for v in r) for r in df.collect())


def _snapshot(spark, cfg):
    return _rows(spark, cfg, BRONZE_AD_EVENTS), _rows(spark, cfg, BRONZE_QUARANTINE)


@pytest.fixture
def dirty_day(tmp_path):
    cfg = make_config(tmp_path)
    write_day(cfg.landing_root, DAY, CLEAN_LINES + EXTRA_CLEAN + all_dirty_lines())
    return cfg


def test_every_dirty_kind_is_quarantined_with_its_reason(spark, dirty_day):
    cfg = dirty_day
    landing = {p.name: p.read_bytes() for p in partition_dir(cfg.landing_root, DAY).iterdir()}
    result = ingest_events.run(StageContext(cfg, spark), DAY)
    # Ingest never rewrites or deletes landing files: nothing is lost at the source either.
    assert {p.name: p.read_bytes() for p in partition_dir(cfg.landing_root, DAY).iterdir()} == landing

    expected = {reason: len(lines) for reason, lines in DIRTY_LINES.items()}
    assert set(expected) == set(QUARANTINE_REASONS)  # the fixture covers every reason
    assert result.quarantined_by_reason == expected
    assert result.rows_in == len(CLEAN_LINES) + len(EXTRA_CLEAN) + sum(expected.values())
    assert result.rows_written == len(CLEAN_LINES) + len(EXTRA_CLEAN)

    bronze_ids = {r.event_id for r in lakehouse.read_table(spark, cfg, BRONZE_AD_EVENTS).collect()}
    assert bronze_ids == {json.loads(x)["event_id"] for x in CLEAN_LINES + EXTRA_CLEAN}

    quarantine = lakehouse.read_table(spark, cfg, BRONZE_QUARANTINE).collect()
    by_line = {(r.reason, r.raw_line) for r in quarantine}
    for reason, lines in DIRTY_LINES.items():
        for raw in lines:
            assert (reason, raw) in by_line, (reason, raw)  # the raw line is kept verbatim

    record = lakehouse.require_completed(cfg, "ingest_events", DAY)
    assert record["rows_in"] == record["rows_written"] + record["rows_quarantined"]
    assert record["quarantined_by_reason"] == expected
    assert record["table_versions"][BRONZE_AD_EVENTS.name] == lakehouse.latest_version(
        lakehouse.table_path(cfg, BRONZE_AD_EVENTS)
    )

    # Rerun: identical contents, still exactly one completion record for the day.
    before = _snapshot(spark, cfg)
    ingest_events.run(StageContext(cfg, spark), DAY)
    assert _snapshot(spark, cfg) == before
    records = lakehouse.read_table(spark, cfg, lakehouse.COMPLETIONS).where("stage = 'ingest_events'").count()
    assert records == 1


def test_crash_between_commits_leaves_no_completion_and_rerun_converges(spark, dirty_day, monkeypatch):
    """Die at each point between commits of a rerun over a completed day; each time the day has no
    completion record, and the next rerun restores exactly the completed contents."""
    cfg = dirty_day
    ingest_events.run(StageContext(cfg, spark), DAY)
    reference = _snapshot(spark, cfg)

    class Killed(BaseException):
        pass

    for point in ("after_withdraw", "after_bronze", "after_quarantine"):

        def die_at(name, point=point):
            if name == f"ingest_events:{point}":
                raise Killed(name)

        monkeypatch.setattr(ingest_events, "crash_point", die_at)
        with pytest.raises(Killed):
            ingest_events.run(StageContext(cfg, spark), DAY)
        assert lakehouse.completion(cfg, "ingest_events", DAY) is None, point

        monkeypatch.undo()
        ingest_events.run(StageContext(cfg, spark), DAY)
        assert _snapshot(spark, cfg) == reference, point
        assert lakehouse.completion(cfg, "ingest_events", DAY) is not None


@pytest.mark.slow
def test_process_killed_after_bronze_commit(spark, tmp_path):
    """A real SIGKILL between the two table commits: no completion record; a rerun converges."""
    cfg = make_config(tmp_path)
    write_day(cfg.landing_root, DAY, CLEAN_LINES + EXTRA_CLEAN + all_dirty_lines())
    cfg_file = tmp_path / "gem.yaml"
    cfg_file.write_text(json.dumps(cfg.to_dict()))  # JSON is valid YAML
    env = subprocess_env(cfg_file) | {"GEM_CRASH_AT": "ingest_events:after_bronze"}
    proc = subprocess.run(
        [PYTHON, "-m", "jobs.ingest_events", "--ds", DAY], cwd=REPO, env=env, capture_output=True, text=True
    )
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert lakehouse.completion(cfg, "ingest_events", DAY) is None
    # The bronze commit happened; the quarantine table never got its partition.
    assert len(_rows(spark, cfg, BRONZE_AD_EVENTS)) == len(CLEAN_LINES) + len(EXTRA_CLEAN)

    result = ingest_events.run(StageContext(cfg, spark), DAY)
    assert result.rows_in == result.rows_written + sum(result.quarantined_by_reason.values())
    assert len(_rows(spark, cfg, BRONZE_QUARANTINE)) == sum(len(v) for v in DIRTY_LINES.values())
    assert lakehouse.completion(cfg, "ingest_events", DAY) is not None


def test_schema_drift_unexpected_column_fails_loudly(spark, tmp_path):
    cfg = make_config(tmp_path)
    write_day(cfg.landing_root, DAY, [line(f"d{i}", discount_pct=10) for i in range(10)])
    with pytest.raises(ingest_events.SchemaDriftError, match="unexpected column 'discount_pct' in 10 of 10"):
        ingest_events.run(StageContext(cfg, spark), DAY)
    assert lakehouse.completion(cfg, "ingest_events", DAY) is None


def test_schema_drift_changed_type_fails_loudly(spark, tmp_path):
    cfg = make_config(tmp_path)
    # A producer switched event_time from epoch milliseconds to ISO strings.
    write_day(cfg.landing_root, DAY, [line(f"d{i}", event_time="2026-01-01T01:00:00Z") for i in range(10)])
    with pytest.raises(ingest_events.SchemaDriftError, match="wrong type in column 'event_time'.*event_time: long"):
        ingest_events.run(StageContext(cfg, spark), DAY)
    assert lakehouse.completion(cfg, "ingest_events", DAY) is None


def test_missing_or_unfinished_landing_partition_is_named(spark, tmp_path):
    cfg = make_config(tmp_path)
    with pytest.raises(MissingLandingPartition, match=str(partition_dir(cfg.landing_root, DAY))):
        ingest_events.run(StageContext(cfg, spark), DAY)
    folder = partition_dir(cfg.landing_root, DAY)
    folder.mkdir(parents=True)
    (folder / "part-0.json.gz").write_bytes(b"")
    with pytest.raises(MissingLandingPartition, match="no _SUCCESS marker"):
        ingest_events.run(StageContext(cfg, spark), DAY)


def test_event_seen_on_an_earlier_day_is_a_duplicate(spark, tmp_path):
    cfg = make_config(tmp_path)
    write_day(cfg.landing_root, DAY, CLEAN_LINES)
    ingest_events.run(StageContext(cfg, spark), DAY)
    next_day = "2026-01-02"
    replayed = line("g2", event_type="click", surface="fb_feed")  # same id as a day-1 event
    fresh = line("n1", event_time=1767312000000 + 60_000)
    write_day(cfg.landing_root, next_day, [replayed, fresh])
    result = ingest_events.run(StageContext(cfg, spark), next_day)
    assert result.quarantined_by_reason == {"duplicate_event_id": 1}
    rows = lakehouse.read_table(spark, cfg, BRONZE_QUARANTINE).where(f"ds = DATE'{next_day}'").collect()
    assert [r.detail for r in rows] == [f"already in bronze ds={DAY}"]


def test_cli_rejects_a_malformed_day():
    proc = subprocess.run(
        [PYTHON, "-m", "jobs.ingest_events", "--ds", "2026-13-01"], cwd=REPO, env=subprocess_env(),
        capture_output=True, text=True,
    )
    assert proc.returncode == 2 and "YYYY-MM-DD" in proc.stderr


def test_generated_days_reconcile_exactly_with_the_planted_dirty_rows(spark, tmp_path):
    """The generator's sidecars say how many lines of each dirty kind it planted per arrival day;
    ingest must quarantine exactly those, with the mapped reasons, and keep every clean line."""
    from gem.sources.landing_output import expected_landing_counts
    from gem.sources.synthetic_day import generate_day

    cfg = make_config(tmp_path, generator={"dirty_fraction": 0.02})
    for ds in (DAY, "2026-01-02"):
        generate_day(cfg, ds)
    for ds in (DAY, "2026-01-02"):  # day 2 also holds day 1's late conversions
        expected = expected_landing_counts(cfg.landing_root, ds)
        result = ingest_events.run(StageContext(cfg, spark), ds)
        assert result.quarantined_by_reason == expected["quarantine"], ds
        assert result.rows_written == expected["clean"], ds
        assert len(expected["quarantine"]) == 8, expected  # every kind planted (null/empty id share a reason)

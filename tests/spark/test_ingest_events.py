"""bronze ingestion: every dirty-row kind quarantined with its reason, counts reconcile, reruns are
idempotent, crashes leave nothing a reader would use, schema drift fails loudly."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from gem.bronze.drift import SchemaDriftError
from gem.lakehouse import completions, tables
from gem.lakehouse.commit import StageContext
from gem.lakehouse.completions import MissingInputError
from gem.lakehouse.landing import MissingLandingPartition, mark_partition_complete, partition_dir
from jobs import ingest_events
from schemas.events import BRONZE_AD_EVENTS, BRONZE_QUARANTINE, LINE_REASONS
from schemas.ops import COMPLETIONS
from tests.landing_lines import CLEAN_LINES, DAY, DIRTY_LINES, all_dirty_lines, line, write_day
from tests.support import PYTHON, REPO, make_config, subprocess_env

EXTRA_CLEAN = [line(f"k{i}", user_id=f"u{i}") for i in range(20)]


def _rows(spark, cfg, schema, ds=DAY):
    df = tables.read_table(spark, cfg, schema).where(f"ds = DATE'{ds}'")
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
    landing = {p.name: p.read_bytes() for p in Path(partition_dir(cfg.landing_root, DAY)).iterdir()}
    result = ingest_events.run(StageContext(cfg, spark), DAY)
    # Ingest never rewrites or deletes landing files: nothing is lost at the source either.
    assert {p.name: p.read_bytes() for p in Path(partition_dir(cfg.landing_root, DAY)).iterdir()} == landing

    expected = {reason: len(lines) for reason, lines in DIRTY_LINES.items()}
    assert set(expected) == set(LINE_REASONS)  # the fixture covers every line reason
    assert result.quarantined_by_reason == expected
    assert result.rows_in == len(CLEAN_LINES) + len(EXTRA_CLEAN) + sum(expected.values())
    assert result.rows_written == len(CLEAN_LINES) + len(EXTRA_CLEAN)

    bronze_ids = {r.event_id for r in tables.read_table(spark, cfg, BRONZE_AD_EVENTS).collect()}
    assert bronze_ids == {json.loads(x)["event_id"] for x in CLEAN_LINES + EXTRA_CLEAN}

    quarantine = tables.read_table(spark, cfg, BRONZE_QUARANTINE).collect()
    by_line = {(r.reason, r.raw_line) for r in quarantine}
    for reason, lines in DIRTY_LINES.items():
        for raw in lines:
            assert (reason, raw) in by_line, (reason, raw)  # the raw line is kept verbatim

    record = completions.require_completed(cfg, "ingest_events", DAY)
    assert record["rows_in"] == record["rows_written"] + record["rows_quarantined"]
    assert record["quarantined_by_reason"] == expected
    assert record["table_versions"][BRONZE_AD_EVENTS.name] == tables.latest_version(
        tables.table_path(cfg, BRONZE_AD_EVENTS)
    )

    # Rerun: identical contents, still exactly one completion record for the day.
    before = _snapshot(spark, cfg)
    ingest_events.run(StageContext(cfg, spark), DAY)
    assert _snapshot(spark, cfg) == before
    records = tables.read_table(spark, cfg, COMPLETIONS).where("stage = 'ingest_events'").count()
    assert records == 1


@pytest.mark.slow
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
        assert completions.completion(cfg, "ingest_events", DAY) is None, point

        monkeypatch.undo()
        ingest_events.run(StageContext(cfg, spark), DAY)
        assert _snapshot(spark, cfg) == reference, point
        assert completions.completion(cfg, "ingest_events", DAY) is not None


@pytest.mark.slow
def test_process_killed_after_bronze_commit(spark, tmp_path):
    """A real SIGKILL between the two table commits: no completion record; a rerun converges."""
    cfg = make_config(tmp_path)
    write_day(cfg.landing_root, DAY, CLEAN_LINES + EXTRA_CLEAN + all_dirty_lines())
    cfg_file = tmp_path / "gem.yaml"
    cfg_file.write_text(json.dumps(cfg.to_dict()))  # JSON is valid YAML
    env = subprocess_env(cfg_file) | {"GEM_CRASH_AT": "ingest_events:after_bronze"}
    proc = subprocess.run(
        [PYTHON, "-m", "jobs.ingest_events", "--ds", DAY], cwd=REPO, env=env, capture_output=True, text=True, check=False
    )
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert completions.completion(cfg, "ingest_events", DAY) is None
    # The bronze commit happened; the quarantine table never got its partition.
    assert len(_rows(spark, cfg, BRONZE_AD_EVENTS)) == len(CLEAN_LINES) + len(EXTRA_CLEAN)

    result = ingest_events.run(StageContext(cfg, spark), DAY)
    assert result.rows_in == result.rows_written + sum(result.quarantined_by_reason.values())
    assert len(_rows(spark, cfg, BRONZE_QUARANTINE)) == sum(len(v) for v in DIRTY_LINES.values())
    assert completions.completion(cfg, "ingest_events", DAY) is not None


def test_schema_drift_unexpected_column_fails_loudly(spark, tmp_path):
    cfg = make_config(tmp_path)
    write_day(cfg.landing_root, DAY, [line(f"d{i}", discount_pct=10) for i in range(10)])
    with pytest.raises(SchemaDriftError, match="unexpected column 'discount_pct' in 10 of 10") as drift:
        ingest_events.run(StageContext(cfg, spark), DAY)
    drift.value.rerun = f"python -m jobs.ingest_events --ds {DAY}"
    assert str(drift.value).splitlines()[-1] == (
        "FAILED schema_drift:discount_pct: found unexpected column in 10 of 10 rows (1); "
        f"bound at most {cfg.ingest.drift_max_type_error_rate} of a day's rows; "
        f"set by ingest.drift_max_type_error_rate; rerun: python -m jobs.ingest_events --ds {DAY}")
    assert completions.completion(cfg, "ingest_events", DAY) is None


def test_schema_drift_changed_type_fails_loudly(spark, tmp_path):
    cfg = make_config(tmp_path)
    # A producer switched event_time from epoch milliseconds to ISO strings.
    write_day(cfg.landing_root, DAY, [line(f"d{i}", event_time="2026-01-01T01:00:00Z") for i in range(10)])
    with pytest.raises(SchemaDriftError, match="wrong type in column 'event_time'.*event_time: long"):
        ingest_events.run(StageContext(cfg, spark), DAY)
    assert completions.completion(cfg, "ingest_events", DAY) is None


def test_missing_or_unfinished_landing_partition_is_named(spark, tmp_path):
    """The registry's landing need: ingest refuses a day whose producer has not finished, naming
    the command to run; a marker over no data files is refused naming the folder."""
    cfg = make_config(tmp_path)
    needs = rf"landing ds={DAY} \(no _SUCCESS marker\); run `python -m jobs.generate_events --ds {DAY}` first"
    with pytest.raises(MissingInputError, match=needs):
        ingest_events.run(StageContext(cfg, spark), DAY)
    folder = Path(partition_dir(cfg.landing_root, DAY))
    folder.mkdir(parents=True)
    (folder / "part-0.json.gz").write_bytes(b"")
    with pytest.raises(MissingInputError, match=needs):
        ingest_events.run(StageContext(cfg, spark), DAY)
    (folder / "part-0.json.gz").unlink()
    mark_partition_complete(cfg.landing_root, DAY, {"producer": "test"})
    with pytest.raises(MissingLandingPartition, match=f"{folder} has a _SUCCESS marker but no"):
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
    rows = tables.read_table(spark, cfg, BRONZE_QUARANTINE).where(f"ds = DATE'{next_day}'").collect()
    assert [r.detail for r in rows] == [f"already in bronze ds={DAY}"]


def test_cli_rejects_a_malformed_day():
    proc = subprocess.run(
        [PYTHON, "-m", "jobs.ingest_events", "--ds", "2026-13-01"], cwd=REPO, env=subprocess_env(),
        capture_output=True, text=True, check=False,
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


def _counts(record) -> tuple:
    """What a range run's record of a day must share with the daily run's."""
    return record["rows_in"], record["rows_written"], record["quarantined_by_reason"]


def _range_landing(cfg) -> list[str]:
    """Three landing days: dirty rows on the first, an event replayed from the first on the second
    and third, so dedup across the range's own days is exercised."""
    days = [DAY, "2026-01-02", "2026-01-03"]
    write_day(cfg.landing_root, days[0], CLEAN_LINES + EXTRA_CLEAN + all_dirty_lines())
    replayed = line("g2", event_type="click", surface="fb_feed")  # the id of a day-1 event
    for i, d in enumerate(days[1:], start=1):
        fresh = [line(f"n{i}-{k}", event_time=1767225600000 + i * 86_400_000 + 60_000 * k) for k in range(3)]
        write_day(cfg.landing_root, d, [replayed, *fresh])
    return days


@pytest.mark.slow
def test_a_range_commit_equals_ingesting_the_days_one_by_one(spark, tmp_path):
    """`--through`: one commit per table for three days, one record per day, and the same bronze,
    quarantine and per-day counts as three daily runs; a rerun of the range converges."""
    from deltalake import DeltaTable

    one_by_one, ranged = make_config(tmp_path / "daily"), make_config(tmp_path / "range")
    days = _range_landing(one_by_one)
    _range_landing(ranged)
    daily = [ingest_events.run(StageContext(one_by_one, spark), d) for d in days]
    result = ingest_events.run(StageContext(ranged, spark), days[0], days[-1])

    def contents(cfg):
        return [_rows(spark, cfg, schema, d) for d in days for schema in (BRONZE_AD_EVENTS, BRONZE_QUARANTINE)]

    assert contents(ranged) == contents(one_by_one)
    records = [completions.completion(ranged, "ingest_events", d) for d in days]
    assert [_counts(r) for r in records] == [_counts(r.record) for r in daily]
    assert records[1]["quarantined_by_reason"] == {"duplicate_event_id": 1}  # the replay of a day-1 event
    assert [r["ds"] for r in result.records] == days and len({r["run_id"] for r in records}) == 1
    for schema in (BRONZE_AD_EVENTS, BRONZE_QUARANTINE):  # one commit per table for the three days
        writes = [c for c in DeltaTable(tables.table_path(ranged, schema)).history()
                  if records[0]["run_id"] in (c.get("userMetadata") or "")]
        assert len(writes) == 1 and all(r["table_versions"][schema.name] == writes[0]["version"] for r in records)
    again = ingest_events.run(StageContext(ranged, spark), days[0], days[-1])
    assert contents(ranged) == contents(one_by_one) and again.quarantined_by_reason == result.quarantined_by_reason


def test_damaged_and_misnamed_files_are_quarantined_and_counted_per_file(spark, tmp_path):
    """A truncated gzip and a file that is not gzip at all: their readable lines quarantined as
    unreadable_file (the other files ingested); a file whose name breaks the landing pattern: every
    line quarantined as unexpected_file_name. in = written + quarantined for every file."""
    import gzip

    cfg = make_config(tmp_path)
    write_day(cfg.landing_root, DAY, CLEAN_LINES + EXTRA_CLEAN)
    folder = Path(partition_dir(cfg.landing_root, DAY))
    misnamed = [line("x-1", user_id="u9"), line("x-2", user_id="u9")]
    (folder / "extra.jsonl.gz").write_bytes(gzip.compress(("\n".join(misnamed) + "\n").encode()))
    whole = gzip.compress(("\n".join(line(f"cut-{i}") for i in range(200)) + "\n").encode())
    (folder / "truncated.json.gz").write_bytes(whole[: len(whole) // 2])
    (folder / "plain.json.gz").write_bytes(b'{"event_id": "p1"}\n')  # named .gz, not gzip
    (folder / "notes.manifest.json").write_text("{}")  # producer metadata beside the data: not read

    result = ingest_events.run(StageContext(cfg, spark), DAY)
    files = result.details["files"][DAY]
    assert sorted(files) == ["extra.jsonl.gz", "part-0.json.gz", "plain.json.gz", "truncated.json.gz"]
    for name, counts in files.items():
        assert counts["in"] == counts["written"] + sum(counts["quarantined"].values()), name
    assert files["part-0.json.gz"] == {"in": 24, "written": 24, "quarantined": {}}
    assert files["extra.jsonl.gz"]["quarantined"] == {"unexpected_file_name": 2}
    assert files["plain.json.gz"]["quarantined"] == {"unreadable_file": 1}
    cut = files["truncated.json.gz"]["quarantined"]["unreadable_file"]
    assert 0 < cut < 200 and files["truncated.json.gz"]["written"] == 0
    assert result.rows_in == sum(f["in"] for f in files.values()) == 24 + 2 + 1 + cut
    assert result.quarantined_by_reason == {"unexpected_file_name": 2, "unreadable_file": 1 + cut}

    quarantine = tables.read_table(spark, cfg, BRONZE_QUARANTINE).collect()
    misnamed_rows = [r for r in quarantine if r.source_file == "extra.jsonl.gz"]
    assert sorted(r.raw_line for r in misnamed_rows) == sorted(misnamed)
    assert all("*.json.gz" in r.detail for r in misnamed_rows)
    truncated_rows = [r for r in quarantine if r.source_file == "truncated.json.gz"]
    assert all("truncated.json.gz" in r.detail and "line" in r.detail for r in truncated_rows)
    assert truncated_rows and all(r.raw_line.startswith('{"event_id": "cut-') for r in truncated_rows)
    plain = [r for r in quarantine if r.source_file == "plain.json.gz"]
    assert [r.raw_line for r in plain] == [""] and "not a readable gzip file" in plain[0].detail
    bronze_ids = {r.event_id for r in tables.read_table(spark, cfg, BRONZE_AD_EVENTS).collect()}
    assert bronze_ids == {json.loads(x)["event_id"] for x in CLEAN_LINES + EXTRA_CLEAN}


def test_duplicates_ingested_out_of_order_are_caught_within_the_lookback(spark, tmp_path):
    """Day 2 ingested before day 1 with a shared event id: day 1's copy is the duplicate (bronze
    never holds both). Beyond dedup_lookback_days a repeat is not caught: the documented limit."""
    cfg = make_config(tmp_path, ingest={"dedup_lookback_days": 1})
    day2, day4 = "2026-01-02", "2026-01-04"
    shared = line("dup-1", event_time=1767225600000 + 60_000)
    write_day(cfg.landing_root, DAY, [shared, line("a-1")])
    write_day(cfg.landing_root, day2, [line("dup-1", event_time=1767225600000 + 60_000), line("b-1")])
    write_day(cfg.landing_root, day4, [line("a-1")])  # 3 days after day 1: outside the 1-day lookback
    ingest_events.run(StageContext(cfg, spark), day2)
    first = ingest_events.run(StageContext(cfg, spark), DAY)
    assert first.quarantined_by_reason == {"duplicate_event_id": 1}
    rows = tables.read_table(spark, cfg, BRONZE_QUARANTINE).where(f"ds = DATE'{DAY}'").collect()
    assert [(r.detail, r.raw_line) for r in rows] == [(f"already in bronze ds={day2}", shared)]
    assert ingest_events.run(StageContext(cfg, spark), day2).quarantined_by_reason == {}  # a rerun keeps it
    assert ingest_events.run(StageContext(cfg, spark), day4).quarantined_by_reason == {}  # not caught


def _edge_case_lakehouse(spark, cfg) -> list[str]:
    """Five landing days, D1 and D5 already ingested, for a range D2..D4 between them (lookback 1
    day): copies of bronze events from both sides of the range, a chain of copies one lookback apart
    (D2, D3, D4: D3's duplicates D2's; D4's is good, as D3's was not), a repeat within a day across
    two files, a damaged file, a misnamed file and dirty lines (whose time rules read their own day)."""
    import gzip

    days = [DAY, "2026-01-02", "2026-01-03", "2026-01-04", "2026-01-05"]

    def at(i: int, minute: int = 1) -> int:  # epoch ms on day i
        return 1767225600000 + i * 86_400_000 + 60_000 * minute

    def landing(i: int, lines: list[str], name: str = "part-0") -> None:
        fresh = [line(f"n{i}-{name}-{k}", event_time=at(i, k)) for k in range(3)]
        write_day(cfg.landing_root, days[i], lines + fresh, name=name)

    landing(0, [line("b1", event_time=at(0))])
    landing(1, [line("b1", event_time=at(0)), line("c1", event_time=at(1)), line("w1", event_time=at(1))])
    landing(1, [line("w1", event_time=at(1))], name="part-1")
    whole = gzip.compress(("\n".join(line(f"cut-{i}", event_time=at(1)) for i in range(200)) + "\n").encode())
    (Path(partition_dir(cfg.landing_root, days[1])) / "truncated.json.gz").write_bytes(whole[: len(whole) // 2])
    landing(2, [line("c1", event_time=at(1)), *all_dirty_lines()])
    (Path(partition_dir(cfg.landing_root, days[2])) / "extra.jsonl.gz").write_bytes(
        gzip.compress((line("x-1", event_time=at(2)) + "\n").encode()))
    landing(3, [line("c1", event_time=at(1)), line("a5", event_time=at(3))])
    landing(4, [line("a5", event_time=at(3))])
    for d in (days[0], days[4]):
        ingest_events.run(StageContext(cfg, spark), d)
    return days


def test_a_range_with_every_edge_case_equals_the_days_one_by_one(spark, tmp_path):
    """Duplicates inside the range, against bronze on both sides and along a chain of copies, a
    damaged and a misnamed file on single days, dirty lines on a later day: one range run writes
    the tables, records and per-file counts that the daily runs, in order, write."""
    import shutil

    from tests.support import lakehouse_rows

    settings = {"ingest": {"dedup_lookback_days": 1}}
    one_by_one, ranged = make_config(tmp_path / "daily", **settings), make_config(tmp_path / "range", **settings)
    days = _edge_case_lakehouse(spark, one_by_one)
    shutil.copytree(tmp_path / "daily", tmp_path / "range")  # the same landing days and bronze
    inner = days[1:4]
    daily = [ingest_events.run(StageContext(one_by_one, spark), d) for d in inner]
    result = ingest_events.run(StageContext(ranged, spark), inner[0], inner[-1])

    for schema in (BRONZE_AD_EVENTS, BRONZE_QUARANTINE):
        assert lakehouse_rows(ranged, schema.name) == lakehouse_rows(one_by_one, schema.name), schema.name
    assert [_counts(completions.completion(ranged, "ingest_events", d)) for d in inner] == [
        _counts(completions.completion(one_by_one, "ingest_events", d)) for d in inner]
    assert result.details["files"] == {d: r.details["files"][d] for d, r in zip(inner, daily)}

    duplicates = {(str(r.ds), json.loads(r.raw_line)["event_id"], r.detail)
                  for r in tables.read_table(spark, ranged, BRONZE_QUARANTINE).collect()
                  if r.reason == "duplicate_event_id"}
    assert duplicates == {
        (days[1], "b1", f"already in bronze ds={days[0]}"),
        (days[1], "w1", "repeated within this ds"),
        (days[2], "c1", f"already in bronze ds={days[1]}"),  # D4's copy is good: D3's was a duplicate
        (days[3], "a5", f"already in bronze ds={days[4]}"),
    }
    files = result.details["files"]
    assert files[days[1]]["truncated.json.gz"]["written"] == 0
    assert files[days[2]]["extra.jsonl.gz"]["quarantined"] == {"unexpected_file_name": 1}


def test_a_gate_failing_under_gem_bulk_ends_with_its_line_and_the_bulk_to_rerun(spark, tmp_path, capsys):
    """The drift gate, hit by `gem bulk` (gem.pipeline.bulk): its last line names the check, the
    rate found, the bound, the key and the bulk command that reruns the range."""
    from gem.pipeline import bulk

    config_file = tmp_path / "gem.yaml"
    config_file.write_text(yaml.safe_dump({"lakehouse_uri": str(tmp_path / "lakehouse"), "source": "landing"}))
    cfg = make_config(tmp_path, source="landing")
    write_day(cfg.landing_root, DAY, [line(f"d{i}", discount_pct=10) for i in range(10)])
    argv = ["--start", DAY, "--end", DAY, "--through-stage", "ingest_events", "--config", str(config_file)]
    assert bulk.main(argv) == 1
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last == ("FAILED schema_drift:discount_pct: found unexpected column in 10 of 10 rows (1); "
                    f"bound at most {cfg.ingest.drift_max_type_error_rate} of a day's rows; "
                    f"set by ingest.drift_max_type_error_rate; rerun: gem bulk {' '.join(argv)}")


def test_a_gate_failing_in_a_dag_task_names_the_backfill_that_reruns_the_day(spark, tmp_path, monkeypatch):
    """The same gate in the DAG's task function (gem.pipeline.airflow.orchestration.run_stage_task,
    against the config $GEM_CONFIG names): the error, as the task's log and `gem status` show it,
    ends with the backfill that reruns the day from the failed stage."""
    from gem.pipeline.airflow.orchestration import run_stage_task

    config_file = tmp_path / "gem.yaml"
    config_file.write_text(yaml.safe_dump({"lakehouse_uri": str(tmp_path / "lakehouse"), "source": "landing"}))
    monkeypatch.setenv("GEM_CONFIG", str(config_file))
    cfg = make_config(tmp_path, source="landing")
    write_day(cfg.landing_root, DAY, [line(f"d{i}", discount_pct=10) for i in range(10)])
    with pytest.raises(SchemaDriftError) as drift:
        run_stage_task("ingest_events", DAY)
    assert str(drift.value).splitlines()[-1].endswith(
        f"set by ingest.drift_max_type_error_rate; rerun: gem backfill --start {DAY} --end {DAY} "
        f"--from-stage ingest_events --config {config_file}")

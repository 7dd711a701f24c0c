"""`gem delete-user`: one user's rows gone from every table, their raw lines from landing and the
quarantine, everyone else's untouched; older versions keep them until VACUUM (real Delta tables
through deltalake, real gzip landing files)."""

from __future__ import annotations

import datetime as dt
import gzip
import json
from pathlib import Path

import pytest
from deltalake import DeltaTable

from gem.data.delta_log import read_table
from gem.lakehouse.erasure import erase_user, names_user
from gem.lakehouse.tables import table_path
from schemas import TABLES
from schemas.events import BRONZE_QUARANTINE
from tests.landing_lines import line, write_day
from tests.precompute_lakehouse import build_days, precompute_config, write_partition

GONE = "u00003"


def _users(cfg, name: str, version: int | None = None) -> list[str]:
    path = table_path(cfg, TABLES[name])
    return sorted(read_table(path, version, columns=["user_id"]).column("user_id").to_pylist())


def _landing_lines(cfg, ds: str) -> list[str]:
    folder = Path(cfg.landing_root) / f"ds={ds}"
    return [x for f in sorted(folder.glob("*.json.gz")) for x in gzip.decompress(f.read_bytes()).decode().splitlines()]


@pytest.fixture
def lakehouse(tmp_path, spark):  # the Spark-written tables are erased from through Spark
    cfg = precompute_config(tmp_path)
    build_days(cfg, 2, users=8)
    raw = [line("q1", user_id=GONE), '{"event_id": "q2", "user_id": "u00004", "broken', line("q3", user_id=3),
           '{"event_id": "q4", "user_id": "u00003", "broken']
    write_partition(cfg, BRONZE_QUARANTINE, "2026-01-01", {"raw_line": raw, "reason": ["malformed_json"] * 4,
                                                           "source_file": ["part-0.json.gz"] * 4}, 4)
    write_day(cfg.landing_root, "2026-01-01", [line("e1", user_id=GONE), line("e2", user_id="u00004"),
                                               line("e3", user_id=GONE)])
    return cfg


def test_the_user_is_gone_from_every_table_and_landing_and_nobody_else_is(lakehouse) -> None:
    cfg = lakehouse
    user_tables = [n for n, s in TABLES.items() if "user_id" in s.column_names
                   and Path(table_path(cfg, s), "_delta_log").is_dir()]
    assert len(user_tables) >= 3  # sequences, features, examples
    before = {n: _users(cfg, n) for n in user_tables}
    landing_before = _landing_lines(cfg, "2026-01-01")
    examples_before = DeltaTable(table_path(cfg, TABLES["silver.training_examples"])).version()

    report = erase_user(cfg, GONE, now=dt.datetime(2026, 12, 3, 12, 0, tzinfo=dt.UTC))

    for name in user_tables:
        assert GONE in before[name]
        assert _users(cfg, name) == [u for u in before[name] if u != GONE], name
        assert report.rows_deleted[name] == before[name].count(GONE)
    quarantine = read_table(table_path(cfg, BRONZE_QUARANTINE), columns=["raw_line"]).column("raw_line").to_pylist()
    assert len(quarantine) == 2 and not any(names_user(r, GONE) for r in quarantine)  # the JSON line and the broken one
    assert report.rows_deleted[BRONZE_QUARANTINE.name] == 2
    assert _landing_lines(cfg, "2026-01-01") == [x for x in landing_before if json.loads(x)["user_id"] != GONE]
    assert sum(report.landing_lines_removed.values()) == 2
    # Older versions still hold the user until VACUUM, from the day the report names.
    assert GONE in _users(cfg, "silver.training_examples", version=examples_before)
    # 60 days after the erasure is a Monday, 12:00 UTC; the weekly upkeep (Sundays 06:00 UTC) after that:
    assert cfg.retention_days == 60
    assert report.vacuum_from == dt.datetime(2027, 2, 7, 6, 0, tzinfo=dt.UTC)
    assert any("2027-02-07 06:00 UTC" in x for x in report.lines())


def test_a_second_deletion_finds_nothing_and_writes_nothing(lakehouse) -> None:
    erase_user(lakehouse, GONE)
    versions = {n: DeltaTable(table_path(lakehouse, s)).version() for n, s in TABLES.items()
                if Path(table_path(lakehouse, s), "_delta_log").is_dir()}
    again = erase_user(lakehouse, GONE)
    assert again.rows_deleted == {} and again.landing_lines_removed == {} and again.vacuum_from is None
    assert versions == {n: DeltaTable(table_path(lakehouse, TABLES[n])).version() for n in versions}
    assert "nothing held this user" in "\n".join(again.lines())


def test_which_raw_lines_name_a_user() -> None:
    assert names_user('{"user_id": "u1", "x": 1}', "u1")
    assert names_user('{"user_id": 12345}', "12345")  # an id that arrived as a number
    assert not names_user('{"user_id": "u12"}', "u1")
    assert names_user('{"event_id": "e", "user_id": "u1", "bro', "u1")  # not JSON: the field still names it
    assert not names_user('{"event_id": "e", "user_id": "u12", "bro', "u1")
    assert not names_user('{"advertiser_id": "u1"}', "u1")
    with pytest.raises(ValueError, match="user id"):
        erase_user(None, " ")  # type: ignore[arg-type]


def test_misnamed_landing_files_are_rewritten_too_and_a_damaged_one_is_listed(lakehouse) -> None:
    """Ingestion reads every file of a partition (a misnamed one's lines go to the quarantine), so a
    misnamed file keeping the user's lines would bring them back on a re-ingest."""
    cfg = lakehouse
    folder = Path(cfg.landing_root) / "ds=2026-01-02"
    folder.mkdir(parents=True)
    lines = [line("m1", user_id=GONE), line("m2", user_id="u00004")]
    (folder / "extra.jsonl").write_text("\n".join(lines) + "\n")  # plain text, as Spark reads it
    (folder / "extra.jsonl.gz").write_bytes(gzip.compress(("\n".join(lines) + "\n").encode()))
    whole = gzip.compress(("\n".join(lines * 50) + "\n").encode())
    (folder / "cut.json.gz").write_bytes(whole[: len(whole) // 2])  # truncated: its first lines readable

    report = erase_user(cfg, GONE)

    assert (folder / "extra.jsonl").read_text().splitlines() == lines[1:]
    assert gzip.decompress((folder / "extra.jsonl.gz").read_bytes()).decode().splitlines() == lines[1:]
    assert report.landing_lines_removed["ds=2026-01-02/extra.jsonl"] == 1
    assert report.landing_lines_removed["ds=2026-01-02/extra.jsonl.gz"] == 1
    assert report.damaged_landing_files == [str(folder / "cut.json.gz")]
    assert sorted(p.name for p in folder.iterdir()) == ["cut.json.gz", "extra.jsonl", "extra.jsonl.gz"]  # no temp left

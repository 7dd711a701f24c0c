"""Lakehouse upkeep (gem.lakehouse.upkeep) on real Delta tables, each through its writer engine (Spark
for the Spark stages' tables, deltalake for the others): quarantined lines expire with their
retention, small files are compacted without changing a row, and VACUUM deletes only files retired
longer ago than the tables' retention."""

from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path
from urllib.parse import unquote

import pytest
from deltalake import DeltaTable, write_deltalake

from gem.data.delta_log import MissingDataFileError, read_table
from gem.lakehouse.tables import table_path
from gem.lakehouse.upkeep import upkeep
from schemas.events import BRONZE_QUARANTINE
from schemas.features import SILVER_USER_FEATURES
from tests.precompute_lakehouse import build_days, precompute_config, write_partition


def _rows(path: str, version: int | None = None) -> list[tuple]:
    return sorted(tuple(map(repr, r.values())) for r in read_table(path, version).to_pylist())


def _age_retired_files(path: str, version: int, days: int) -> None:
    """Make the files `version` retired look retired and written `days` ago (rewrites their remove
    actions' deletionTimestamp in the log, and sets the files' modification time back): the clocks
    VACUUM reads, moved back instead of waiting (Spark's VACUUM reads both)."""
    log = Path(path, "_delta_log", f"{version:020d}.json")
    back = dt.datetime.now(dt.UTC) - dt.timedelta(days=days)
    actions = [json.loads(x) for x in log.read_text().splitlines()]
    for a in actions:
        if "remove" in a:
            a["remove"]["deletionTimestamp"] = int(back.timestamp() * 1000)
            os.utime(Path(path, unquote(a["remove"]["path"])), (back.timestamp(), back.timestamp()))
    log.write_text("\n".join(json.dumps(a) for a in actions) + "\n")
    log.with_name(f".{log.name}.crc").unlink(missing_ok=True)  # Hadoop's checksum of the entry as Spark wrote it


def _last(path: str, operation: str) -> int:
    """The version of the table's newest `operation` commit (VACUUM adds commits of its own)."""
    return next(int(c["version"]) for c in DeltaTable(path).history() if c["operation"] == operation)


@pytest.fixture
def lakehouse(tmp_path, spark):
    cfg = precompute_config(tmp_path)
    build_days(cfg, 2, users=8)
    for ds in ("2026-01-01", "2026-01-20", "2026-02-01"):
        write_partition(cfg, BRONZE_QUARANTINE, ds, {"raw_line": [f"bad line of {ds}"] * 2,
                                                     "reason": ["malformed_json"] * 2,
                                                     "source_file": ["part-0.json.gz"] * 2}, 2)
    features = table_path(cfg, SILVER_USER_FEATURES)
    for _ in range(3):  # three more small files in one partition, as reruns and appends leave them
        write_deltalake(features, read_table(features, where={"ds": "2026-01-02"}).slice(0, 2), mode="append")
    return cfg


def test_upkeep_expires_old_quarantine_compacts_and_vacuums_only_past_retention(lakehouse, spark) -> None:
    cfg = lakehouse
    features = table_path(cfg, SILVER_USER_FEATURES)
    files_before, rows_before = len(DeltaTable(features).file_uris()), _rows(features)
    version_before = DeltaTable(features).version()

    first = upkeep(cfg, "2026-02-05", spark)  # past the quarantine retention for the first days only

    quarantine = read_table(table_path(cfg, BRONZE_QUARANTINE)).column("ds").to_pylist()
    assert sorted({d.isoformat() for d in quarantine}) == ["2026-01-20", "2026-02-01"]
    assert first.quarantine_rows_expired == 2 and first.quarantine_before == "2026-01-06"
    assert _rows(features) == rows_before  # OPTIMIZE changes files, never rows
    assert len(DeltaTable(features).file_uris()) < files_before
    assert first.files_compacted[SILVER_USER_FEATURES.name][0] >= 4
    assert first.files_vacuumed == {}  # everything retired just now: within retention_days
    assert _rows(features, version_before) == rows_before  # the older version still reads

    # Once the compaction's retired files are older than the retention, VACUUM deletes them.
    _age_retired_files(features, _last(features, "OPTIMIZE"), cfg.retention_days + 1)
    second = upkeep(cfg, "2026-02-05", spark)
    assert second.files_vacuumed[SILVER_USER_FEATURES.name] == first.files_compacted[SILVER_USER_FEATURES.name][0]
    assert _rows(features) == rows_before
    with pytest.raises(MissingDataFileError):  # its files are gone from disk
        _rows(features, version_before)
    assert any("VACUUM" in x and SILVER_USER_FEATURES.name in x for x in second.lines())


def test_upkeep_waits_while_a_backfill_holds_its_range(lakehouse, spark, tmp_path, monkeypatch) -> None:
    """A running backfill: upkeep touches no table (each OPTIMIZE commit would race the backfill's
    rewrites), and its DAG task is rescheduled, not failed; once the hold is released it runs."""
    from airflow.sdk.exceptions import AirflowRescheduleException

    from gem.lakehouse.backfill_hold import BackfillInProgressError, hold
    from gem.pipeline.airflow.orchestration import BACKFILL_POKE_ENV
    from gem.pipeline.airflow.upkeep_dag import run_upkeep

    cfg = lakehouse

    def versions() -> list[int]:
        return [DeltaTable(table_path(cfg, s)).version() for s in (BRONZE_QUARANTINE, SILVER_USER_FEATURES)]

    before = versions()
    config_file = tmp_path / "gem.yaml"
    config_file.write_text(f"lakehouse_uri: {cfg.lakehouse_uri}\n")
    monkeypatch.setenv("GEM_CONFIG", str(config_file))
    monkeypatch.setenv(BACKFILL_POKE_ENV, "5")
    with hold(cfg, "2026-01-01", "2026-01-02", "backfill-test"):
        with pytest.raises(BackfillInProgressError, match=r"backfill 2026-01-01\.\.2026-01-02"):
            upkeep(cfg, "2026-02-05")
        with pytest.raises(AirflowRescheduleException) as rescheduled:
            run_upkeep("2026-02-05")
        assert isinstance(rescheduled.value.__cause__, BackfillInProgressError)
    assert versions() == before
    assert upkeep(cfg, "2026-02-05", spark).quarantine_rows_expired == 2  # the backfill done: upkeep runs


def test_a_day_compacted_or_erased_from_after_its_validation_still_reads_as_validated(tmp_path, spark) -> None:
    """The weekly OPTIMIZE rewrites a validated day's files with the same rows, and `gem delete-user`
    removes one user's rows: the stages that read the day as validated (StageCommit.validated_version)
    go on reading it; any other change of its rows after the validation is still refused. Refusing
    them too would fail the first daily run after an upkeep or an erasure on every day they touched."""
    from gem.lakehouse import completions
    from gem.lakehouse.commit import StageCommit, StageContext
    from gem.lakehouse.erasure import erase_tables
    from gem.lakehouse.upkeep import compact
    from tests.precompute_lakehouse import precompute_config, promote_model, publish_training_records

    cfg = precompute_config(tmp_path)
    _, days = build_days(cfg, 2, users=8)
    promote_model(cfg, days[0])
    publish_training_records(cfg, days[1])
    day = days[1]
    features = table_path(cfg, SILVER_USER_FEATURES)
    # A day of several files, validated as such (e.g. written, then topped up before its validation).
    write_deltalake(features, read_table(features, where={"ds": day}).slice(0, 3), mode="append")
    silver = dict(completions.completion(cfg, "validate_silver", day)["table_versions"])
    silver[SILVER_USER_FEATURES.name] = validated = DeltaTable(features).version()
    completions.publish_completion(cfg, "validate_silver", day, "test:revalidated", None, 0, {}, silver,
                                   reconciliation="test")
    validated_rows = sorted(map(repr, read_table(features, validated, where={"ds": day}).to_pylist()))

    removed, added = compact(cfg, SILVER_USER_FEATURES, lambda: spark)
    assert removed >= 2 and added >= 1

    def read_as_validated() -> list[str]:
        commit = StageCommit.begin(StageContext(cfg), "precompute", day)
        version = commit.validated_version(SILVER_USER_FEATURES, "validate_silver", [day])
        return sorted(map(repr, read_table(features, version, where={"ds": day}).to_pylist()))

    assert read_as_validated() == validated_rows
    erased = read_table(features, where={"ds": day}).column("user_id")[0].as_py()
    assert erase_tables(cfg, erased, spark)[SILVER_USER_FEATURES.name] >= 1
    assert read_as_validated() == [r for r in validated_rows if repr(erased) not in r]
    write_deltalake(features, read_table(features, where={"ds": day}).slice(0, 1), mode="append")  # new rows
    with pytest.raises(completions.StaleInputError, match=rf"user_features ds={day} changed after its validation"):
        read_as_validated()

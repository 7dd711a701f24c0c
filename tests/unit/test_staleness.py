"""gem.lakehouse.staleness and `python -m jobs.status`: a day rewritten with other rows makes every
later record that rested on it stale (the same rows, by fingerprint, do not), readers refuse stale
inputs naming what to rerun, and the listing shows done / stale / missing per stage and day. Real
completion records in a real Delta table (deltalake, no Spark), written as gem.lakehouse.commit
writes them."""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from gem.lakehouse import completions, tables
from gem.lakehouse.commit import StageCommit, StageContext, input_key
from gem.lakehouse.staleness import DONE, MISSING, STALE, Ledger, all_records
from jobs import status
from schemas.ops import COMPLETIONS
from tests.support import make_config

S = "2026-01-01"
DAYS = ["2026-01-01", "2026-01-02", "2026-01-03"]
BRONZE = "bronze.ad_events"
SEQ = "silver.user_sequences"


def _publish(cfg, stage: str, day: str, created: dict[str, int], read: dict[str, int]) -> None:
    completions.publish_completion(cfg, stage, day, f"{stage}:{day}", None, 0, {}, created, read,
                                 reconciliation="test: versions only")


def _chain(cfg, bronze_version: dict[str, int]) -> None:
    """ingest -> validate_events -> build_sequences over DAYS, each record naming what it read."""
    for i, day in enumerate(DAYS):
        v = bronze_version[day]
        _publish(cfg, "ingest_events", day, {BRONZE: v}, {})
        _publish(cfg, "validate_events", day, {BRONZE: v}, {input_key("ingest_events", BRONZE, day): v})
        read = {input_key("validate_events", BRONZE, day): v}
        if i:
            read[input_key("build_sequences", SEQ, DAYS[i - 1])] = 100 + i - 1
        _publish(cfg, "build_sequences", day, {SEQ: 100 + i}, read)


def test_rewriting_a_day_makes_everything_after_it_stale(tmp_path):
    cfg = make_config(tmp_path, start_ds=S)
    _chain(cfg, {d: 10 + i for i, d in enumerate(DAYS)})
    ledger = Ledger(all_records(cfg))
    assert {ledger.status(s, d).state for s in ("ingest_events", "validate_events", "build_sequences")
            for d in DAYS} == {DONE}
    # Day 2 re-ingested (a new bronze version); nothing after it rerun yet.
    _publish(cfg, "ingest_events", DAYS[1], {BRONZE: 42}, {})
    ledger = Ledger(all_records(cfg))
    states = {(s, d): ledger.status(s, d).state for s in ("validate_events", "build_sequences") for d in DAYS}
    assert states == {("validate_events", DAYS[0]): DONE, ("validate_events", DAYS[1]): STALE,
                      ("validate_events", DAYS[2]): DONE, ("build_sequences", DAYS[0]): DONE,
                      ("build_sequences", DAYS[1]): STALE, ("build_sequences", DAYS[2]): STALE}
    later = ledger.status("build_sequences", DAYS[2])
    assert later.rerun_first == ("validate_events", DAYS[1])  # the first record whose own input changed
    assert "bronze.ad_events v42 (read v11)" in later.why


def test_a_withdrawn_input_makes_its_readers_stale(tmp_path):
    cfg = make_config(tmp_path, start_ds=S)
    _chain(cfg, {d: 10 for d in DAYS})
    completions.clear_completion(cfg, "validate_events", DAYS[0])  # a rerun that has not finished
    ledger = Ledger(all_records(cfg))
    assert ledger.status("validate_events", DAYS[0]).state == MISSING
    assert ledger.status("build_sequences", DAYS[0]).state == STALE
    assert ledger.status("build_sequences", DAYS[2]).state == STALE


def test_a_reader_refuses_a_stale_input_naming_the_rerun(tmp_path):
    cfg = make_config(tmp_path, start_ds=S, attribution_window_days=0, mix={"train_days": 1})
    _publish(cfg, "mix", DAYS[1], {"gold.mixture_manifest": 3}, {input_key("validate_examples", "x", DAYS[1]): 5})
    _publish(cfg, "validate_examples", DAYS[1], {"x": 6}, {})  # its examples were revalidated at 6
    with pytest.raises(completions.StaleInputError,
                       match=r"pretrain ds=2026-01-02 needs mix ds=2026-01-02, which is stale .*"
                             r"rerun `python -m jobs.mix --ds 2026-01-02` first"):
        StageCommit.begin(StageContext(cfg), "pretrain", DAYS[1])


def test_status_lists_done_stale_and_missing(tmp_path, capsys):
    cfg = make_config(tmp_path, start_ds=S)
    _chain(cfg, {d: 10 for d in DAYS})
    _publish(cfg, "ingest_events", DAYS[2], {BRONZE: 11}, {})
    lines, stale = status.grid(cfg, DAYS)
    rows = {line.split()[0]: line.split()[1:] for line in lines[1:]}
    assert rows["ingest_events"] == [DONE, DONE, DONE]
    assert rows["validate_events"] == [DONE, DONE, STALE]
    assert rows["build_sequences"] == [DONE, DONE, STALE]
    assert rows["build_features"] == [MISSING] * 3
    assert rows["mix"][0] == status.NOTHING_TO_DO  # no training day before the first held-out day
    assert len(stale) == 2 and all("rerun `python -m jobs.validate_events --ds 2026-01-03`" in s for s in stale)
    cfg_file = tmp_path / "gem.yaml"
    cfg_file.write_text(f"lakehouse_uri: {cfg.lakehouse_uri}\nstart_ds: '{S}'\n")
    assert status.main(["--config", str(cfg_file)]) == 0
    out = capsys.readouterr().out
    assert "01-01  01-02  01-03" in out and "2 stale:" in out


def test_a_completions_table_made_before_the_fingerprint_columns_gets_them_on_the_next_write(tmp_path):
    """A lakehouse from before `table_fingerprints` / `input_fingerprints` existed: its next record
    adds the columns (one commit), its older records read back with none, and versions still decide."""
    cfg = make_config(tmp_path, start_ds=S)
    path = tables.table_path(cfg, COMPLETIONS)
    older = pa.schema([f for f in COMPLETIONS.arrow_schema() if not f.name.endswith("_fingerprints")])
    row = completions.completion_row("ingest_events", DAYS[0], "old", None, 0, {}, {BRONZE: 10},
                                     reconciliation="test: made before fingerprints")
    write_deltalake(path, pa.Table.from_pylist([{k: row[k] for k in older.names}], schema=older),
                    partition_by=list(COMPLETIONS.partition_by))
    _publish(cfg, "validate_events", DAYS[0], {BRONZE: 10}, {input_key("ingest_events", BRONZE, DAYS[0]): 10})
    assert DeltaTable(path).schema().to_arrow().names == COMPLETIONS.arrow_schema().names
    old = completions.completion(cfg, "ingest_events", DAYS[0])
    assert old["table_fingerprints"] == {} and old["completed_at"] < dt.datetime.now(dt.UTC)
    assert Ledger(all_records(cfg)).status("validate_events", DAYS[0]).state == DONE
    _publish(cfg, "ingest_events", DAYS[0], {BRONZE: 11}, {})  # rewritten, no fingerprint to compare: stale
    assert Ledger(all_records(cfg)).status("validate_events", DAYS[0]).state == STALE


def test_a_rewrite_with_the_same_fingerprint_leaves_its_readers_valid(tmp_path):
    cfg = make_config(tmp_path, start_ds=S)
    key = input_key("ingest_events", BRONZE, DAYS[0])

    def ingest(version: int, fingerprint: str) -> None:
        row = completions.completion_row("ingest_events", DAYS[0], f"ingest:{version}", None, 0, {}, {BRONZE: version},
                                         reconciliation="test", table_fingerprints={BRONZE: fingerprint})
        completions.publish_rows(cfg, "ingest_events", row["run_id"], [row])

    ingest(10, "5:123")
    row = completions.completion_row("validate_events", DAYS[0], "v", None, 0, {}, {BRONZE: 10}, {key: 10},
                                     reconciliation="test", input_fingerprints={key: "5:123"})
    completions.publish_rows(cfg, "validate_events", "v", [row])
    ingest(11, "5:123")  # the same rows again
    assert Ledger(all_records(cfg)).status("validate_events", DAYS[0]).state == DONE
    ingest(12, "5:124")  # one row changed
    status_now = Ledger(all_records(cfg)).status("validate_events", DAYS[0])
    assert status_now.state == STALE and "bronze.ad_events v12 (read v10)" in status_now.why

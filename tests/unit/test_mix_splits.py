"""jobs.mix without Spark: the train, validation and held-out days of a mixture are disjoint and in
that order, and the manifest lists a validation split read in full (rate 1, weight 1) like the
held-out one; with no validation days the manifest has only the train and eval splits."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
from deltalake import write_deltalake

from gem.days import day_range
from gem.lakehouse import stages
from jobs import mix
from schemas.examples import LABEL_COLUMNS
from tests.support import make_config

S = "2026-01-01"


def test_train_validation_and_held_out_days_are_disjoint_and_ordered(tmp_path):
    cfg = make_config(tmp_path, start_ds=S, attribution_window_days=1, mix={"train_days": 3, "validation_days": 2})
    days = mix.mix_days(cfg, "2026-01-10")  # held out 01-09, validating 01-07..01-08, training the 3 before
    assert days == mix.MixDays(("2026-01-04", "2026-01-05", "2026-01-06"), ("2026-01-07", "2026-01-08"), "2026-01-09")
    assert days.all_days == day_range("2026-01-04", "2026-01-09") == stages.mixed_days(cfg, "2026-01-10")
    assert list(days.by_split()) == ["train", "validation", "eval"]
    # Near the start the training days are cut at start_ds, never the validation days.
    assert mix.mix_days(cfg, "2026-01-05") == mix.MixDays(("2026-01-01",), ("2026-01-02", "2026-01-03"), "2026-01-04")


def test_too_few_days_leave_nothing_to_train_on(tmp_path):
    cfg = make_config(tmp_path, start_ds=S, attribution_window_days=1, mix={"train_days": 3, "validation_days": 2})
    for ds in day_range(S, "2026-01-04"):  # held out up to 01-03: the 2 days before it validate, none trains
        assert mix.mix_days(cfg, ds) is None, ds
        assert stages.mixed_days(cfg, ds) == [], ds  # the gate asks for no record either


def test_no_validation_days_keep_the_train_and_held_out_days(tmp_path):
    cfg = make_config(tmp_path, start_ds=S, attribution_window_days=0, mix={"train_days": 14, "validation_days": 0})
    assert mix.mix_days(cfg, S) is None
    assert mix.mix_days(cfg, "2026-01-02") == mix.MixDays(("2026-01-01",), (), "2026-01-02")  # the demo's mix
    days = mix.mix_days(cfg, "2026-01-20")
    assert days == mix.MixDays(tuple(day_range("2026-01-06", "2026-01-19")), (), "2026-01-20")
    assert list(days.by_split()) == ["train", "eval"]


def _examples(path: Path, days: list[str]) -> None:
    """A stand-in for silver.training_examples: the partition columns and one label column, with
    day i's file holding i + 1 rows, one of them positive."""
    rows = [{"ds": dt.date.fromisoformat(d), "surface": "reels", LABEL_COLUMNS["click"]: int(n == 0)}
            for i, d in enumerate(days) for n in range(i + 1)]
    schema = pa.schema([("ds", pa.date32()), ("surface", pa.string()), (LABEL_COLUMNS["click"], pa.int32())])
    write_deltalake(str(path), pa.Table.from_pylist(rows, schema=schema), partition_by=["ds", "surface"])


def _manifest(tmp_path: Path, validation_days: int) -> list[dict]:
    cfg = make_config(tmp_path, start_ds=S, attribution_window_days=0, surfaces=["reels"], label_types=["click"],
                      mix={"train_days": 3, "validation_days": validation_days, "negative_rate": 0.5})
    path = tmp_path / "examples"
    if not path.exists():
        _examples(path, day_range(S, "2026-01-05"))
    ds = "2026-01-05"
    _, rows = mix.manifest_rows(cfg, ds, mix.mix_days(cfg, ds), str(path), 0, "/sequences", 0)
    return rows


def test_the_manifest_lists_a_validation_split_read_in_full(tmp_path):
    rows = _manifest(tmp_path, validation_days=1)
    splits = {}
    for r in rows:
        splits.setdefault(r["split"], []).append(r)
    assert list(splits) == ["train", "validation", "eval"]  # rows in day order

    def file_days(split):
        return sorted(r["file_ds"].isoformat() for r in splits[split])

    assert file_days("train") == ["2026-01-01", "2026-01-02", "2026-01-03"]
    assert file_days("validation") == ["2026-01-04"] and file_days("eval") == ["2026-01-05"]
    (validation,) = splits["validation"]
    assert (validation["first_ds"], validation["last_ds"]) == (dt.date(2026, 1, 4),) * 2
    assert (validation["source_rows"], validation["source_positives"]) == (4, 1)
    assert validation["sampling_rate"] == validation["negative_rate"] == 1.0  # every row, weight 1
    assert all(r["negative_rate"] == 0.5 for r in splits["train"])
    assert len({r["mixture_id"] for r in rows}) == 1


def test_without_validation_days_the_manifest_has_train_and_eval_only(tmp_path):
    rows = _manifest(tmp_path, validation_days=0)
    assert {r["split"] for r in rows} == {"train", "eval"}
    train = [r for r in rows if r["split"] == "train"]
    assert sorted(r["file_ds"].isoformat() for r in train) == ["2026-01-02", "2026-01-03", "2026-01-04"]
    assert (train[0]["first_ds"], train[0]["last_ds"]) == (dt.date(2026, 1, 2), dt.date(2026, 1, 4))


def test_the_pipelines_cold_start_days_never_train(tmp_path):
    """mix.cold_start_days: the first days' counters have nothing before them to count, so they are
    never a training day; the mix waits until a later day can train."""
    cfg = make_config(tmp_path, start_ds=S, attribution_window_days=0,
                      mix={"train_days": 14, "validation_days": 0, "cold_start_days": 1})
    assert mix.mix_days(cfg, "2026-01-02") is None  # only the cold day 01-01 before the held-out day
    assert stages.mixed_days(cfg, "2026-01-02") == []
    assert mix.mix_days(cfg, "2026-01-03") == mix.MixDays(("2026-01-02",), (), "2026-01-03")  # the demo's mix
    assert mix.mix_days(cfg, "2026-01-05").train == ("2026-01-02", "2026-01-03", "2026-01-04")

"""gem.data.delta_log: partitioned Delta tables read outside Spark keep their partition columns."""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake

from gem.data.delta_log import MissingDataFileError, logged_files, partition_types, read_logged, read_table

SCHEMA = pa.schema([("ds", pa.date32()), ("surface", pa.string()), ("n", pa.int64())])


def _write(path: Path, rows: list[tuple[str, str, int]], mode: str = "append") -> None:
    table = pa.Table.from_pylist(
        [{"ds": dt.date.fromisoformat(d), "surface": s, "n": n} for d, s, n in rows], schema=SCHEMA
    )
    write_deltalake(str(path), table, mode=mode, partition_by=["ds", "surface"])


def test_data_files_alone_lose_the_partition_columns(tmp_path: Path) -> None:
    """Why the helper exists: pyarrow reading a data file sees only `n`."""
    _write(tmp_path / "t", [("2026-01-01", "reels", 1)])
    (f,) = logged_files(str(tmp_path / "t"), 0)
    assert pq.read_table(f.path).column_names == ["n"]


def test_read_table_restores_typed_partition_columns(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    _write(path, [("2026-01-01", "reels", 1), ("2026-01-01", "fb_feed", 2), ("2026-01-02", "reels", 3)])
    assert partition_types(path) == {"ds": pa.date32(), "surface": pa.string()}
    table = read_table(path)
    assert table.schema.field("ds").type == pa.date32()
    rows = sorted((r["ds"].isoformat(), r["surface"], r["n"]) for r in table.to_pylist())
    assert rows == [("2026-01-01", "fb_feed", 2), ("2026-01-01", "reels", 1), ("2026-01-02", "reels", 3)]


def test_where_and_columns(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    _write(path, [("2026-01-01", "reels", 1), ("2026-01-01", "fb_feed", 2), ("2026-01-02", "reels", 3)])
    one_day = read_table(path, columns=["n", "surface"], where={"ds": "2026-01-01"})
    assert one_day.column_names == ["n", "surface"]
    assert sorted(one_day.to_pylist(), key=lambda r: r["n"]) == [{"n": 1, "surface": "reels"}, {"n": 2, "surface": "fb_feed"}]
    reels = read_table(path, columns=["ds"], where={"surface": {"reels"}})
    assert sorted(r["ds"].isoformat() for r in reels.to_pylist()) == ["2026-01-01", "2026-01-02"]
    nothing = read_table(path, where={"ds": "2030-01-01"})
    assert nothing.num_rows == 0 and set(nothing.column_names) == {"ds", "surface", "n"}
    assert nothing.schema.field("ds").type == pa.date32()


def test_pinned_version_ignores_later_commits(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    _write(path, [("2026-01-01", "reels", 1)])
    _write(path, [("2026-01-01", "reels", 9)], mode="overwrite")
    assert read_table(path, version=0)["n"].to_pylist() == [1]
    assert read_table(path)["n"].to_pylist() == [9]


def test_a_vanished_file_is_named(tmp_path: Path) -> None:
    path = str(tmp_path / "t")
    _write(path, [("2026-01-01", "reels", 1)])
    (f,) = logged_files(path, 0)
    Path(f.path).unlink()
    with pytest.raises(MissingDataFileError, match=Path(f.path).name):
        read_table(path)


def test_read_logged_reads_only_the_named_fields_of_a_list_of_structs(tmp_path: Path) -> None:
    path = str(tmp_path / "seq")
    element = pa.struct([("event_time", pa.int64()), ("event_id", pa.string()), ("ad_id_hash", pa.int64())])
    table = pa.table({"ds": pa.array([dt.date(2026, 1, 1)] * 2, pa.date32()), "user_id": ["u1", "u2"],
                      "impressions": pa.array([[{"event_time": 1, "event_id": "e1", "ad_id_hash": 7}], []],
                                              pa.list_(element))})
    write_deltalake(path, table, partition_by=["ds"])
    read = read_logged(logged_files(path, 0), {}, ["user_id", "impressions"],
                       fields={"impressions": ("event_time", "ad_id_hash")})
    assert read.column_names == ["user_id", "impressions"]
    assert read.to_pylist() == [{"user_id": "u1", "impressions": [{"event_time": 1, "ad_id_hash": 7}]},
                                {"user_id": "u2", "impressions": []}]

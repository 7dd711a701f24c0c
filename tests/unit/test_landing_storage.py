"""The landing zone and the generator's state on an object store: a lakehouse on the local S3 API
(moto, server mode) gets the same files, byte for byte, as a local one; the generator's state
round-trips there; a landing file is published whole or not at all; an erasure rewrites landing
files there as it does on disk."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from gem import storage
from gem.lakehouse.erasure import erase_landing
from gem.lakehouse.landing import (
    LandingFile,
    MissingLandingPartition,
    completed_manifest,
    list_partition,
    mark_partition_complete,
    marker_uri,
    partition_dir,
)
from gem.sources.engagement import EngagementState, MissingGeneratorState, load_state, state_path
from gem.sources.landing_output import expected_landing_counts
from gem.sources.synthetic_day import generate_day
from gem.sources.world import ARRIVAL_DAYS
from tests.landing_lines import line, write_day
from tests.support import make_config

DAY1, DAY2, DAY3 = "2026-01-01", "2026-01-02", "2026-01-03"
GONE = "u-gone"


@pytest.fixture(params=["local", "s3"])
def landing_root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path / "lake" / "_landing")
    return request.getfixturevalue("s3_bucket") + "/lake/_landing"


def files_under(root: str) -> dict[str, bytes]:
    """Every file under `root` (local or object store), by its path relative to root."""
    base = storage.normalized(root) + "/"
    return {storage.normalized(uri).removeprefix(base): storage.read_bytes(uri) for uri in storage.walk_files(root)}


def _lines(uri: str) -> list[str]:
    data = storage.read_bytes(uri)
    return (gzip.decompress(data) if uri.endswith(".gz") else data).decode().splitlines()


# --------------------------------------------------------------------------------------------------
# The generator on S3.


def test_a_day_generated_on_s3_is_byte_identical_to_the_local_one(tmp_path: Path, s3_bucket: str) -> None:
    local = make_config(tmp_path / "local")
    remote = make_config(tmp_path / "remote", lakehouse_uri=s3_bucket + "/lake")
    assert generate_day(remote, DAY1) == generate_day(local, DAY1)

    here, there = files_under(local.lakehouse_uri), files_under(remote.lakehouse_uri)
    assert sorted(there) == sorted(here)
    assert f"_landing/ds={DAY1}/_SUCCESS" in there and f"_generator/state/ds={DAY1}.npz" in there
    data_files = [name for name in there if name.endswith(".json.gz")]
    assert len(data_files) == ARRIVAL_DAYS  # one file per arrival day
    assert [name for name in there if there[name] != here[name]] == []
    assert not [name for name in there if ".tmp" in name or "/." in name]  # no in-progress file left
    assert expected_landing_counts(remote.landing_root, DAY2) == expected_landing_counts(local.landing_root, DAY2)
    assert expected_landing_counts(remote.landing_root, DAY1)["clean"] > 0
    assert list_partition(remote.landing_root, DAY1).data_files == [
        storage.join(remote.landing_root, f"ds={DAY1}", f"events-from-{DAY1}.json.gz")]


def test_the_state_round_trips_on_s3_and_the_next_day_matches_the_local_one(tmp_path: Path, s3_bucket: str) -> None:
    local = make_config(tmp_path / "local")
    remote = make_config(tmp_path / "remote", lakehouse_uri=s3_bucket + "/lake")
    for cfg in (local, remote):
        generate_day(cfg, DAY1)
    assert state_path(remote, DAY1) == f"{s3_bucket}/lake/_generator/state/ds={DAY1}.npz"
    here, there = load_state(local, DAY1), load_state(remote, DAY1)
    assert here.clicked_weight.sum() > 0
    for name in EngagementState.ARRAYS:
        np.testing.assert_array_equal(getattr(there, name), getattr(here, name))

    assert generate_day(remote, DAY2) == generate_day(local, DAY2)  # DAY2 starts from DAY1's saved state
    assert files_under(remote.lakehouse_uri) == files_under(local.lakehouse_uri)

    # A gap in the states is found on S3 too (the earlier states are listed there).
    storage.delete(state_path(remote, DAY2))
    with pytest.raises(MissingGeneratorState, match=rf"{s3_bucket}/lake/_generator/state/ds={DAY2}\.npz"):
        generate_day(remote, DAY3)
    assert completed_manifest(remote.landing_root, DAY3) is None


# --------------------------------------------------------------------------------------------------
# Landing files and partitions, local and on S3.


def test_a_partition_is_listed_only_once_its_producer_has_finished(landing_root: str) -> None:
    with pytest.raises(MissingLandingPartition, match="does not exist"):
        list_partition(landing_root, DAY1)
    with LandingFile(landing_root, DAY1, "part-0") as f:
        f.write_lines([line("e1")])
    with pytest.raises(MissingLandingPartition, match="incomplete"):
        list_partition(landing_root, DAY1)
    assert completed_manifest(landing_root, DAY1) is None
    assert mark_partition_complete(landing_root, DAY1, {"producer": "tests"}) == marker_uri(landing_root, DAY1)
    storage.write(storage.join(partition_dir(landing_root, DAY1), "notes.txt"), "not data")
    listing = list_partition(landing_root, DAY1)
    assert listing.data_files == [storage.join(partition_dir(landing_root, DAY1), "part-0.json.gz")]
    assert listing.unexpected_files == [storage.join(partition_dir(landing_root, DAY1), "notes.txt")]
    assert completed_manifest(landing_root, DAY1) == {"producer": "tests"}
    assert _lines(listing.data_files[0]) == [line("e1")]

    storage.write(storage.join(partition_dir(landing_root, DAY1), "nested", "part-1.json.gz"), b"")
    with pytest.raises(MissingLandingPartition, match="holds a folder 'nested'"):
        list_partition(landing_root, DAY1)


@pytest.mark.parametrize("landing_root", ["local", "s3"], indirect=True)
def test_a_failed_landing_file_leaves_the_old_file_in_place(landing_root: str) -> None:
    write_day(landing_root, DAY1, [line("e1")])
    before = files_under(landing_root)
    with pytest.raises(RuntimeError, match="producer died"), LandingFile(landing_root, DAY1, "part-0") as f:
        f.write_lines([line("e2")])
        raise RuntimeError("producer died")
    assert files_under(landing_root) == before


# --------------------------------------------------------------------------------------------------
# Erasure's landing rewrite, local and on S3.


def test_erasure_rewrites_landing_files_without_the_user(landing_root: str) -> None:
    write_day(landing_root, DAY1, [line("e1", user_id=GONE), line("e2", user_id="u2"), line("e3", user_id=GONE)])
    write_day(landing_root, DAY2, [line("k1", user_id="u3")])  # nothing of the user's: untouched
    day1 = partition_dir(landing_root, DAY1)
    misnamed = [line("x1", user_id=GONE), line("x2", user_id="u4")]
    storage.write(storage.join(day1, "extra.jsonl"), "\n".join(misnamed) + "\n")
    whole = gzip.compress(("\n".join(line(f"cut-{i}", user_id=GONE) for i in range(200)) + "\n").encode())
    storage.write(storage.join(day1, "cut.json.gz"), whole[: len(whole) // 2])  # damaged: listed, not rewritten
    before = files_under(landing_root)

    removed, damaged = erase_landing(landing_root, GONE)

    assert removed == {f"ds={DAY1}/part-0.json.gz": 2, f"ds={DAY1}/extra.jsonl": 1}
    assert damaged == [storage.join(day1, "cut.json.gz")]
    after = files_under(landing_root)
    assert sorted(after) == sorted(before)  # no file added (no temporary left) or lost
    changed = sorted(name for name in after if after[name] != before[name])
    assert changed == [f"ds={DAY1}/extra.jsonl", f"ds={DAY1}/part-0.json.gz"]
    assert _lines(storage.join(day1, "part-0.json.gz")) == [line("e2", user_id="u2")]
    assert _lines(storage.join(day1, "extra.jsonl")) == misnamed[1:]
    assert json.loads(after[f"ds={DAY1}/_SUCCESS"]) == {"producer": "tests"}
    assert erase_landing(landing_root, GONE) == ({}, damaged)  # a second erasure finds nothing more

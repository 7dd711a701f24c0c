"""gem.storage on a local folder and on the local S3 API server (moto, server mode): the same calls,
the same answers; exclusive create has exactly one winner under concurrency on both."""

from __future__ import annotations

import multiprocessing
from pathlib import Path

import pytest

from gem import storage

ROUNDS = 20
CONTENDERS = 16


@pytest.fixture(params=["local", "s3"])
def root(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "local":
        return str(tmp_path / "lake")
    return request.getfixturevalue("s3_bucket") + "/lake"


def test_uri_spellings():
    assert storage.scheme("/a/b") == "file" and storage.scheme("file:///a") == "file"
    assert storage.scheme("s3a://b/k") == "s3a" and not storage.is_local("s3://b")
    assert storage.normalized("s3a://bucket/p/") == "s3://bucket/p"
    assert storage.spark_uri("s3://bucket/p") == "s3a://bucket/p"
    assert storage.normalized("file:///tmp/x") == "/tmp/x"
    assert storage.join("s3://b/p", "a", "c.json") == "s3://b/p/a/c.json"
    assert storage.parent("s3://b/p/a/c.json") == "s3://b/p/a" and storage.name("s3://b/p/c.json") == "c.json"
    with pytest.raises(ValueError, match="object store"):
        storage.local_path("s3://b/k")


def test_write_read_list_delete(root: str):
    a, b = storage.join(root, "d", "a.json"), storage.join(root, "d", "sub", "b.txt")
    assert not storage.exists(a) and storage.listdir(storage.join(root, "d")) == []
    storage.write_json(a, {"x": 1})
    storage.write(b, "hello")
    assert storage.read_json(a) == {"x": 1} and storage.read_text(b) == "hello"
    storage.write(a, b"replaced")
    assert storage.read_bytes(a) == b"replaced"
    assert storage.listdir(storage.join(root, "d")) == [a, storage.join(root, "d", "sub")]
    assert storage.walk_files(root) == [a, b]
    assert storage.glob(storage.join(root, "d", "*.json")) == [a]
    assert storage.modified(a) > 0
    with storage.open_write(storage.join(root, "s.bin")) as f:
        f.write(b"streamed")
    with storage.open_read(storage.join(root, "s.bin")) as f:
        assert f.read() == b"streamed"
    assert storage.delete(a) and not storage.exists(a) and not storage.delete(a)
    assert storage.delete(storage.join(root, "d"), recursive=True)
    assert storage.walk_files(storage.join(root, "d")) == []
    with pytest.raises(FileNotFoundError):
        storage.read_bytes(a)


def test_create_refuses_an_existing_file(root: str):
    path = storage.join(root, "lease.json")
    assert storage.create(path, "first")
    assert not storage.create(path, "second")
    assert storage.read_text(path) == "first"


def test_a_failed_stream_leaves_no_file(root: str):
    path = storage.join(root, "partial.bin")
    with pytest.raises(RuntimeError), storage.open_write(path) as f:
        f.write(b"half")
        raise RuntimeError("writer died")
    if storage.is_local(path):
        assert not storage.exists(path) and storage.walk_files(root) == []


def _contend(args: tuple[str, int]) -> bool:
    path, who = args
    return storage.create(path, f"contender {who}")


def test_concurrent_creates_have_exactly_one_winner(root: str):
    """CONTENDERS processes create one key at once, ROUNDS times: one winner per round, and the
    stored contents are the winner's."""
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(CONTENDERS) as pool:
        for r in range(ROUNDS):
            path = storage.join(root, "race", f"round-{r}.json")
            won = pool.map(_contend, [(path, who) for who in range(CONTENDERS)])
            assert sum(won) == 1, (r, won)
            assert storage.read_text(path) == f"contender {won.index(True)}"


def test_upload_and_download_a_folder(root: str, tmp_path: Path):
    site = tmp_path / "site"
    (site / "static").mkdir(parents=True)
    (site / "index.html").write_text("<html></html>")
    (site / "static" / "a.css").write_text("body{}")
    storage.upload_folder(site, storage.join(root, "docs"))
    back = tmp_path / "back"
    storage.download_folder(storage.join(root, "docs"), back)
    assert (back / "index.html").read_text() == "<html></html>" and (back / "static" / "a.css").read_text() == "body{}"

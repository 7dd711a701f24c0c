"""gem.storage on a local folder and on the local S3 API server (moto, server mode): the same calls,
the same answers; exclusive create has exactly one winner under concurrency on both."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
from pathlib import Path

import pytest

from gem import storage
from tests.support import PYTHON, subprocess_env

ROUNDS = 20
CONTENDERS = 16


@pytest.fixture
def root(lake_root: str) -> str:
    return lake_root


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


def test_replace_and_delete_only_the_version_read(root: str):
    """A conditional replace or delete acts on the version its caller read, never on a file written
    since (another process's), and answers False for a file that is gone."""
    path = storage.join(root, "held.json")
    assert storage.version(path) is None and not storage.replace_if(path, "x", "no-such-version")
    storage.create(path, "first")
    first = storage.version(path)
    assert first is not None and storage.version(path) == first
    assert storage.replace_if(path, "second", first) and storage.read_text(path) == "second"
    second = storage.version(path)
    assert second != first
    assert not storage.replace_if(path, "stale writer", first) and storage.read_text(path) == "second"
    assert not storage.delete_if(path, first) and storage.read_text(path) == "second"
    assert storage.delete_if(path, second) and not storage.exists(path)
    assert not storage.delete_if(path, second)
    storage.create(path, "second")  # the same contents written anew are still a new version locally
    if storage.is_local(path):
        assert not storage.replace_if(path, "stale writer", second)


def _replace_from(args: tuple[str, str, int]) -> bool:
    path, seen, who = args
    return storage.replace_if(path, f"contender {who}", seen)


def test_concurrent_conditional_replaces_have_exactly_one_winner(root: str):
    """CONTENDERS processes replace the version they all read, ROUNDS times: one winner per round."""
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(CONTENDERS) as pool:
        for r in range(ROUNDS):
            path = storage.join(root, "race", f"round-{r}.json")
            storage.write(path, f"round {r}")
            seen = storage.version(path)
            won = pool.map(_replace_from, [(path, seen, who) for who in range(CONTENDERS)])
            assert sum(won) == 1, (r, won)
            assert storage.read_text(path) == f"contender {won.index(True)}"


def test_download_missing_fetches_only_what_the_local_folder_lacks(root: str, tmp_path: Path):
    storage.write(storage.join(root, "kept", "a.json"), "store a")
    storage.write(storage.join(root, "kept", "sub", "b.json"), "store b")
    local = tmp_path / "copy"
    (local / "sub").mkdir(parents=True)
    (local / "sub" / "b.json").write_text("local b")  # held already: not fetched again
    assert storage.download_missing(storage.join(root, "kept"), local) == [local / "a.json"]
    assert (local / "a.json").read_text() == "store a" and (local / "sub" / "b.json").read_text() == "local b"
    assert storage.download_missing(storage.join(root, "kept"), local) == []
    assert storage.download_missing(storage.join(root, "nothing"), local) == []


def test_delta_storage_options_reach_the_store(root: str, monkeypatch: pytest.MonkeyPatch):
    """deltalake writes and reads a table at `root` with the options alone: on S3 they carry the
    endpoint, region and http permission, so delta-rs needs no AWS_ALLOW_HTTP of its own."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    monkeypatch.delenv("AWS_ALLOW_HTTP", raising=False)
    table = storage.join(root, "delta", "t")
    options = storage.delta_storage_options(table)
    if storage.is_local(root):
        assert options is None
    else:
        assert options == {"AWS_ENDPOINT_URL": storage.s3_endpoint(), "AWS_ALLOW_HTTP": "true",
                           "AWS_REGION": storage.s3_region()}
        assert storage.delta_storage_options(storage.spark_uri(table)) == options  # s3a:// spells the same store
    write_deltalake(table, pa.table({"n": [1, 2]}), storage_options=options)
    assert DeltaTable(table, storage_options=options).version() == 0
    added = pa.table(DeltaTable(table, storage_options=options).get_add_actions(flatten=True))
    assert sum(added["num_records"].to_pylist()) == 2


def test_s3_settings_come_from_the_aws_variables(monkeypatch: pytest.MonkeyPatch):
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    assert storage.s3_endpoint() is None and storage.s3_region() is None
    assert storage.delta_storage_options("s3://b/t") == {}
    monkeypatch.setenv("AWS_ENDPOINT_URL", "https://objects.example")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    assert storage.delta_storage_options("s3://b/t") == {"AWS_ENDPOINT_URL": "https://objects.example",
                                                         "AWS_REGION": "eu-west-1"}
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:9000")  # the S3-specific one wins
    monkeypatch.setenv("AWS_REGION", "us-east-2")
    assert storage.delta_storage_options("s3a://b/t") == {"AWS_ENDPOINT_URL": "http://127.0.0.1:9000",
                                                          "AWS_ALLOW_HTTP": "true", "AWS_REGION": "us-east-2"}


def test_move_a_folder(root: str):
    """Every file arrives under the target, the source is gone; a non-empty target, an empty source
    and another store are refused."""
    source, target = storage.join(root, "step-1"), storage.join(root, ".aside", "step-1")
    storage.write(storage.join(source, "a.bin"), b"a")
    storage.write(storage.join(source, "sub", "b.json"), "{}")
    storage.move_folder(source, target)
    assert storage.walk_files(source) == [] and not storage.exists(storage.join(source, "a.bin"))
    assert storage.walk_files(target) == [storage.join(target, "a.bin"), storage.join(target, "sub", "b.json")]
    assert storage.read_bytes(storage.join(target, "a.bin")) == b"a"
    with pytest.raises(FileNotFoundError, match="nothing is stored"):
        storage.move_folder(source, storage.join(root, "elsewhere"))
    storage.write(storage.join(source, "c.bin"), b"c")
    with pytest.raises(FileExistsError, match="is not empty"):
        storage.move_folder(source, target)
    other = "s3://some-bucket/x" if storage.is_local(root) else "/tmp/x"
    with pytest.raises(ValueError, match="different stores"):
        storage.move_folder(source, other)


def test_an_unusable_object_store_fails_at_once_naming_what_is_missing(s3_server, monkeypatch, tmp_path: Path):
    """A missing bucket, missing credentials and an endpoint that does not answer each fail with one
    line naming it, before any stage work, and never print a secret; a local folder needs nothing."""
    storage.require_reachable(str(tmp_path))
    with pytest.raises(storage.StorageError, match="the bucket gem-no-such-bucket does not exist"):
        storage.require_reachable("s3://gem-no-such-bucket/lake")
    secret = os.environ["AWS_SECRET_ACCESS_KEY"]
    for variable in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    with pytest.raises(storage.StorageError, match="no AWS credentials for s3://gem-other"):
        storage.require_reachable("s3://gem-other/lake")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "gem-local")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens on the discard port
    with pytest.raises(storage.StorageError, match="does not answer") as refused:
        storage.require_reachable("s3://gem-third/lake")
    assert secret not in str(refused.value)


def test_a_job_on_a_missing_bucket_exits_with_the_reason(s3_server, tmp_path: Path):
    config = tmp_path / "gem.yaml"
    config.write_text("lakehouse_uri: s3://gem-missing-bucket/lake\n")
    done = subprocess.run([PYTHON, "-m", "jobs.ingest_events", "--ds", "2026-01-01", "--config", str(config)],
                          check=False, capture_output=True, text=True, timeout=300, env=subprocess_env())
    assert done.returncode == 2, done.stderr[-2000:]
    assert "the bucket gem-missing-bucket does not exist" in done.stderr
    assert "Traceback" not in done.stderr and os.environ["AWS_SECRET_ACCESS_KEY"] not in done.stdout + done.stderr

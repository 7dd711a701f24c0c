"""The one filesystem layer for every file the pipeline keeps outside its Delta tables.

Leases, checkpoints, promotion pointers, plans, reports, Data Docs and the landing zone live under
`lakehouse_uri` (or `landing_uri`), which is a local folder or an object store URI such as
`s3://bucket/prefix`. Every such file goes through this module, which is built on fsspec: the same
calls reach the local disk and S3 (s3fs), Airflow's object storage speaks it, and torch's
distributed checkpoints write through it (FsspecWriter). pyarrow.fs has no conditional put.

Atomic operations use what the store offers, never rename:
    create(uri, data)   -> True if this call made the file, False if it existed (S3: a conditional
                           PUT with If-None-Match: *; local disk: a hard link of a complete temporary
                           file, which fails if the name exists)
    write(uri, data)    the whole file replaced at once (S3: a PUT; local disk: os.replace of a
                           complete temporary file), so a reader sees the old file or the new one
A "folder" is a prefix: writing a file makes its parents, and listing a prefix with nothing under it
gives nothing.

S3 credentials, region and endpoint come from the standard AWS variables (AWS_ACCESS_KEY_ID,
AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION, AWS_ENDPOINT_URL) or the AWS config files, as
botocore reads them; nothing here names a credential.
"""

from __future__ import annotations

import json
import os
import posixpath
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

# Schemes an object store answers to; Spark's Hadoop connector spells S3 "s3a", the rest "s3".
OBJECT_STORE_SCHEMES = ("s3", "s3a", "gs", "gcs", "abfs", "az")


class StorageError(RuntimeError):
    """An object store cannot be reached or used as configured (names what is missing, never a secret)."""


def scheme(uri: str | Path) -> str:
    """The URI's scheme: "file" for a local path (with or without file://)."""
    text = str(uri)
    return text.split("://", 1)[0].lower() if "://" in text else "file"


def is_local(uri: str | Path) -> bool:
    return scheme(uri) == "file"


def local_path(uri: str | Path) -> Path:
    """The local path of a file:// URI or plain path; an object store URI is refused (it has none)."""
    if not is_local(uri):
        raise ValueError(f"{uri} is on an object store, not a local path")
    text = str(uri)
    return Path(text.removeprefix("file://"))


def normalized(uri: str | Path) -> str:
    """One spelling per location: local paths absolute without file://, S3 as s3:// (s3a:// is
    Spark's spelling of the same store), no trailing slash."""
    if is_local(uri):
        return str(local_path(uri).absolute())
    text = str(uri).rstrip("/")
    return "s3://" + text[len("s3a://"):] if text.startswith("s3a://") else text


def spark_uri(uri: str | Path) -> str:
    """The URI as Spark's Hadoop file systems name it (s3:// -> s3a://)."""
    text = normalized(uri)
    return "s3a://" + text[len("s3://"):] if text.startswith("s3://") else text


def join(base: str | Path, *parts: str) -> str:
    """base/part/...: a URI (or local path) string; parts are plain names or relative paths."""
    text = normalized(base)
    return posixpath.join(text, *parts) if not is_local(text) else str(Path(text).joinpath(*parts))


def parent(uri: str | Path) -> str:
    text = normalized(uri)
    return str(Path(text).parent) if is_local(text) else text.rsplit("/", 1)[0]


def name(uri: str | Path) -> str:
    return normalized(uri).rsplit("/", 1)[-1]


def filesystem(uri: str | Path) -> fsspec.AbstractFileSystem:
    """The fsspec filesystem serving `uri` (instances are cached by fsspec per scheme and options)."""
    protocol = scheme(uri)
    if protocol == "file":
        return LocalFileSystem()
    if protocol in ("s3", "s3a"):
        # No listings cache: other processes and hosts write the same prefixes (leases, plans), and
        # a cached listing would hide their files.
        return fsspec.filesystem("s3", use_listings_cache=False)
    return fsspec.filesystem(protocol)


def _key(uri: str | Path) -> str:
    """The path fsspec's filesystem takes: local absolute path, or bucket/key."""
    text = normalized(uri)
    return text if is_local(text) else text.split("://", 1)[1]


def _uri_of(uri_like: str | Path, key: str) -> str:
    """The URI of `key` (a filesystem path from listing) in the store of `uri_like`."""
    protocol = scheme(normalized(uri_like))
    return key if protocol == "file" else f"{protocol}://{key}"


# ---- reading -----------------------------------------------------------------------------------

def exists(uri: str | Path) -> bool:
    return filesystem(uri).exists(_key(uri))


def read_bytes(uri: str | Path) -> bytes:
    """The file's bytes (FileNotFoundError when there is none)."""
    return filesystem(uri).cat_file(_key(uri))


def read_text(uri: str | Path) -> str:
    return read_bytes(uri).decode("utf-8")


def read_json(uri: str | Path) -> Any:
    return json.loads(read_bytes(uri))


def modified(uri: str | Path) -> float:
    """The file's last modification, seconds since the epoch."""
    fs = filesystem(uri)
    stamp = fs.modified(_key(uri))
    return stamp.timestamp()


def listdir(uri: str | Path) -> list[str]:
    """URIs of the entries directly under the prefix `uri` (files and prefixes), sorted; [] if none."""
    fs, key = filesystem(uri), _key(uri)
    try:
        entries = fs.ls(key, detail=False)
    except FileNotFoundError:
        return []
    return sorted(_uri_of(uri, e.rstrip("/")) for e in entries if e.rstrip("/") != key.rstrip("/"))


def glob(uri_pattern: str | Path) -> list[str]:
    """URIs matching a glob pattern (fsspec's), sorted."""
    return sorted(_uri_of(uri_pattern, k) for k in filesystem(uri_pattern).glob(_key(uri_pattern)))


def walk_files(uri: str | Path) -> list[str]:
    """URIs of every file under the prefix `uri`, sorted."""
    fs, key = filesystem(uri), _key(uri)
    try:
        return sorted(_uri_of(uri, k) for k in fs.find(key))
    except FileNotFoundError:
        return []


@contextmanager
def open_read(uri: str | Path) -> Iterator[IO[bytes]]:
    """A readable binary stream (for readers that stream: torch.load, pyarrow, numpy)."""
    with filesystem(uri).open(_key(uri), "rb") as f:
        yield f


# ---- writing -----------------------------------------------------------------------------------

def _local_temporary(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    return Path(tmp)


def write(uri: str | Path, data: bytes | str) -> None:
    """Replace the whole file at once: a reader sees the old contents or the new, never a part."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    if is_local(uri):
        path = local_path(uri)
        tmp = _local_temporary(path, payload)
        os.replace(tmp, path)
        return
    filesystem(uri).pipe_file(_key(uri), payload)


def write_json(uri: str | Path, value: Any) -> None:
    write(uri, json.dumps(value, indent=2, sort_keys=True, default=str))


def create(uri: str | Path, data: bytes | str) -> bool:
    """Create the file only if it does not exist, atomically across processes and hosts: True if
    this call created it, False if it was there already."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    if is_local(uri):
        path = local_path(uri)
        tmp = _local_temporary(path, payload)
        try:
            os.link(tmp, path)  # fails with FileExistsError if the name is taken
        except FileExistsError:
            return False
        finally:
            tmp.unlink()
        return True
    try:
        filesystem(uri).pipe_file(_key(uri), payload, mode="create")
    except FileExistsError:
        return False
    return True


@contextmanager
def open_write(uri: str | Path) -> Iterator[IO[bytes]]:
    """A writable binary stream whose contents appear at `uri` whole when the block ends without an
    error (local disk: a temporary file renamed into place; S3: the upload completes at close)."""
    if is_local(uri):
        path = local_path(uri)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        try:
            with open(tmp, "wb") as f:
                yield f
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        return
    with filesystem(uri).open(_key(uri), "wb") as f:
        yield f


def delete(uri: str | Path, recursive: bool = False) -> bool:
    """Remove the file (or with recursive, everything under the prefix); False if there was nothing."""
    fs, key = filesystem(uri), _key(uri)
    if not fs.exists(key):  # an object store's delete of a missing key succeeds silently
        return False
    try:
        fs.rm(key, recursive=recursive)
    except FileNotFoundError:
        return False
    return True


def makedirs(uri: str | Path) -> None:
    """A local folder is made; an object store has no folders (a no-op there)."""
    if is_local(uri):
        local_path(uri).mkdir(parents=True, exist_ok=True)


def upload_folder(local: Path, uri: str | Path) -> None:
    """Copy a local folder's files under `uri` (a local destination is written file by file)."""
    for path in sorted(p for p in local.rglob("*") if p.is_file()):
        write(join(uri, path.relative_to(local).as_posix()), path.read_bytes())


def download_folder(uri: str | Path, local: Path) -> None:
    """Copy every file under the prefix `uri` into the local folder `local`."""
    base = normalized(uri).rstrip("/") + "/"
    for file_uri in walk_files(uri):
        target = local / normalized(file_uri)[len(base):]
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(read_bytes(file_uri))

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

import fcntl
import json
import os
import posixpath
import tempfile
import uuid
from collections.abc import Callable, Iterator
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
    # Not fsspec's `with`: its exit completes the upload even when the block raised.
    f = filesystem(uri).open(_key(uri), "wb")
    try:
        yield f
    except BaseException:
        f.discard()  # the upload is abandoned (a multipart upload aborted): nothing is put
        f.closed = True
        raise
    f.close()


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


# ---- conditional replace -----------------------------------------------------------------------
# A file's version names one write of it: the S3 ETag, or on the local disk the device, inode,
# modification and change times and size (every write of this module makes a new inode; S3's ETag
# is a digest of the contents, so the same bytes written anew keep their version there). Replacing
# or deleting only the version a caller read is how a holder of a lease renews or releases it
# without clobbering one another process has taken over (gem.lakehouse.lease).

# The S3 error codes of a condition that does not hold (a concurrent conditional write answers 409).
_CONDITION_FAILED = ("PreconditionFailed", "ConditionalRequestConflict", "412", "409")


def _local_version(stat: os.stat_result) -> str:
    return f"{stat.st_dev}:{stat.st_ino}:{stat.st_mtime_ns}:{stat.st_ctime_ns}:{stat.st_size}"


def version(uri: str | Path) -> str | None:
    """The version of the file as it is now (S3: its ETag; local disk: a signature of its inode and
    times), None when there is no file."""
    if is_local(uri):
        try:
            return _local_version(os.stat(local_path(uri)))
        except FileNotFoundError:
            return None
    try:
        return filesystem(uri).info(_key(uri), refresh=True)["ETag"]
    except FileNotFoundError:
        return None


@contextmanager
def _local_if(path: Path, expected: str) -> Iterator[bool]:
    """Whether `path` is still at version `expected`, answered under an exclusive lock on that very
    file, which the block holds while it replaces or removes it (callers of _local_if exclude each
    other; a waiter finds the name pointing at a new inode or none, and answers False)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        yield False
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            now = os.stat(path)
        except FileNotFoundError:
            yield False
            return
        locked = os.fstat(fd)
        yield (now.st_dev, now.st_ino) == (locked.st_dev, locked.st_ino) and _local_version(now) == expected
    finally:
        os.close(fd)  # releases the lock


def _conditional_store(uri: str | Path) -> fsspec.AbstractFileSystem:
    """The S3 filesystem of `uri`; other object stores' conditional requests are not wired here."""
    if scheme(uri) not in ("s3", "s3a"):
        raise StorageError(f"{uri}: conditional replace and delete are implemented for the local disk and S3 only")
    return filesystem(uri)


def _condition_failed(error: OSError) -> bool:
    response = getattr(error.__cause__, "response", None) or {}
    return response.get("Error", {}).get("Code") in _CONDITION_FAILED


def _if_condition_holds(request: Callable[[], object]) -> bool:
    """Send a conditional S3 request: True if it was applied, False if the object is gone or its
    condition does not hold."""
    try:
        request()
    except FileNotFoundError:
        return False
    except OSError as error:
        if _condition_failed(error):
            return False
        raise
    return True


def replace_if(uri: str | Path, data: bytes | str, expected: str) -> bool:
    """Replace the whole file with `data` only if it is still at version `expected` (from `version`),
    atomically across processes and hosts (S3: a conditional PUT with If-Match): True if replaced,
    False if the file changed or is gone meanwhile."""
    payload = data.encode("utf-8") if isinstance(data, str) else data
    if is_local(uri):
        path = local_path(uri)
        with _local_if(path, expected) as current:
            if not current:
                return False
            os.replace(_local_temporary(path, payload), path)
            return True
    return _if_condition_holds(lambda: _conditional_store(uri).pipe_file(_key(uri), payload, IfMatch=expected))


def delete_if(uri: str | Path, expected: str) -> bool:
    """Remove the file only if it is still at version `expected` (S3: a conditional DELETE with
    If-Match): True if removed, False if it changed or is gone meanwhile."""
    if is_local(uri):
        path = local_path(uri)
        with _local_if(path, expected) as current:
            if not current:
                return False
            path.unlink()
            return True
    bucket, _, key = _key(uri).partition("/")
    fs = _conditional_store(uri)
    deleted = _if_condition_holds(lambda: fs.call_s3("delete_object", Bucket=bucket, Key=key, IfMatch=expected))
    fs.invalidate_cache(_key(uri))
    return deleted


def move_folder(uri: str | Path, target: str | Path) -> None:
    """Move every file under the prefix `uri` to the same relative names under `target`, which must
    hold nothing yet (local disk: one rename of the folder; an object store has no rename, so each
    file is copied and then the source prefix deleted: a crash part way leaves copies in both)."""
    if scheme(normalized(uri)) != scheme(normalized(target)):
        raise ValueError(f"cannot move {uri} to {target}: they are in different stores")
    if walk_files(target):
        raise FileExistsError(f"cannot move {uri} to {target}: {target} is not empty")
    files = walk_files(uri)
    if not files:
        raise FileNotFoundError(f"cannot move {uri}: nothing is stored under it")
    if is_local(uri):
        destination = local_path(target)
        destination.parent.mkdir(parents=True, exist_ok=True)
        os.rename(local_path(uri), destination)
        return
    fs, base = filesystem(uri), normalized(uri).rstrip("/") + "/"
    for file_uri in files:
        fs.copy(_key(file_uri), _key(join(target, normalized(file_uri)[len(base):])))
    delete(uri, recursive=True)


def download_missing(uri: str | Path, local: Path) -> list[Path]:
    """Copy into the local folder `local` the files under the prefix `uri` that it lacks (by relative
    name); files it holds already are left as they are. Returns the local paths written, sorted. For a
    local working copy of a store whose files are written once and kept (a cache kept in step)."""
    base = normalized(uri).rstrip("/") + "/"
    written = []
    for file_uri in walk_files(uri):
        target = local / normalized(file_uri)[len(base):]
        if target.exists():
            continue
        write(target, read_bytes(file_uri))  # whole or not at all: a partial file would never be fetched again
        written.append(target)
    return written


# ---- where S3 is -------------------------------------------------------------------------------
# What every other S3 client (delta-rs, Spark's S3A connector) needs to be told about the store,
# from the same standard AWS variables botocore reads; credentials are never passed on, each client
# reads them itself.

def s3_endpoint() -> str | None:
    """The S3 API endpoint when it is not AWS's own (a local S3 API server, MinIO):
    AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL; None when neither is set."""
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


def s3_region() -> str | None:
    """The S3 region: AWS_REGION, else AWS_DEFAULT_REGION; None when neither is set."""
    return os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or None


def delta_storage_options(uri: str | Path) -> dict[str, str] | None:
    """The `storage_options` every deltalake (delta-rs) call on the table at `uri` passes: None for a
    local table; for S3 the endpoint, the region and, for a plain-http endpoint, AWS_ALLOW_HTTP
    (delta-rs refuses http otherwise). delta-rs commits to S3 with its conditional put, so no
    locking provider is named."""
    protocol = scheme(uri)
    if protocol == "file":
        return None
    if protocol not in ("s3", "s3a"):
        return {}
    options = {}
    endpoint, region = s3_endpoint(), s3_region()
    if endpoint:
        options["AWS_ENDPOINT_URL"] = endpoint
        if endpoint.lower().startswith("http://"):
            options["AWS_ALLOW_HTTP"] = "true"
    if region:
        options["AWS_REGION"] = region
    return options


# ---- reachability ------------------------------------------------------------------------------
# Checked once per bucket and process before a stage starts, so a wrong endpoint, a missing bucket
# or missing credentials fail at once with one line naming what is missing (never a secret), not in
# the middle of a Spark job.
_REACHABLE: set[str] = set()


def require_reachable(*uris: str | Path) -> None:
    """StorageError naming what is missing when the object store of one of `uris` cannot be used:
    no credentials, an endpoint that does not answer, a bucket that does not exist or refuses them."""
    for uri in uris:
        _require_bucket(uri)


def _require_bucket(uri: str | Path) -> None:
    protocol = scheme(uri)
    if protocol == "file":
        return
    if protocol not in ("s3", "s3a"):
        raise StorageError(f"{uri}: only local folders and S3 (s3://) are supported")
    bucket = _key(uri).split("/", 1)[0]
    if bucket in _REACHABLE:
        return
    # boto3 only here: most processes that import this module never check a bucket.
    import boto3  # noqa: PLC0415
    import botocore.config  # noqa: PLC0415
    import botocore.exceptions  # noqa: PLC0415

    session = boto3.session.Session()
    if session.get_credentials() is None:
        raise StorageError(f"no AWS credentials for {protocol}://{bucket}: set AWS_ACCESS_KEY_ID and "
                           "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE, or run where an instance role applies)")
    endpoint = s3_endpoint()
    where = endpoint or "AWS's S3 endpoint"
    client = session.client("s3", endpoint_url=endpoint, region_name=s3_region(),
                            config=botocore.config.Config(connect_timeout=5, read_timeout=10,
                                                          retries={"max_attempts": 1}))
    try:
        client.head_bucket(Bucket=bucket)
    except botocore.exceptions.EndpointConnectionError:
        raise StorageError(f"the S3 endpoint {where} does not answer (for {protocol}://{bucket}): check "
                           "AWS_ENDPOINT_URL") from None
    except botocore.exceptions.ClientError as error:
        code = str(error.response.get("Error", {}).get("Code", ""))
        if code in ("404", "NoSuchBucket"):
            raise StorageError(f"the bucket {bucket} does not exist at {where} (lakehouse or landing URI "
                               f"{normalized(uri)}): create it or fix the URI") from None
        if code in ("403", "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch"):
            raise StorageError(f"the bucket {bucket} at {where} refuses these credentials ({code}): check "
                               "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY or the bucket's policy") from None
        raise StorageError(f"the bucket {bucket} at {where} cannot be used: {code}") from None
    _REACHABLE.add(bucket)

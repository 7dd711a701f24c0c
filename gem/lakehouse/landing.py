"""Landing zone I/O: gzip JSON-lines files per arrival day, published whole.

Layout: `{landing_root}/ds=YYYY-MM-DD/NAME.json.gz`, plus `_SUCCESS` once the producer of that
arrival day has finished (its JSON body holds the producer's manifest, e.g. planted dirty rows), and
optionally `NAME.manifest.json` producer metadata beside a data file. Names starting with `_` or `.`
are markers and in-progress writes; any other file is unexpected: ingest reads and quarantines its
lines instead of skipping it unseen (`list_partition`). A data file whose gzip stream is damaged is
found before Spark reads anything (`gzip_problem`), so one bad file cannot fail or shorten a day.
`landing_root` is a local folder or an object store URI: every file goes through gem.storage, whose
`open_write` makes a data file appear under its name only once complete, so a reader never sees half
a file; gzip headers carry mtime 0 so a rerun writes byte-identical files.

Example:
    >>> with LandingFile(root, "2026-01-01", "events-from-2026-01-01") as f:
    ...     f.write_line('{"event_id": "e1", ...}')
    >>> mark_partition_complete(root, "2026-01-01", {"producer": "generate_events"})
"""

from __future__ import annotations

import fnmatch
import gzip
import json
import zlib
from collections.abc import Iterable
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any, Self

from gem import storage

SUCCESS_MARKER = "_SUCCESS"
DATA_FILE_PATTERN = "*.json.gz"
METADATA_FILE_PATTERN = "*.manifest.json"  # a producer's notes on a data file, not data
PARTITION_PREFIX = "ds="


class MissingLandingPartition(FileNotFoundError):
    """The landing folder for a ds is absent or its producer has not finished."""


class _Discarded(Exception):
    """Thrown into a landing file's open stream to discard it (LandingFile.close(commit=False))."""


def partition_dir(landing_root: str, ds: str) -> str:
    """The URI (or local path) of arrival day ds's partition."""
    return storage.join(landing_root, f"{PARTITION_PREFIX}{ds}")


def marker_uri(landing_root: str, ds: str) -> str:
    """The URI of arrival day ds's `_SUCCESS` marker."""
    return storage.join(partition_dir(landing_root, ds), SUCCESS_MARKER)


def partition_dirs(landing_root: str) -> list[str]:
    """The URIs of every partition (`ds=...`) under the landing root, sorted."""
    return [uri for uri in storage.listdir(landing_root) if storage.name(uri).startswith(PARTITION_PREFIX)]


def write_manifest_file(uri: str, manifest: dict[str, Any]) -> None:
    """A producer's JSON manifest (a `_SUCCESS` body or a sidecar), replaced whole; sorted keys, so
    equal manifests give equal bytes."""
    storage.write(uri, json.dumps(manifest, sort_keys=True, indent=1))


class LandingFile:
    """A gzip JSON-lines file that appears under its final name only when closed without error
    (gem.storage.open_write).

    name: the data file's stem (`NAME.json.gz`); file_name: an exact name instead (a file already in
    the partition being rewritten, e.g. by an erasure), gzip-compressed only when it ends in `.gz`,
    as Spark's reader decides."""

    def __init__(self, landing_root: str, ds: str, name: str | None = None, compresslevel: int = 1,
                 file_name: str | None = None):
        if (name is None) == (file_name is None):
            raise ValueError("LandingFile: give a data file's name or an exact file_name, one of the two")
        self.file_name = file_name or f"{name}.json.gz"
        self.uri = storage.join(partition_dir(landing_root, ds), self.file_name)
        self._stream = ExitStack()  # open until close() commits or discards it
        self._raw = self._stream.enter_context(storage.open_write(self.uri))
        self._gz = (gzip.GzipFile(filename="", mode="wb", fileobj=self._raw, compresslevel=compresslevel, mtime=0)
                    if self.file_name.endswith(".gz") else None)
        self._out = self._gz or self._raw
        self.lines = 0

    def write_line(self, line: str) -> None:
        self._out.write(line.encode("utf-8"))
        self._out.write(b"\n")
        self.lines += 1

    def write_lines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write_line(line)

    def write_text(self, text: str, n_lines: int) -> None:
        """Write a block of newline-terminated lines at once (fast path for bulk writers)."""
        self._out.write(text.encode("utf-8"))
        self.lines += n_lines

    def close(self, commit: bool = True) -> None:
        """Publish the file (commit) or discard it; a failure while finishing it discards it too."""
        try:
            if self._gz is not None:
                self._gz.close()  # writes the gzip trailer; the stream stays open
        except BaseException:
            self._discard()
            raise
        if commit:
            self._stream.close()
        else:
            self._discard()

    def _discard(self) -> None:
        """End the stream with an error thrown in, so gem.storage.open_write publishes nothing."""
        self._stream.__exit__(_Discarded, _Discarded(f"landing file {self.uri} discarded"), None)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        self.close(commit=exc_type is None)


def mark_partition_complete(landing_root: str, ds: str, manifest: dict[str, Any]) -> str:
    """Write ds's `_SUCCESS` marker holding `manifest` (after every data file); its URI."""
    marker = marker_uri(landing_root, ds)
    write_manifest_file(marker, manifest)
    return marker


def clear_partition_complete(landing_root: str, ds: str) -> None:
    storage.delete(marker_uri(landing_root, ds))


def completed_manifest(landing_root: str, ds: str) -> dict[str, Any] | None:
    """The manifest of a completed landing partition (its `_SUCCESS` marker); None while incomplete."""
    try:
        return storage.read_json(marker_uri(landing_root, ds))
    except FileNotFoundError:
        return None


def read_manifest(landing_root: str, ds: str) -> dict[str, Any]:
    return storage.read_json(marker_uri(landing_root, ds))


@dataclass(frozen=True)
class PartitionListing:
    """The files of a landing partition: data files (DATA_FILE_PATTERN) and unexpected ones (any
    other name that is not a marker, an in-progress write or producer metadata); full URIs, sorted."""

    data_files: list[str]
    unexpected_files: list[str]

    @property
    def all_files(self) -> list[str]:
        return sorted(self.data_files + self.unexpected_files)


def _listing(folder: str, present: list[str]) -> PartitionListing:
    """`present` (every file under the partition `folder`) sorted into a PartitionListing."""
    data, unexpected = [], []
    base = storage.normalized(folder).rstrip("/") + "/"
    for uri in present:
        relative = storage.normalized(uri).removeprefix(base)
        top = relative.split("/", 1)[0]
        if top.startswith(("_", ".")) or fnmatch.fnmatch(top, METADATA_FILE_PATTERN):
            continue
        if "/" in relative:
            raise MissingLandingPartition(f"landing partition {folder} holds a folder {top!r}; partitions are flat")
        (data if fnmatch.fnmatch(relative, DATA_FILE_PATTERN) else unexpected).append(uri)
    return PartitionListing(data, unexpected)


def files_in(folder: str) -> PartitionListing:
    """The files ingestion reads in a partition folder, complete or not: data files and unexpected
    ones; markers, in-progress writes and producer metadata left out. A sub-folder holding a file is
    refused loudly: landing partitions are flat."""
    return _listing(folder, storage.walk_files(folder))


def list_partition(landing_root: str, ds: str) -> PartitionListing:
    """The partition's files, or MissingLandingPartition naming the folder (no file at all, no
    `_SUCCESS` marker, or no data file). A sub-folder holding a file is refused loudly: landing
    partitions are flat."""
    folder = partition_dir(landing_root, ds)
    present = storage.walk_files(folder)
    if not present:
        raise MissingLandingPartition(f"landing partition {folder} does not exist (no data arrived for ds={ds})")
    if marker_uri(landing_root, ds) not in present:
        raise MissingLandingPartition(
            f"landing partition {folder} is incomplete: no {SUCCESS_MARKER} marker from its producer"
        )
    listing = _listing(folder, present)
    if not listing.data_files:
        raise MissingLandingPartition(
            f"landing partition {folder} has a {SUCCESS_MARKER} marker but no {DATA_FILE_PATTERN} files")
    return listing


def require_partition(landing_root: str, ds: str) -> list[str]:
    """The partition's data files, or MissingLandingPartition naming the folder."""
    return list_partition(landing_root, ds).data_files


_GZIP_ERRORS = (OSError, EOFError, zlib.error)  # gzip.BadGzipFile is an OSError


def gzip_problem(uri: str) -> str | None:
    """None when the file's gzip stream decompresses to its end (CRC and length checked); else why not.
    One streaming pass, nothing kept in memory."""
    try:
        with storage.open_read(uri) as raw, gzip.GzipFile(fileobj=raw, mode="rb") as f:
            while f.read(1 << 20):
                pass
    except _GZIP_ERRORS as e:
        return f"{type(e).__name__}: {e}"
    return None


def lines_before_damage(uri: str) -> list[str]:
    """The lines a damaged gzip file yields before the damage (the last one possibly cut short);
    undecodable bytes become U+FFFD. Decompressed chunk by chunk with zlib, which returns what it
    could decode before failing (gzip.GzipFile drops the last read's output when it raises)."""
    data = bytearray()
    decompressor = zlib.decompressobj(zlib.MAX_WBITS | 16)  # | 16: a gzip header and trailer
    try:
        with storage.open_read(uri) as f:
            while chunk := f.read(1 << 16):
                data += decompressor.decompress(chunk)
                while decompressor.eof and decompressor.unused_data:  # the next gzip member
                    rest, decompressor = decompressor.unused_data, zlib.decompressobj(zlib.MAX_WBITS | 16)
                    data += decompressor.decompress(rest)
    except zlib.error:
        pass
    return data.decode("utf-8", errors="replace").splitlines()

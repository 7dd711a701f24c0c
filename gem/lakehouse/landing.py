"""Landing zone I/O: gzip JSON-lines files per arrival day, published atomically.

Layout: `{landing_root}/ds=YYYY-MM-DD/NAME.json.gz`, plus `_SUCCESS` once the producer of that
arrival day has finished (its JSON body holds the producer's manifest, e.g. planted dirty rows), and
optionally `NAME.manifest.json` producer metadata beside a data file. Names starting with `_` or `.`
are markers and in-progress writes; any other file is unexpected: ingest reads and quarantines its
lines instead of skipping it unseen (`list_partition`). A data file whose gzip stream is damaged is
found before Spark reads anything (`gzip_problem`), so one bad file cannot fail or shorten a day.
Files are written to a hidden temporary name and renamed, so a reader never sees half a file; gzip
headers carry mtime 0 so a rerun writes byte-identical files.

Example:
    >>> with LandingFile(root, "2026-01-01", "events-from-2026-01-01") as f:
    ...     f.write_line('{"event_id": "e1", ...}')
    >>> mark_partition_complete(root, "2026-01-01", {"producer": "generate_events"})
"""

from __future__ import annotations

import fnmatch
import gzip
import json
import os
import zlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

SUCCESS_MARKER = "_SUCCESS"
DATA_FILE_PATTERN = "*.json.gz"
METADATA_FILE_PATTERN = "*.manifest.json"  # a producer's notes on a data file, not data


class MissingLandingPartition(FileNotFoundError):
    """The landing folder for a ds is absent or its producer has not finished."""


def partition_dir(landing_root: str, ds: str) -> Path:
    return Path(landing_root) / f"ds={ds}"


class LandingFile:
    """A gzip JSON-lines file that appears under its final name only when closed without error.

    name: the data file's stem (`NAME.json.gz`); file_name: an exact name instead (a file already in
    the partition being rewritten, e.g. by an erasure), gzip-compressed only when it ends in `.gz`,
    as Spark's reader decides."""

    def __init__(self, landing_root: str, ds: str, name: str | None = None, compresslevel: int = 1,
                 file_name: str | None = None):
        if (name is None) == (file_name is None):
            raise ValueError("LandingFile: give a data file's name or an exact file_name, one of the two")
        folder = partition_dir(landing_root, ds)
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / (file_name or f"{name}.json.gz")
        self._tmp = folder / f".{self.path.name}.tmp"
        self._raw = open(self._tmp, "wb")  # noqa: SIM115 (open until close() commits or discards it)
        self._gz = (gzip.GzipFile(filename="", mode="wb", fileobj=self._raw, compresslevel=compresslevel, mtime=0)
                    if self.path.name.endswith(".gz") else None)
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
        if self._gz is not None:
            self._gz.close()
        self._raw.close()
        if commit:
            os.replace(self._tmp, self.path)
        else:
            self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        self.close(commit=exc_type is None)


def mark_partition_complete(landing_root: str, ds: str, manifest: dict[str, Any]) -> Path:
    folder = partition_dir(landing_root, ds)
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / SUCCESS_MARKER
    tmp = folder / f".{SUCCESS_MARKER}.tmp"
    tmp.write_text(json.dumps(manifest, sort_keys=True, indent=1))
    os.replace(tmp, marker)
    return marker


def clear_partition_complete(landing_root: str, ds: str) -> None:
    (partition_dir(landing_root, ds) / SUCCESS_MARKER).unlink(missing_ok=True)


def completed_manifest(landing_root: str, ds: str) -> dict[str, Any] | None:
    """The manifest of a completed landing partition (its `_SUCCESS` marker); None while incomplete."""
    marker = partition_dir(landing_root, ds) / SUCCESS_MARKER
    return json.loads(marker.read_text()) if marker.is_file() else None


def read_manifest(landing_root: str, ds: str) -> dict[str, Any]:
    return json.loads((partition_dir(landing_root, ds) / SUCCESS_MARKER).read_text())


@dataclass(frozen=True)
class PartitionListing:
    """The files of a landing partition: data files (DATA_FILE_PATTERN) and unexpected ones (any
    other name that is not a marker, an in-progress write or producer metadata); full paths, sorted."""

    data_files: list[str]
    unexpected_files: list[str]

    @property
    def all_files(self) -> list[str]:
        return sorted(self.data_files + self.unexpected_files)


def files_in(folder: Path) -> PartitionListing:
    """The files ingestion reads in a partition folder, complete or not: data files and unexpected
    ones; markers, in-progress writes and producer metadata left out. A sub-folder is refused loudly:
    landing partitions are flat."""
    data, unexpected = [], []
    for p in sorted(folder.iterdir()):
        if p.name.startswith(("_", ".")) or fnmatch.fnmatch(p.name, METADATA_FILE_PATTERN):
            continue
        if p.is_dir():
            raise MissingLandingPartition(f"landing partition {folder} holds a folder {p.name!r}; partitions are flat")
        (data if fnmatch.fnmatch(p.name, DATA_FILE_PATTERN) else unexpected).append(str(p))
    return PartitionListing(data, unexpected)


def list_partition(landing_root: str, ds: str) -> PartitionListing:
    """The partition's files, or MissingLandingPartition naming the folder (absent, unfinished, or
    no data file). A sub-folder is refused loudly: landing partitions are flat."""
    folder = partition_dir(landing_root, ds)
    if not folder.is_dir():
        raise MissingLandingPartition(f"landing partition {folder} does not exist (no data arrived for ds={ds})")
    if not (folder / SUCCESS_MARKER).is_file():
        raise MissingLandingPartition(
            f"landing partition {folder} is incomplete: no {SUCCESS_MARKER} marker from its producer"
        )
    listing = files_in(folder)
    if not listing.data_files:
        raise MissingLandingPartition(
            f"landing partition {folder} has a {SUCCESS_MARKER} marker but no {DATA_FILE_PATTERN} files")
    return listing


def require_partition(landing_root: str, ds: str) -> list[str]:
    """The partition's data files, or MissingLandingPartition naming the folder."""
    return list_partition(landing_root, ds).data_files


_GZIP_ERRORS = (OSError, EOFError, zlib.error)  # gzip.BadGzipFile is an OSError


def gzip_problem(path: str) -> str | None:
    """None when the file's gzip stream decompresses to its end (CRC and length checked); else why not.
    One streaming pass, nothing kept in memory."""
    try:
        with gzip.open(path, "rb") as f:
            while f.read(1 << 20):
                pass
    except _GZIP_ERRORS as e:
        return f"{type(e).__name__}: {e}"
    return None


def lines_before_damage(path: str) -> list[str]:
    """The lines a damaged gzip file yields before the damage (the last one possibly cut short);
    undecodable bytes become U+FFFD. Decompressed chunk by chunk with zlib, which returns what it
    could decode before failing (gzip.GzipFile drops the last read's output when it raises)."""
    data = bytearray()
    decompressor = zlib.decompressobj(zlib.MAX_WBITS | 16)  # | 16: a gzip header and trailer
    try:
        with open(path, "rb") as f:
            while chunk := f.read(1 << 16):
                data += decompressor.decompress(chunk)
                while decompressor.eof and decompressor.unused_data:  # the next gzip member
                    rest, decompressor = decompressor.unused_data, zlib.decompressobj(zlib.MAX_WBITS | 16)
                    data += decompressor.decompress(rest)
    except zlib.error:
        pass
    return data.decode("utf-8", errors="replace").splitlines()

"""Landing zone I/O: gzip JSON-lines files per arrival day, published atomically.

Layout: `{landing_root}/ds=YYYY-MM-DD/NAME.json.gz`, plus `_SUCCESS` once the producer of that
arrival day has finished (its JSON body holds the producer's manifest, e.g. planted dirty rows).
Files are written to a hidden temporary name and renamed, so a reader never sees half a file; gzip
headers carry mtime 0 so a rerun writes byte-identical files.

Example:
    >>> with LandingFile(root, "2026-01-01", "events-from-2026-01-01") as f:
    ...     f.write_line('{"event_id": "e1", ...}')
    >>> mark_partition_complete(root, "2026-01-01", {"producer": "generate_events"})
"""

from __future__ import annotations

import gzip
import json
import os
from pathlib import Path
from typing import Any, Iterable

SUCCESS_MARKER = "_SUCCESS"


class MissingLandingPartition(FileNotFoundError):
    """The landing folder for a ds is absent or its producer has not finished."""


def partition_dir(landing_root: str, ds: str) -> Path:
    return Path(landing_root) / f"ds={ds}"


class LandingFile:
    """A gzip JSON-lines file that appears under its final name only when closed without error."""

    def __init__(self, landing_root: str, ds: str, name: str, compresslevel: int = 1):
        folder = partition_dir(landing_root, ds)
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"{name}.json.gz"
        self._tmp = folder / f".{name}.json.gz.tmp"
        self._raw = open(self._tmp, "wb")
        self._gz = gzip.GzipFile(filename="", mode="wb", fileobj=self._raw, compresslevel=compresslevel, mtime=0)
        self.lines = 0

    def write_line(self, line: str) -> None:
        self._gz.write(line.encode("utf-8"))
        self._gz.write(b"\n")
        self.lines += 1

    def write_lines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write_line(line)

    def write_text(self, text: str, n_lines: int) -> None:
        """Write a block of newline-terminated lines at once (fast path for bulk writers)."""
        self._gz.write(text.encode("utf-8"))
        self.lines += n_lines

    def close(self, commit: bool = True) -> None:
        self._gz.close()
        self._raw.close()
        if commit:
            os.replace(self._tmp, self.path)
        else:
            self._tmp.unlink(missing_ok=True)

    def __enter__(self) -> "LandingFile":
        return self

    def __exit__(self, exc_type: Any, *_: Any) -> None:
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


def require_partition(landing_root: str, ds: str) -> list[str]:
    """The partition's data files, or MissingLandingPartition naming the folder."""
    folder = partition_dir(landing_root, ds)
    if not folder.is_dir():
        raise MissingLandingPartition(f"landing partition {folder} does not exist (no data arrived for ds={ds})")
    if not (folder / SUCCESS_MARKER).is_file():
        raise MissingLandingPartition(
            f"landing partition {folder} is incomplete: no {SUCCESS_MARKER} marker from its producer"
        )
    files = sorted(str(p) for p in folder.glob("*.json.gz"))
    if not files:
        raise MissingLandingPartition(f"landing partition {folder} has a {SUCCESS_MARKER} marker but no *.json.gz files")
    return files

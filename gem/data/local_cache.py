"""Decoded Delta data on the training host's local disk, as memory-mapped Arrow IPC files.

The loader decodes the same Parquet files again and again: every worker process indexes the same
silver.user_sequences days, every pass and every daily run re-reads the same example files. A Delta
data file is never rewritten in place (a change writes a new file under a new name), so what a
file decodes to is a function of its path, its size and how it is read. The first reader writes
the decoded table here once; later readers, in any worker process or run on the host, map it
(pyarrow.memory_map: the pages come from the OS page cache, nothing is decoded or copied).

A cache file is written under a temporary name and renamed into place, so concurrent workers never
see half a file. The folder is bounded in MiB: after a write the least recently used files
(by modification time, refreshed on each hit) are deleted until it fits; a worker that still maps
a deleted file keeps reading it (POSIX unlink semantics), and temporary files a killed worker left
are deleted once they are an hour old. A file that does not read as Arrow IPC is deleted and decoded
again. The cache never stops a run: a table larger than the bound is not written, and a folder that
cannot be written (read-only, full) is warned about once and the decoded table used as it is.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa

# Changes whenever what a key names decodes differently (a new column encoding, another layout).
FORMAT = "gem-decoded-1"
MIB = 1 << 20
STALE_WRITE_S = 3600  # a temporary file this old belongs to a worker that was killed mid-write
log = logging.getLogger(__name__)


def default_dir() -> Path:
    """The host's cache folder when loader.local_cache_dir is empty: one per user under the temp dir."""
    return Path(tempfile.gettempdir()) / f"gem-loader-cache-{os.getuid()}"


class LocalCache:
    """Arrow tables by key on local disk, bounded by `max_mib` (module doc)."""

    def __init__(self, folder: str | os.PathLike[str], max_mib: int) -> None:
        self.folder, self.max_bytes = Path(folder), max_mib * MIB
        self.hits = self.misses = 0
        self.unwritable = False  # a write failed: warned once, no further writes

    @staticmethod
    def key(*parts: object) -> str:
        """A file name for what `parts` name (data file paths and sizes, columns, the encoding)."""
        digest = hashlib.sha256(repr((FORMAT, *parts)).encode()).hexdigest()[:40]
        return f"{digest}.arrow"

    def get(self, key: str, build: Callable[[], pa.Table]) -> pa.Table:
        """The table cached under `key`, memory-mapped; on a miss `build()` decodes it, and it is
        written for the next reader."""
        path = self.folder / key
        try:
            table = pa.ipc.open_file(pa.memory_map(str(path))).read_all()
        except FileNotFoundError:
            pass
        except (pa.ArrowInvalid, OSError):  # a truncated or foreign file: decoded again below
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)
        else:
            self.hits += 1
            with contextlib.suppress(OSError):  # evicted by another worker since it was mapped
                os.utime(path)  # most recently used
            return table
        self.misses += 1
        table = build()
        if not self.unwritable and table.nbytes <= self.max_bytes:
            try:
                self._write(path, table)
            except OSError as e:
                self.unwritable = True
                log.warning("the loader's disk cache %s cannot be written (%s): reading without it", self.folder, e)
        return table

    def _write(self, path: Path, table: pa.Table) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".writing-")
        try:
            with os.fdopen(fd, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self._evict()

    def files(self) -> list[os.DirEntry[str]]:
        return [e for e in os.scandir(self.folder) if e.is_file() and e.name.endswith(".arrow")]

    def _evict(self) -> None:
        entries: list[tuple[float, int, str]] = []
        for e in os.scandir(self.folder):
            try:
                st = e.stat()
            except FileNotFoundError:  # evicted by another worker meanwhile
                continue
            if e.name.startswith(".writing-"):
                if time.time() - st.st_mtime > STALE_WRITE_S:  # left by a worker killed mid-write
                    Path(e.path).unlink(missing_ok=True)
            elif e.is_file() and e.name.endswith(".arrow"):
                entries.append((st.st_mtime, st.st_size, e.path))
        total = sum(size for _, size, _ in entries)
        for _, size, file in sorted(entries):
            if total <= self.max_bytes:
                break
            Path(file).unlink(missing_ok=True)
            total -= size

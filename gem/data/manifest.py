"""Read one gold.mixture_manifest partition into sources the loader streams (no Spark).

Checks what a stale manifest can point at: the pinned table versions must still load from the
Delta log, and every listed file must exist; either failure names the manifest, the table and
the fix (re-run jobs.mix). The manifest stores table and file locations in gem.storage's one
spelling (s3:// for S3); they are read back through storage.normalized all the same, so a row
written with another spelling (Spark's s3a://) names the same files.
"""

from __future__ import annotations

import functools
import posixpath
from dataclasses import dataclass, field
from typing import Any

import pyarrow.compute as pc

from gem import storage
from gem.config import GemConfig
from gem.data.delta_log import (
    LoggedFile,
    UnavailableVersionError,
    logged_files,
    partition_types,
    read_table,
    require_file,
)
from schemas.mixture import GOLD_MIXTURE_MANIFEST


class ManifestError(RuntimeError):
    """A manifest that cannot be read as asked (no such day or split)."""


@dataclass(frozen=True)
class Source:
    """One task's rows in one split: the files, and the rates each row is drawn with."""

    name: str  # "reels/click"
    surface: str
    label_type: str
    sampling_rate: float
    negative_rate: float
    rows: int
    positives: int
    files: tuple[str, ...]


@dataclass(frozen=True)
class Manifest:
    mixture_id: str
    ds: str
    split: str
    seed: int
    examples_path: str
    examples_version: int
    sequences_path: str
    sequences_version: int
    sources: tuple[Source, ...]
    file_ds: dict[str, str]  # file path -> its example day (the sequence snapshot day of its rows)
    file_rows: dict[str, int]
    file_surface: dict[str, str]  # file path -> its surface partition value
    # The first day the lake's counters count from (the pipeline's start_ds): the encoder scales a
    # young lake's window counts by it (gem.data.encode.dense_matrix).
    counters_start_ds: str
    # The examples table's files at the pinned version, as its log lists them (partition values
    # included), and its partition columns' types: what the loader's workers read without deltalake.
    example_files: dict[str, LoggedFile] = field(default_factory=dict)
    example_partition_types: dict[str, Any] = field(default_factory=dict)

    @property
    def files(self) -> list[str]:
        """Every data file of the split once, sorted (a file serves all tasks of its surface)."""
        return sorted(self.file_ds)

    @functools.cached_property
    def file_keys(self) -> dict[str, str]:
        """File path -> what the loader keys its draws and shuffles on: the file's partition folder
        relative to the table and its rank among that folder's files by name (Spark names a write's
        files part-<task index>-<random id>, so the rank is the task's). Keyed on the absolute path,
        the same data and seed would draw different rows in every fresh clone, whose lakehouse sits
        elsewhere and whose files carry other random ids, and identical tables would train to
        different models."""
        root = self.examples_path.rstrip("/") + "/"
        by_folder: dict[str, list[str]] = {}
        for path in self.files:
            relative = path.removeprefix(root)
            by_folder.setdefault(posixpath.dirname(relative), []).append(path)
        return {path: f"{folder}#{rank}" for folder, paths in by_folder.items()
                for rank, path in enumerate(sorted(paths))}


def read_manifest(cfg: GemConfig, ds: str, split: str = "train", check_files: bool = True) -> Manifest:
    """The `split` sources of the manifest written by `jobs.mix --ds ds`."""
    path = GOLD_MIXTURE_MANIFEST.path(cfg.lakehouse_uri)
    missing = f"no gold.mixture_manifest partition ds={ds} in {path}; run `python -m jobs.mix --ds {ds}`"
    try:
        table = read_table(path, where={"ds": ds})
    except UnavailableVersionError as e:
        raise ManifestError(missing) from e
    if table.num_rows == 0:
        raise ManifestError(missing)
    table = table.filter(pc.equal(table["split"], split))
    if table.num_rows == 0:
        raise ManifestError(f"manifest ds={ds} in {path} has no {split!r} sources")
    rows = table.to_pylist()
    for r in rows:
        for key in ("table_path", "sequences_path", "file_path"):
            r[key] = storage.normalized(r[key])
    first = rows[0]
    context = f"manifest {first['mixture_id']} (gold.mixture_manifest ds={ds})"
    # Pinned versions must still be readable: this raises UnavailableVersionError when vacuumed away.
    example_files = {f.path: f for f in logged_files(first["table_path"], int(first["table_version"]))}
    logged_files(first["sequences_path"], int(first["sequences_version"]))
    by_source: dict[str, list[dict]] = {}
    for r in rows:
        by_source.setdefault(r["source"], []).append(r)
    sources = tuple(
        Source(
            name=name, surface=rs[0]["surface"], label_type=rs[0]["label_type"],
            sampling_rate=float(rs[0]["sampling_rate"]), negative_rate=float(rs[0]["negative_rate"]),
            rows=int(rs[0]["source_rows"]), positives=int(rs[0]["source_positives"]),
            files=tuple(sorted(r["file_path"] for r in rs)),
        )
        for name, rs in sorted(by_source.items())
    )
    file_ds = {r["file_path"]: r["file_ds"].isoformat() for r in rows}
    if check_files:
        for f in file_ds:
            require_file(f, context)
    return Manifest(
        mixture_id=first["mixture_id"], ds=ds, split=split, seed=int(first["seed"]),
        examples_path=first["table_path"], examples_version=int(first["table_version"]),
        sequences_path=first["sequences_path"], sequences_version=int(first["sequences_version"]),
        sources=sources, file_ds=file_ds, file_rows={r["file_path"]: int(r["file_rows"]) for r in rows},
        file_surface={r["file_path"]: r["surface"] for r in rows}, counters_start_ds=cfg.start_ds,
        example_files={f: example_files[f] for f in file_ds if f in example_files},
        example_partition_types=partition_types(first["table_path"], int(first["table_version"])),
    )

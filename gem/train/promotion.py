"""Promoted models: the checkpoint each day's pretraining of an architecture published, and the one
a new run of a day warm-starts from.

One small JSON file per (architecture, mixture day): `{root}/promoted/{arch}/{mix_ds}.json` (the
root a local folder or an object store URI, through gem.storage), written atomically, naming the
exact checkpoint folder (not the run folder, whose later checkpoints a resumed rerun may add)
relative to the root. Keeping one file per day, instead of one moving pointer, gives the rules that
keep warm starts honest under reruns and backfills:

- a run of day D warm-starts from the newest promotion of a day before D, never from D's own or a
  later day's model (those trained on D's held-out examples or after them);
- the current model of an architecture is the promotion of its latest day, so a rerun of an old
  day never moves it back;
- a pointer names only a folder under the checkpoint root, checked when it is written and when it is
  read (`checked_checkpoint`): loading a checkpoint unpickles its metadata, so a hand-edited or
  planted pointer to a folder elsewhere (another path, another bucket, a `../` escape) is refused,
  naming the pointer file.

A local root gives its checkpoints as Paths (symbolic links followed when checked), an object store
root as URI strings.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from pathlib import Path

from gem import storage


class PromotionError(ValueError):
    """A promoted-model pointer naming a checkpoint outside the checkpoint root."""


@dataclass(frozen=True)
class Promotion:
    arch: str
    mix_ds: str
    checkpoint: Path | str  # a Path under a local root, a URI under an object store root
    step: int
    tasks: tuple[str, ...] = ()  # the heads' tasks, in order (empty in files from before they were kept)
    # The newest example day the model (with every model it warm-started from) trained on; None in
    # files from before it was kept. A reader of the model's outputs for day D needs it < D
    # (gem.distill.leakage).
    trained_through: str | None = None

    @property
    def version(self) -> str:
        """How outputs computed by this model name it, e.g. "kunlun@2026-01-03:step120"."""
        return f"{self.arch}@{self.mix_ds}:step{self.step}"


def _folder(root: Path | str, arch: str) -> str:
    return storage.join(root, "promoted", arch)


def _collapsed(uri: Path | str) -> str:
    """An object store URI with `.` and `..` segments and doubled slashes resolved (s3a:// spelled
    s3://), so that a prefix check sees where it leads."""
    protocol, _, key = storage.normalized(uri).partition("://")
    return f"{protocol}://{posixpath.normpath('/' + key).lstrip('/')}"


def _name_under(root: Path | str, checkpoint: Path | str) -> str | None:
    """`checkpoint`'s path relative to `root` ("run/step-00000004") when it lies strictly under the
    root (a local one with symbolic links followed), else None."""
    if storage.is_local(root) != storage.is_local(checkpoint):
        return None
    if storage.is_local(root):
        resolved, inside = storage.local_path(checkpoint).resolve(), storage.local_path(root).resolve()
        return resolved.relative_to(inside).as_posix() if resolved != inside and resolved.is_relative_to(inside) else None
    resolved, inside = _collapsed(checkpoint), _collapsed(root).rstrip("/") + "/"
    return resolved[len(inside):] if resolved.startswith(inside) and len(resolved) > len(inside) else None


def checked_checkpoint(root: Path | str, checkpoint: Path | str, pointer: str | None = None) -> Path | str:
    """`checkpoint` when it lies (a local one with symbolic links followed) in a folder under
    `root`; otherwise PromotionError naming the pointer file it came from."""
    if _name_under(root, checkpoint) is None:
        source = f"{pointer}: " if pointer is not None else ""
        raise PromotionError(
            f"{source}checkpoint {checkpoint} is outside the checkpoint root {storage.normalized(root)}; a "
            f"checkpoint's metadata is unpickled on load, so only folders under the root are promoted or loaded")
    return checkpoint


def promote(root: Path | str, arch: str, mix_ds: str, checkpoint: Path | str, step: int,
            tasks: tuple[str, ...] = (), trained_through: str | None = None) -> Promotion:
    """Publish `checkpoint` (under `root`) as `arch`'s model of day `mix_ds` (replacing an earlier run
    of that day); `tasks`: its heads' tasks in order, so a reader can rebuild the model;
    `trained_through`: the newest example day it (or a model it warm-started from) trained on."""
    checked_checkpoint(root, checkpoint)
    # Named relative to the root: a relative `checkpoint` (a run folder given from some working
    # directory) reads back the same from any other, and a lakehouse moved whole (or copied to
    # another bucket) keeps its pointers.
    named = _name_under(root, checkpoint)
    storage.write_json(storage.join(_folder(root, arch), f"{mix_ds}.json"),  # whole: old file or new
                       {"arch": arch, "mix_ds": mix_ds, "checkpoint": named, "step": step, "tasks": list(tasks),
                        "trained_through": trained_through})
    return Promotion(arch, mix_ds, checkpoint, step, tuple(tasks), trained_through)


def _pointed(root: Path | str, named: str) -> Path | str:
    """The checkpoint a pointer's `named` gives: relative to the root; an absolute path or URI (a
    pointer written before they were relative, or planted) as it is; an object store URI with its
    `.` and `..` segments resolved."""
    if storage.is_local(root):
        return storage.local_path(root) / named
    pointed = named if "://" in named else storage.join(root, named)
    return pointed if storage.is_local(pointed) else _collapsed(pointed)


def promotions(root: Path | str, arch: str) -> list[Promotion]:
    """Every promoted day of `arch`, oldest first."""
    found = []
    for pointer in storage.listdir(_folder(root, arch)):
        if storage.name(pointer).startswith(".") or not storage.name(pointer).endswith(".json"):
            continue  # not a pointer (a temporary file of a write in progress)
        data = storage.read_json(pointer)
        checkpoint = checked_checkpoint(root, _pointed(root, data["checkpoint"]), pointer=pointer)
        found.append(Promotion(data["arch"], data["mix_ds"], checkpoint, int(data["step"]),
                               tuple(data.get("tasks", ())), data.get("trained_through")))
    return sorted(found, key=lambda p: p.mix_ds)


def warm_start_for(root: Path, arch: str, mix_ds: str) -> Promotion | None:
    """The model a run of day `mix_ds` starts from: the newest promotion of an earlier day."""
    earlier = [p for p in promotions(root, arch) if p.mix_ds < mix_ds]
    return earlier[-1] if earlier else None


def as_of(root: Path, arch: str, ds: str) -> Promotion | None:
    """The model serving day `ds`: the newest promotion of ds or an earlier day (a later day's
    model never serves an earlier day, e.g. in a backfill)."""
    found = [p for p in promotions(root, arch) if p.mix_ds <= ds]
    return found[-1] if found else None


def of_day(root: Path, arch: str, mix_ds: str) -> Promotion | None:
    """`arch`'s promotion of exactly day `mix_ds`, if any."""
    return next((p for p in promotions(root, arch) if p.mix_ds == mix_ds), None)


def newest_day(days: list[str | None]) -> str | None:
    """The newest of `days`, ignoring None (None when all are): a warm-started model's trained_through."""
    known = [d for d in days if d is not None]
    return max(known) if known else None


def current(root: Path, arch: str) -> Promotion | None:
    """`arch`'s current model: the promotion of its latest day."""
    found = promotions(root, arch)
    return found[-1] if found else None

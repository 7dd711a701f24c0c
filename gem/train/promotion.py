"""Promoted models: the checkpoint each day's pretraining of an architecture published, and the one
a new run of a day warm-starts from.

One small JSON file per (architecture, mixture day): `{root}/promoted/{arch}/{mix_ds}.json`, written
atomically, naming the exact checkpoint folder (not the run folder, whose later checkpoints a
resumed rerun may add) relative to the root. Keeping one file per day, instead of one moving
pointer, gives the rules that keep warm starts honest under reruns and backfills:

- a run of day D warm-starts from the newest promotion of a day before D, never from D's own or a
  later day's model (those trained on D's held-out examples or after them);
- the current model of an architecture is the promotion of its latest day, so a rerun of an old
  day never moves it back;
- a pointer names only a folder under the checkpoint root, checked when it is written and when it is
  read (`checked_checkpoint`): loading a checkpoint unpickles its metadata, so a hand-edited or
  planted pointer to a folder elsewhere is refused, naming the pointer file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path


class PromotionError(ValueError):
    """A promoted-model pointer naming a checkpoint outside the checkpoint root."""


@dataclass(frozen=True)
class Promotion:
    arch: str
    mix_ds: str
    checkpoint: Path
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


def _folder(root: Path, arch: str) -> Path:
    return root / "promoted" / arch


def checked_checkpoint(root: Path, checkpoint: Path, pointer: Path | None = None) -> Path:
    """`checkpoint` when it resolves (symbolic links followed) to a folder under `root`; otherwise
    PromotionError naming the pointer file it came from."""
    resolved, inside = checkpoint.resolve(), root.resolve()
    if resolved == inside or not resolved.is_relative_to(inside):
        source = f"{pointer}: " if pointer is not None else ""
        raise PromotionError(
            f"{source}checkpoint {checkpoint} is outside the checkpoint root {inside}; a checkpoint's metadata "
            f"is unpickled on load, so only folders under the root are promoted or loaded")
    return checkpoint


def promote(root: Path, arch: str, mix_ds: str, checkpoint: Path, step: int,
            tasks: tuple[str, ...] = (), trained_through: str | None = None) -> Promotion:
    """Publish `checkpoint` (under `root`) as `arch`'s model of day `mix_ds` (replacing an earlier run
    of that day); `tasks`: its heads' tasks in order, so a reader can rebuild the model;
    `trained_through`: the newest example day it (or a model it warm-started from) trained on."""
    checked_checkpoint(root, checkpoint)
    folder = _folder(root, arch)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{mix_ds}.json.{os.getpid()}.tmp"
    # Named relative to the root: a relative `checkpoint` (a run folder given from some working
    # directory) reads back the same from any other, and a lakehouse moved whole keeps its pointers.
    named = checkpoint.resolve().relative_to(root.resolve())
    tmp.write_text(json.dumps({"arch": arch, "mix_ds": mix_ds, "checkpoint": str(named), "step": step,
                               "tasks": list(tasks), "trained_through": trained_through}))
    os.replace(tmp, folder / f"{mix_ds}.json")  # atomic: a reader sees the old file or the new one
    return Promotion(arch, mix_ds, checkpoint, step, tuple(tasks), trained_through)


def promotions(root: Path, arch: str) -> list[Promotion]:
    """Every promoted day of `arch`, oldest first."""
    folder = _folder(root, arch)
    if not folder.is_dir():
        return []
    found = []
    for path in sorted(folder.glob("*.json")):
        data = json.loads(path.read_text())
        # Relative to the root; an absolute path (a pointer written before they were relative) as it is.
        checkpoint = checked_checkpoint(root, root / data["checkpoint"], pointer=path)
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

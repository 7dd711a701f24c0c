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

Promotion is gated (gem.train.gate): every decision on a trained model, the gate's or one made by
hand (`gem promote`: a refusal overridden, or an earlier model rolled back to), is kept in
`{root}/decisions/{name}/{mix_ds}.json`, newest last, with the model decided on, the promoted model
it was compared with, the NE figures per label type, who decided and why. A promotion's pointer
carries the decision that made it. A refused model writes no pointer, so the model promoted before
keeps serving (`as_of`) and warm-starting (`warm_start_for`) the days after.

A local root gives its checkpoints as Paths (symbolic links followed when checked), an object store
root as URI strings.
"""

from __future__ import annotations

import datetime as dt
import posixpath
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gem import storage

if TYPE_CHECKING:
    from gem.config import GemConfig

# How a decision was made: by the gate after training, or by hand (`gem promote`).
GATE, OVERRIDE, ROLLBACK = "gate", "override", "rollback"


class PromotionError(ValueError):
    """A promotion that cannot be read or made: a pointer naming a checkpoint outside the checkpoint
    root, or a promotion by hand with nothing to promote."""


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
    # The decision that promoted it (Decision.as_json: who, why, the figures); None in files from
    # before decisions were kept.
    decision: Mapping[str, Any] | None = field(default=None, compare=False)

    @property
    def version(self) -> str:
        """How outputs computed by this model name it, e.g. "kunlun@2026-01-03:step120"."""
        return f"{self.arch}@{self.mix_ds}:step{self.step}"


def checkpoint_root(cfg: GemConfig) -> Path | str:
    """Where run folders, promotions and decisions live: train.checkpoint_root, else
    {lakehouse}/_checkpoints; a Path for a local folder, a URI string (gem.storage) on an object store."""
    root = cfg.train.checkpoint_root or f"{cfg.lakehouse_uri.rstrip('/')}/_checkpoints"
    return storage.local_path(root) if storage.is_local(root) else storage.normalized(root)


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
            tasks: tuple[str, ...] = (), trained_through: str | None = None,
            decision: Mapping[str, Any] | None = None) -> Promotion:
    """Publish `checkpoint` (under `root`) as `arch`'s model of day `mix_ds` (replacing an earlier run
    of that day); `tasks`: its heads' tasks in order, so a reader can rebuild the model;
    `trained_through`: the newest example day it (or a model it warm-started from) trained on;
    `decision`: the decision that promotes it (Decision.as_json). Pipeline runs promote through the
    gate (gem.train.gate.decide), people through `gem promote` (`override`, `roll_back`)."""
    checked_checkpoint(root, checkpoint)
    # Named relative to the root: a relative `checkpoint` (a run folder given from some working
    # directory) reads back the same from any other, and a lakehouse moved whole (or copied to
    # another bucket) keeps its pointers.
    named = _name_under(root, checkpoint)
    storage.write_json(storage.join(_folder(root, arch), f"{mix_ds}.json"),  # whole: old file or new
                       {"arch": arch, "mix_ds": mix_ds, "checkpoint": named, "step": step, "tasks": list(tasks),
                        "trained_through": trained_through, "decision": decision})
    return Promotion(arch, mix_ds, checkpoint, step, tuple(tasks), trained_through, decision)


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
                               tuple(data.get("tasks", ())), data.get("trained_through"), data.get("decision")))
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


# --------------------------------------------------------------------------------------------------
# Decisions: the gate's verdicts on trained models, and promotions by hand.


@dataclass(frozen=True)
class LabelFigures:
    """One label type's vote in a gate decision: its tasks with enough held-out positives, pooled;
    the candidate's NE and the promoted model's on the same examples (None: no model was promoted
    before, and the bar is 1, the base rate)."""

    label: str
    tasks: tuple[str, ...]
    positives: float
    candidate_ne: float
    promoted_ne: float | None
    passed: bool

    def describe(self, tolerance: float | None) -> str:
        """E.g. "click NE 1.3012 vs promoted 0.9105: worse by 0.3907, more than the tolerance 0.01"."""
        head = f"{self.label} NE {self.candidate_ne:.4f}"
        if self.promoted_ne is None:
            return f"{head} ({'below' if self.passed else 'not below'} 1, the base rate; no model promoted before)"
        worse = self.candidate_ne - self.promoted_ne
        if self.passed:
            return f"{head} vs promoted {self.promoted_ne:.4f}"
        return f"{head} vs promoted {self.promoted_ne:.4f}: worse by {worse:.4f}, more than the tolerance {tolerance:g}"


@dataclass(frozen=True)
class Decision:
    """One decision on a model for a day: the gate's after training, or one made by hand."""

    name: str  # the promoted model's name: an architecture, or a student (gem.distill.run.promotion_name)
    mix_ds: str
    promoted: bool
    how: str  # GATE, OVERRIDE or ROLLBACK
    by: str  # the stage whose gate decided, or who promoted by hand
    reason: str  # the gate's figures in words, or the reason given by hand
    model: Promotion  # the model decided on (a rollback's: the earlier day's promotion)
    against: str | None  # the promoted model it was compared with or replaces (None: none before)
    serving: str | None  # the model serving mix_ds after the decision (None: none)
    figures: tuple[LabelFigures, ...] = ()
    silent: tuple[str, ...] = ()  # tasks with too few held-out positives to vote
    ne_tolerance: float | None = None
    min_positives: float | None = None
    decided_at: str = ""

    def summary(self) -> str:
        """One line for logs and `gem status`: the verdict, both figures, what serves the day."""
        head = f"{self.name} ds={self.mix_ds}: {self.model.version}"
        if self.how == OVERRIDE:
            return f"{head} promoted by {self.by} over the gate's refusal ({self.reason})"
        if self.how == ROLLBACK:
            return (f"{self.name} ds={self.mix_ds}: rolled back to {self.model.version} by {self.by} ({self.reason})"
                    + (f"; replaces {self.against}" if self.against else ""))
        if self.promoted:
            return f"{head} promoted: {self.reason}"
        return (f"{head} not promoted: {self.reason}; {self.serving or 'no model'} stays in use; "
                f"`gem promote --ds {self.mix_ds} --model {self.name} --reason TEXT` overrides")

    def as_json(self, root: Path | str) -> dict[str, Any]:
        return {"name": self.name, "mix_ds": self.mix_ds, "promoted": self.promoted, "how": self.how, "by": self.by,
                "reason": self.reason,
                "model": {"mix_ds": self.model.mix_ds, "checkpoint": _name_under(root, self.model.checkpoint),
                          "step": self.model.step, "tasks": list(self.model.tasks),
                          "trained_through": self.model.trained_through, "version": self.model.version},
                "against": self.against, "serving": self.serving, "figures": [asdict(f) for f in self.figures],
                "silent": list(self.silent), "ne_tolerance": self.ne_tolerance, "min_positives": self.min_positives,
                "decided_at": self.decided_at}

    @classmethod
    def from_json(cls, root: Path | str, data: Mapping[str, Any], source: str) -> Decision:
        m = data["model"]
        model = Promotion(data["name"], m["mix_ds"], checked_checkpoint(root, _pointed(root, m["checkpoint"]), source),
                          int(m["step"]), tuple(m["tasks"]), m.get("trained_through"))
        return cls(data["name"], data["mix_ds"], bool(data["promoted"]), data["how"], data["by"], data["reason"], model,
                   data.get("against"), data.get("serving"), figures_from_json(data.get("figures", ())),
                   tuple(data.get("silent", ())), data.get("ne_tolerance"), data.get("min_positives"),
                   data.get("decided_at", ""))


def figures_from_json(rows: Any) -> tuple[LabelFigures, ...]:
    return tuple(LabelFigures(r["label"], tuple(r["tasks"]), float(r["positives"]), float(r["candidate_ne"]),
                              None if r["promoted_ne"] is None else float(r["promoted_ne"]), bool(r["passed"]))
                 for r in rows or ())


def now() -> str:
    """A decision's time stamp: UTC, to the second."""
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _decisions_file(root: Path | str, name: str, mix_ds: str) -> str:
    return storage.join(root, "decisions", name, f"{mix_ds}.json")


def record(root: Path | str, decision: Decision) -> Decision:
    """Keep `decision` (after any earlier ones of its day) and, when it promotes, point its day at its
    model (carrying the decision); -> the decision. A refusal changes no pointer."""
    checked_checkpoint(root, decision.model.checkpoint)
    path = _decisions_file(root, decision.name, decision.mix_ds)
    earlier = storage.read_json(path)["decisions"] if storage.exists(path) else []
    data = decision.as_json(root)
    if decision.promoted:
        m = decision.model
        promote(root, decision.name, decision.mix_ds, m.checkpoint, m.step, m.tasks, m.trained_through, data)
    storage.write_json(path, {"decisions": [*earlier, data]})  # whole: old file or new
    return decision


def decisions(root: Path | str, name: str, mix_ds: str | None = None) -> list[Decision]:
    """`name`'s decisions (of day `mix_ds` only, when given), oldest day first, each day's in order."""
    folder = storage.join(root, "decisions", name)
    found = []
    for path in storage.listdir(folder):
        if storage.name(path).startswith(".") or not storage.name(path).endswith(".json"):
            continue  # not a decision file (a temporary file of a write in progress)
        if mix_ds is None or storage.name(path) == f"{mix_ds}.json":
            found += [Decision.from_json(root, d, path) for d in storage.read_json(path)["decisions"]]
    return sorted(found, key=lambda d: d.mix_ds)  # stable: a day's decisions stay in order


def model_names(root: Path | str) -> list[str]:
    """Every model with a promotion or a decision under `root`: architectures and students."""
    return sorted({storage.name(p) for kind in ("promoted", "decisions") for p in storage.listdir(storage.join(root, kind))})


def pointer_version(name: str, mix_ds: str, step: int) -> str:
    """The version the pointer of day mix_ds gives a model of `step` steps (Promotion.version)."""
    return Promotion(name, mix_ds, "", step).version


def override(root: Path | str, name: str, mix_ds: str, by: str, reason: str) -> Decision:
    """Promote the model the gate refused for mix_ds (`gem promote --ds D`), keeping the gate's figures."""
    gated = [d for d in decisions(root, name, mix_ds) if d.how == GATE]
    if not gated:
        days = sorted({d.mix_ds for d in decisions(root, name) if d.how == GATE and not d.promoted})
        raise PromotionError(f"{name} has no gate decision for {mix_ds}: nothing to override (days it refused: "
                             f"{', '.join(days) or 'none'}); to promote an earlier day's model, give --from-ds")
    refused = gated[-1]
    if refused.promoted:
        raise PromotionError(f"the gate promoted {refused.model.version} for {mix_ds}: nothing to override")
    return record(root, Decision(name, mix_ds, True, OVERRIDE, by, reason, refused.model, refused.against,
                                 pointer_version(name, mix_ds, refused.model.step), refused.figures, refused.silent,
                                 refused.ne_tolerance, refused.min_positives, now()))


def roll_back(root: Path | str, name: str, mix_ds: str, from_ds: str, by: str, reason: str) -> Decision:
    """Promote the model promoted for the earlier day from_ds as mix_ds's (`gem promote --ds D
    --from-ds E`): it serves mix_ds and the days after, until a later day's promotion."""
    if from_ds >= mix_ds:
        raise PromotionError(f"--from-ds {from_ds} is not before --ds {mix_ds}: a later day's model may have "
                             f"trained on {mix_ds}'s held-out examples, so it never serves an earlier day")
    source = of_day(root, name, from_ds)
    if source is None:
        days = [p.mix_ds for p in promotions(root, name)]
        raise PromotionError(f"no {name} model was promoted for {from_ds} (promoted days: {', '.join(days) or 'none'})")
    replaced = as_of(root, name, mix_ds)
    figures = figures_from_json((source.decision or {}).get("figures", ()))
    return record(root, Decision(name, mix_ds, True, ROLLBACK, by, reason, source,
                                 replaced.version if replaced else None, pointer_version(name, mix_ds, source.step),
                                 figures, decided_at=now()))

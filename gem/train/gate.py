"""The promotion gate: a trained model replaces the promoted one only when it is no worse on the same
held-out examples.

The foundation model's pretraining (gem.train.daily) and each surface's student (gem.distill.run)
go through the same three steps after training:

    incumbent = incumbent_task(previous, build, trained_with)  # the promoted model, plain torch
    paired = score_pair(batches, candidate_task, incumbent)     # both, in one pass over the held-out day
    decision = decide(root, candidate, paired, cfg.promotion, by=STAGE)  # judged, kept, promoted or not

The vote (`judge`): a task is surface/label type. Per label type, the tasks with at least
promotion.min_positives held-out positives (that the promoted model also predicts) are pooled
across surfaces, and the candidate's NE over those (example, task) pairs is compared with the
promoted model's over the very same pairs. Every label type must pass: NE at most the promoted
model's + promotion.ne_tolerance; with no model promoted before, NE below 1 (the base rate). A
label type with no voting task does not vote; a model with no vote at all is promoted, its record
saying that nothing was judged. A refused model's pointer is not written (gem.train.promotion), so
the promoted model keeps serving precompute and the students, and keeps warm-starting the next days.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import torch

from gem.config import PromotionConfig
from gem.data.batch import Batch
from gem.model import metrics
from gem.precompute.model import load_plain_weights
from gem.train import promotion
from gem.train.evaluate import Predictions, gather, predictions

# The promoted model's columns of a paired batch (score_pair) are its task names with this prefix.
PROMOTED_PREFIX = "promoted:"


@dataclass(frozen=True)
class Incumbent:
    """The promoted model, loaded to be scored beside a candidate."""

    promotion: promotion.Promotion
    task: torch.nn.Module  # in eval mode; its heads predict promotion.tasks, in that order


@dataclass(frozen=True)
class Paired:
    """A candidate's and the promoted model's predictions of the same held-out (example, task) pairs,
    in the same order, both under the candidate's task names; `incumbent` None with no promoted model."""

    candidate: Predictions
    incumbent: Predictions | None = None
    incumbent_of: Incumbent | None = None


def label_type(task: str) -> str:
    """"fb_feed/click" -> "click"."""
    return task.split("/", 1)[-1]


def incumbent_task(previous: promotion.Promotion | None, build: Callable[[tuple[str, ...]], torch.nn.Module],
                   trained_with: str) -> Incumbent | None:
    """The promoted model `previous` as a plain-torch task in eval mode: `build(tasks)` makes the
    model (with "torch" embeddings), and its checkpoint's weights are read in, saved with the
    `trained_with` embeddings backend. None without a promoted model, or for a promotion that lists
    no tasks (written before they were kept: its heads cannot be rebuilt, so the base rate is the bar)."""
    if previous is None or not previous.tasks:
        return None
    task = build(previous.tasks)
    load_plain_weights(task, previous.checkpoint, trained_with)
    return Incumbent(previous, task.eval())


def _doubled(batch: Batch) -> Batch:
    """`batch` with every label column twice: the candidate's pairs, then the same pairs again under
    PROMOTED_PREFIX names for the promoted model (gather flattens them in one pass)."""
    return dataclasses.replace(
        batch, labels=torch.cat([batch.labels, batch.labels], 1),
        label_mask=torch.cat([batch.label_mask, batch.label_mask], 1),
        weights=torch.cat([batch.weights, batch.weights], 1),
        tasks=(*batch.tasks, *(PROMOTED_PREFIX + t for t in batch.tasks)))


def _part(p: Predictions, keep: torch.Tensor, tasks: tuple[str, ...], offset: int) -> Predictions:
    return Predictions(p.pred[keep], p.label[keep], p.weight[keep], p.task[keep] - offset, tasks)


@torch.no_grad()
def score_pair(batches: Iterable[Batch], candidate: torch.nn.Module, incumbent: Incumbent | None) -> Paired:
    """The candidate's serving predictions of every drawn (example, task) pair of `batches`
    (evaluate.predictions), and the promoted model's of the same pairs, in one pass. A task the
    promoted model has no head for gets 0.5 (and never votes: `judge`)."""
    if incumbent is None:
        return Paired(predictions(candidate, batches))
    candidate.eval()
    device = next(candidate.parameters()).device
    theirs = incumbent.task.to(device)
    heads = incumbent.promotion.tasks

    def both(batch: Batch) -> torch.Tensor:
        own_tasks = batch.tasks[: len(batch.tasks) // 2]
        batch = batch.to(device)
        own = torch.sigmoid(candidate.logits(batch).float()).cpu()
        promoted = torch.sigmoid(theirs.logits(batch).float()).cpu()
        aligned = torch.full_like(own, 0.5)
        for j, task in enumerate(own_tasks):
            if task in heads:
                aligned[:, j] = promoted[:, heads.index(task)]
        return torch.cat([own, aligned], 1)

    pairs = gather((_doubled(b) for b in batches), both)
    n = len(pairs.tasks) // 2
    tasks = pairs.tasks[:n]
    mine = pairs.task < n
    return Paired(_part(pairs, mine, tasks, 0), _part(pairs, ~mine, tasks, n), incumbent)


def judge(paired: Paired, settings: PromotionConfig) -> tuple[tuple[promotion.LabelFigures, ...], tuple[str, ...]]:
    """(one LabelFigures per voting label type, the tasks that do not vote); module docstring."""
    cand, theirs = paired.candidate, paired.incumbent
    heads = set(paired.incumbent_of.promotion.tasks) if paired.incumbent_of is not None else None
    positives = {t: float((cand.weight * cand.label)[cand.task == j].sum()) for j, t in enumerate(cand.tasks)}
    figures, silent = [], []
    for label in dict.fromkeys(label_type(t) for t in cand.tasks):
        tasks = [t for t in cand.tasks if label_type(t) == label]
        voting = tuple(t for t in tasks if positives[t] >= settings.min_positives and (heads is None or t in heads))
        silent += [t for t in tasks if t not in voting]
        if not voting:
            continue
        pooled = cand.select(voting)
        ne = float(metrics.ne(cand.pred[pooled], cand.label[pooled], cand.weight[pooled]))
        if theirs is None:
            promoted_ne, passed = None, ne < 1.0
        else:
            promoted_ne = float(metrics.ne(theirs.pred[pooled], theirs.label[pooled], theirs.weight[pooled]))
            passed = ne <= promoted_ne + settings.ne_tolerance  # False for a NaN NE
        figures.append(promotion.LabelFigures(label, voting, sum(positives[t] for t in voting), ne, promoted_ne,
                                              passed))
    return tuple(figures), tuple(silent)


def decide(root: Path | str, candidate: promotion.Promotion, paired: Paired, settings: PromotionConfig,
           by: str) -> promotion.Decision:
    """Judge `candidate` (the trained model, as its pointer would name it) on `paired`, keep the
    decision and promote it when it passes (gem.train.promotion.record); -> the decision."""
    figures, silent = judge(paired, settings)
    promoted = all(f.passed for f in figures)
    if figures:  # a refusal gives the label types that failed; a promotion, all of them
        shown = figures if promoted else [f for f in figures if not f.passed]
        reason = "; ".join(f.describe(settings.ne_tolerance) for f in shown)
    else:
        reason = f"no task has {settings.min_positives} held-out positives: nothing to judge by"
    name, ds = candidate.arch, candidate.mix_ds
    kept = promotion.as_of(root, name, ds)
    serving = promotion.pointer_version(name, ds, candidate.step) if promoted else (kept.version if kept else None)
    against = paired.incumbent_of.promotion.version if paired.incumbent_of is not None else None
    return promotion.record(root, promotion.Decision(
        name, ds, promoted, promotion.GATE, by, reason, candidate, against, serving, figures, silent,
        settings.ne_tolerance, settings.min_positives, promotion.now()))

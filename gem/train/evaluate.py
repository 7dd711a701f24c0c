"""Evaluate a train task on a batch stream: per task NE, AUC and calibration (gem.model.metrics).

Only the examples drawn for a task (label_mask) count for it, each with its importance weight.
`predictions` / `gather` flatten a stream to those (example, task) pairs; `evaluate` and `score`
report per task from them, `pooled` per label type over every surface, and the quality study (gem.study.runner) pools them over groups of tasks.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from gem.data.batch import Batch
from gem.model import metrics
from schemas.tasks import pooled_groups


@dataclass
class Predictions:
    """Every (example, task) pair drawn (label_mask) of a batch stream, flattened in stream order
    (batch, then example, then task): float64, so sums over a whole day keep their precision."""

    pred: torch.Tensor  # (P,) float64 probability
    label: torch.Tensor  # (P,) float64
    weight: torch.Tensor  # (P,) float64 importance weight
    task: torch.Tensor  # (P,) int64 index into `tasks`
    tasks: tuple[str, ...]

    def select(self, names: Iterable[str]) -> torch.Tensor:
        """(P,) bool: the pairs of the tasks in `names`."""
        names = set(names)
        wanted = torch.tensor([t in names for t in self.tasks], dtype=torch.bool)
        return wanted[self.task]


@torch.no_grad()
def gather(batches: Iterable[Batch], probabilities: Callable[[Batch], torch.Tensor]) -> Predictions:
    """`probabilities(batch)` (B, T) at every pair the batch draws (label_mask), with its label and weight."""
    preds, labels, weights, cols = [], [], [], []
    names: tuple[str, ...] = ()
    for batch in batches:
        names = batch.tasks
        prob = probabilities(batch)
        rows, col = batch.label_mask.nonzero(as_tuple=True)
        preds.append(prob[rows, col].double())
        labels.append(batch.labels[rows, col].double())
        weights.append(batch.weights[rows, col].double())
        cols.append(col)
    if not preds:
        empty = torch.zeros(0, dtype=torch.float64)
        return Predictions(empty, empty, empty, torch.zeros(0, dtype=torch.int64), names)
    return Predictions(torch.cat(preds), torch.cat(labels), torch.cat(weights), torch.cat(cols), names)


@torch.no_grad()
def predictions(task: torch.nn.Module, batches: Iterable[Batch]) -> Predictions:
    """The task's serving predictions (sigmoid of task.logits, in eval mode, fp32) at every drawn pair."""
    task.eval()
    device = next(task.parameters()).device
    return gather(batches, lambda batch: torch.sigmoid(task.logits(batch.to(device)).float()).cpu())


def _figures(pred: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> dict[str, float | None]:
    """Examples, weighted positives, NE, AUC and calibration of a set of pairs."""
    positives = float((w * y).sum())
    both = 0 < positives < float(w.sum())
    return {
        "examples": int(pred.numel()),
        "positives": positives,
        "ne": float(metrics.ne(pred, y, w)) if both else None,
        "auc": float(metrics.auc(pred, y, w)) if both else None,
        "calibration": float(metrics.calibration(pred, y, w)) if positives > 0 else None,
    }


def per_task(p: Predictions) -> dict[str, dict[str, float | None]]:
    """Per task: examples, weighted positives, NE, AUC and calibration over its pairs."""
    out: dict[str, dict[str, float | None]] = {}
    for j, name in enumerate(p.tasks):
        m = p.task == j
        out[name] = _figures(p.pred[m], p.label[m], p.weight[m])
    return out


def pooled(p: Predictions) -> dict[str, dict[str, float | None]]:
    """Per label type held by tasks of two or more surfaces, the same figures over all of their pairs
    pooled, as "all/<label type>" (schemas.tasks.pooled_groups): a conversion type too sparse to read
    on any one surface can be read across them."""
    out: dict[str, dict[str, float | None]] = {}
    for name, tasks in pooled_groups(p.tasks).items():
        m = p.select(tasks)
        out[name] = _figures(p.pred[m], p.label[m], p.weight[m])
    return out


def evaluate(task: torch.nn.Module, batches: Iterable[Batch]) -> dict[str, dict[str, float | None]]:
    """The task's serving predictions scored per task."""
    return per_task(predictions(task, batches))


def score(batches: Iterable[Batch], probabilities: Callable[[Batch], torch.Tensor]) -> dict[str, dict[str, float | None]]:
    """Per task: examples, weighted positives, NE, AUC and calibration of `probabilities(batch)` (B, T)
    over the examples drawn for the task (label_mask), each with its importance weight."""
    return per_task(gather(batches, probabilities))


def gap_closed(ne: float | None, floor: float | None) -> str:
    """(1 - NE) / (1 - floor) as a percentage: 0% is the base rate, 100% the world's own probabilities."""
    if ne is None or floor is None or floor >= 1.0:
        return "n/a"
    return f"{100.0 * (1.0 - ne) / (1.0 - floor):.0f}%"


def metrics_table(scores: dict[str, dict[str, float | None]], indent: str = "  ",
                  floor: dict[str, float | None] | None = None, min_positives: float = 0) -> str:
    """Per-task scores (as `evaluate` returns them) as an aligned text table; with `floor` (task ->
    the Bayes floor NE of the held-out day, gem.sources.bayes_floor), a column beside NE and the
    share of the way from the base rate (NE 1) to the floor that the model covered, (1 - NE) / (1 - floor).
    A task with fewer than `min_positives` held-out positives shows "too few positives" instead of
    its figures: an NE over a handful of positives is noise."""
    def fmt(v: float | None) -> str:
        return "    n/a" if v is None else f"{v:7.4f}"

    width = max([28, *(len(name) for name in scores)])
    floor_head = f" {'floor':>7} {'to floor':>8}" if floor is not None else ""
    lines = [(f"{indent}{'task':<{width}} {'examples':>9} {'positives':>9} {'NE':>7}{floor_head} "
              f"{'AUC':>7} {'calib':>7}")]
    for name, s in scores.items():
        head = f"{indent}{name:<{width}} {s['examples']:>9,} {s['positives']:>9.0f}"
        if s["positives"] < min_positives:
            lines.append(f"{head}  too few positives to read (< {min_positives:g})")
            continue
        floor_cell = f" {fmt(floor.get(name))} {gap_closed(s['ne'], floor.get(name)):>8}" if floor is not None else ""
        lines.append(f"{head} {fmt(s['ne'])}{floor_cell} {fmt(s['auc'])} {fmt(s['calibration'])}")
    return "\n".join(lines)

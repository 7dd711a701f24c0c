"""Evaluate a train task on a batch stream: per task NE, AUC and calibration (gem.model.metrics).

Only the examples drawn for a task (label_mask) count for it, each with its importance weight.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

from gem.data.batch import Batch
from gem.model import metrics


@torch.no_grad()
def evaluate(task: torch.nn.Module, batches: Iterable[Batch]) -> dict[str, dict[str, float | None]]:
    """The task's serving predictions (task.logits) scored per task."""
    task.eval()
    device = next(task.parameters()).device
    return score(batches, lambda batch: torch.sigmoid(task.logits(batch.to(device)).float()).cpu())


@torch.no_grad()
def score(batches: Iterable[Batch], probabilities: Callable[[Batch], torch.Tensor]) -> dict[str, dict[str, float | None]]:
    """Per task: examples, weighted positives, NE, AUC and calibration of `probabilities(batch)` (B, T)
    over the examples drawn for the task (label_mask), each with its importance weight."""
    preds: dict[str, list[torch.Tensor]] = {}
    labels: dict[str, list[torch.Tensor]] = {}
    weights: dict[str, list[torch.Tensor]] = {}
    names: tuple[str, ...] = ()
    for batch in batches:
        names = batch.tasks
        prob = probabilities(batch)
        for j, name in enumerate(batch.tasks):
            m = batch.label_mask[:, j]
            preds.setdefault(name, []).append(prob[m, j])
            labels.setdefault(name, []).append(batch.labels[m, j])
            weights.setdefault(name, []).append(batch.weights[m, j])
    out: dict[str, dict[str, float | None]] = {}
    for name in names:
        p, y, w = (torch.cat(x[name]) for x in (preds, labels, weights))
        positives = float((w * y).sum())
        both = 0 < positives < float(w.sum())
        out[name] = {
            "examples": int(p.numel()),
            "positives": positives,
            "ne": float(metrics.ne(p, y, w)) if both else None,
            "auc": float(metrics.auc(p, y, w)) if both else None,
            "calibration": float(metrics.calibration(p, y, w)) if positives > 0 else None,
        }
    return out


def gap_closed(ne: float | None, floor: float | None) -> str:
    """(1 - NE) / (1 - floor) as a percentage: 0% is the base rate, 100% the world's own probabilities."""
    if ne is None or floor is None or floor >= 1.0:
        return "n/a"
    return f"{100.0 * (1.0 - ne) / (1.0 - floor):.0f}%"


def metrics_table(scores: dict[str, dict[str, float | None]], indent: str = "  ",
                  floor: dict[str, float | None] | None = None) -> str:
    """Per-task scores (as `evaluate` returns them) as an aligned text table; with `floor` (task ->
    the Bayes floor NE of the held-out day, gem.sources.bayes_floor), a column beside NE and the
    share of the way from the base rate (NE 1) to the floor that the model covered, (1 - NE) / (1 - floor)."""
    def fmt(v: float | None) -> str:
        return "    n/a" if v is None else f"{v:7.4f}"

    width = max([28, *(len(name) for name in scores)])
    floor_head = f" {'floor':>7} {'to floor':>8}" if floor is not None else ""
    lines = [(f"{indent}{'task':<{width}} {'examples':>9} {'positives':>9} {'NE':>7}{floor_head} "
              f"{'AUC':>7} {'calib':>7}")]
    for name, s in scores.items():
        floor_cell = f" {fmt(floor.get(name))} {gap_closed(s['ne'], floor.get(name)):>8}" if floor is not None else ""
        lines.append(f"{indent}{name:<{width}} {s['examples']:>9,} {s['positives']:>9.0f} {fmt(s['ne'])}{floor_cell} "
                     f"{fmt(s['auc'])} {fmt(s['calibration'])}")
    return "\n".join(lines)

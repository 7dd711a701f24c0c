"""Per-task evaluation metrics with importance weights: NE, AUC, calibration.

    NE  = weighted mean log loss / entropy of the weighted base rate p:  -(p log p + (1-p) log(1-p))
          (1.0 = no better than always predicting p; lower is better)
    AUC = probability a random positive scores above a random negative (ties count 1/2), each
          example counted with its weight
    calibration = sum(w * prediction) / sum(w * label)   (1.0 = calibrated)
    transfer ratio (ExFM) = (NE_baseline - NE_student) / (NE_baseline - NE_FM): the share of the
          foundation model's NE gain over a student without any FM signal that the student keeps

Example:
    >>> ne(torch.tensor([0.1, 0.1]), torch.tensor([1.0, 0.0]), torch.tensor([1.0, 9.0]))  # p = 0.1
    tensor(1.0000, dtype=torch.float64)
"""

from __future__ import annotations

import torch

EPS = 1e-12


def ne(pred: torch.Tensor, label: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    pred, label, weight = pred.double().clamp(EPS, 1 - EPS), label.double(), weight.double()
    total = weight.sum()
    log_loss = -(weight * (label * pred.log() + (1 - label) * (1 - pred).log())).sum() / total
    p = ((weight * label).sum() / total).clamp(EPS, 1 - EPS)
    return log_loss / -(p * p.log() + (1 - p) * (1 - p).log())


def auc(pred: torch.Tensor, label: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Weighted AUC in O(n log n): sort by score, sum the negative weight below each positive (ties half)."""
    pred, label, weight = pred.double(), label.double(), weight.double()
    order = torch.argsort(pred)
    pred, label, weight = pred[order], label[order], weight[order]
    pos_w, neg_w = weight * label, weight * (1 - label)
    # Group equal scores: within a group, positives and negatives tie.
    _, group = torch.unique_consecutive(pred, return_inverse=True)
    groups = int(group.max()) + 1 if group.numel() else 0
    pos_g = torch.zeros(groups, dtype=torch.float64).index_add_(0, group, pos_w)
    neg_g = torch.zeros(groups, dtype=torch.float64).index_add_(0, group, neg_w)
    neg_below = torch.cumsum(neg_g, 0) - neg_g
    numerator = (pos_g * (neg_below + 0.5 * neg_g)).sum()
    denominator = pos_g.sum() * neg_g.sum()
    return numerator / denominator if denominator > 0 else torch.tensor(float("nan"), dtype=torch.float64)


def calibration(pred: torch.Tensor, label: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return (weight.double() * pred.double()).sum() / (weight.double() * label.double()).sum()


def transfer_ratio(baseline_ne: float, student_ne: float, fm_ne: float) -> float:
    """(student's NE gain) / (FM's NE gain), both over the same baseline student, on the same
    examples; nan when the FM gains nothing over the baseline (no gain to transfer).

    Example: baseline 0.90, FM 0.80, student 0.85 -> 0.5.
    """
    fm_gain = baseline_ne - fm_ne
    return (baseline_ne - student_ne) / fm_gain if fm_gain > 0 else float("nan")

"""ExFM (arXiv 2502.17494): a student distilled from the foundation model's logged predictions.

The FM's prediction y_FM for each (example, task) is logged once (the precompute stage) and read by
every student; no student runs the FM. A student has a serving head, trained on the true labels
only, and an auxiliary distillation head on the same body, whose input passes through
scale_gradient(., beta) (gem.model.ops.grad_scale). Over the (example, task) pairs the example was
drawn for and the FM predicted, each with its importance weight:

    distill_fm       = weight         * BCE(y_d, alpha * y_FM)
    adapter          =                  BCE(adapter(y_FM), y)                  the adapter's own fit
    distill_adapter  = adapter_weight * BCE(y_d, stop_gradient(sigmoid(adapter(y_FM))))

The student adapter is a small MLP on the FM's predictions fitted to the fresh labels: it corrects
what a stale FM gets wrong today, and that correction is a second distillation target. It trains on
the labels alone (its input has no gradient path into the student) and serves nothing.
"""

from __future__ import annotations

import torch
from torch import nn

from gem.data.batch import Batch
from gem.model.configs import DistillationConfig
from gem.model.task import masked_weighted_bce

PROBABILITY_EPS = 1e-6  # y_FM is clamped to [eps, 1 - eps] before its logit


class StudentAdapter(nn.Module):
    """FM predictions (B, T) and where they exist (B, T) -> adapted logits (B, T):

        adapted = logit(y_FM) + MLP([logit(y_FM) * m || m])      m = 1 where the FM predicted

    The MLP (2T -> hidden -> T, ReLU) reads every task's prediction; its last layer starts at zero,
    so the adapter starts as the FM itself and learns a correction from the labels.
    """

    def __init__(self, tasks: int, hidden: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(nn.Linear(2 * tasks, hidden), nn.ReLU(), nn.Linear(hidden, tasks))
        nn.init.zeros_(self.mlp[-1].weight)
        nn.init.zeros_(self.mlp[-1].bias)

    def forward(self, fm_predictions: torch.Tensor, fm_mask: torch.Tensor) -> torch.Tensor:
        m = fm_mask.to(fm_predictions.dtype)  # (B, T)
        fm_logits = torch.logit(fm_predictions.clamp(PROBABILITY_EPS, 1 - PROBABILITY_EPS)) * m  # (B, T)
        return fm_logits + self.mlp(torch.cat([fm_logits, m], dim=-1))


def fm_signals(batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """The batch's FM predictions (B, T) and their mask (B, T); a clear error when it has none."""
    if batch.fm_predictions is None or batch.fm_prediction_mask is None:
        raise ValueError("a distilled student needs the batch's fm_predictions and fm_prediction_mask "
                         "(from gold.fm_predictions)")
    return batch.fm_predictions, batch.fm_prediction_mask


def distillation_losses(distill_logits: torch.Tensor, adapter_logits: torch.Tensor | None, batch: Batch,
                        task_weights: torch.Tensor, cfg: DistillationConfig) -> dict[str, torch.Tensor]:
    """The module docstring's terms by name ("distill_fm", and with an adapter "adapter" and
    "distill_adapter"). distill_logits, adapter_logits: (B, T)."""
    fm, fm_mask = fm_signals(batch)
    pairs = batch.label_mask & fm_mask  # (B, T): drawn for the task, and the FM predicted it
    losses = {"distill_fm": cfg.weight * masked_weighted_bce(distill_logits, cfg.alpha * fm, pairs, batch.weights,
                                                             task_weights)}
    if adapter_logits is not None:
        losses["adapter"] = masked_weighted_bce(adapter_logits, batch.labels, pairs, batch.weights, task_weights)
        target = torch.sigmoid(adapter_logits).detach()
        losses["distill_adapter"] = cfg.adapter_weight * masked_weighted_bce(distill_logits, target, pairs,
                                                                             batch.weights, task_weights)
    return losses

"""The train task on a loader-shaped batch: logits per task, the masked importance-weighted loss,
and a few optimizer steps that lower it."""

from __future__ import annotations

import torch

from gem.model.task import masked_weighted_bce
from tests.support import tiny_batch, tiny_task


def test_loss_is_masked_and_weighted():
    logits = torch.tensor([[0.0, 5.0], [2.0, -1.0]])
    labels = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    mask = torch.tensor([[True, False], [True, True]])
    weights = torch.tensor([[1.0, 9.0], [3.0, 2.0]])
    bce = torch.nn.functional.binary_cross_entropy_with_logits
    t0 = (1 * bce(torch.tensor(0.0), torch.tensor(1.0)) + 3 * bce(torch.tensor(2.0), torch.tensor(0.0))) / 4
    t1 = bce(torch.tensor(-1.0), torch.tensor(1.0))  # the masked 5.0 logit (weight 9) is ignored
    got = masked_weighted_bce(logits, labels, mask, weights, torch.tensor([1.0, 0.5]))
    assert torch.allclose(got, t0 + 0.5 * t1)


def test_task_trains_on_a_loader_batch():
    task, batch = tiny_task(), tiny_batch()
    loss, logits = task(batch)
    assert logits.shape == (16, 4) and torch.isfinite(loss)
    opt = torch.optim.Adam(task.parameters(), lr=3e-3)
    first = float(loss.detach())
    for _ in range(30):
        opt.zero_grad()
        loss, _ = task(batch)
        loss.backward()
        opt.step()
    assert float(loss.detach()) < 0.5 * first


def test_heads_start_at_the_base_rate():
    """A fresh task predicts exactly its base rate for every example (NE 1 at step 0): no random
    initial direction over the body's features, which a task with few positives never unlearns."""
    task = tiny_task()
    task.heads.init_from_base_rates({"reels/click": 0.02, "fb_feed/lead": 0.001})
    with torch.no_grad():
        p = torch.sigmoid(task.logits(tiny_batch()))
    assert torch.allclose(p[:, 0], torch.full_like(p[:, 0], 0.02)) and torch.allclose(p[:, 3], torch.full_like(p[:, 3], 0.001))
    assert torch.allclose(p[:, 1], torch.full_like(p[:, 1], 0.5))  # no rate given: unchanged

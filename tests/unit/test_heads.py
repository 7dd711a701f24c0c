"""DomainExpertHeads: the towers applied to each expert's output, then mixed by the gates, give the
logits of the definition (each task's gated mixture of experts, then its tower), in values and
gradients; and the heads start at their base rates."""

from __future__ import annotations

import pytest
import torch

from gem.model.heads import DomainExpertHeads, shrunk_base_rates
from tests.support import ON_DEVICES

TASKS = ("fb_feed/click", "fb_feed/lead", "reels/click", "stories/app_install", "reels/lead")


def _definition(heads: DomainExpertHeads, x: torch.Tensor) -> torch.Tensor:
    """The mixture of [own surface expert, shared experts] per task, then the task's tower."""
    b, tasks = x.shape[0], len(heads.tasks)
    surface_out = torch.stack([heads.surface_experts[s](x) for s in heads.surfaces], dim=1)  # (B, S, h)
    own = surface_out[:, heads.task_surface]  # (B, T, h)
    shared = torch.stack([e(x) for e in heads.shared], dim=1) if len(heads.shared) else x.new_zeros(b, 0, own.shape[-1])
    experts = torch.cat([own[:, :, None], shared[:, None].expand(-1, tasks, -1, -1)], dim=2)  # (B, T, 1 + M, h)
    gate = torch.softmax(heads.gates(x).view(b, tasks, -1), dim=-1)  # (B, T, 1 + M)
    mixed = (gate[..., None] * experts).sum(dim=2)  # (B, T, h)
    return (mixed * heads.towers).sum(-1) + heads.bias


@ON_DEVICES
@pytest.mark.parametrize("shared_experts", [0, 2])
def test_logits_and_gradients_equal_the_mixture_then_the_tower(shared_experts, device):
    torch.manual_seed(0)
    heads = DomainExpertHeads(12, TASKS, 8, shared_experts).double().to(device)
    with torch.no_grad():
        heads.towers.normal_()  # zero at init: give the towers something to carry
    x = torch.randn(6, 12, dtype=torch.float64).to(device).requires_grad_(True)
    fast, slow = heads(x), _definition(heads, x)
    torch.testing.assert_close(fast, slow, rtol=0, atol=1e-12)
    weights = torch.randn_like(fast)
    params = [x, *heads.parameters()]
    for a, b in zip(torch.autograd.grad((fast * weights).sum(), params, allow_unused=True),
                    torch.autograd.grad((slow * weights).sum(), params, allow_unused=True), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_heads_start_at_their_base_rates():
    heads = DomainExpertHeads(4, TASKS, 8, 2)
    heads.init_from_base_rates({"fb_feed/click": 0.02, "reels/lead": 0.001})
    p = torch.sigmoid(heads(torch.randn(3, 4)))
    torch.testing.assert_close(p[:, 0], torch.full((3,), 0.02))
    torch.testing.assert_close(p[:, 4], torch.full((3,), 0.001))
    torch.testing.assert_close(p[:, 1], torch.full((3,), 0.5))


def test_a_sparse_task_starts_near_its_label_types_pooled_rate_not_at_zero():
    """No positive in training must not mean a rate of 0 (the head's 1e-6 floor): one positive on the
    held-out day then costs ~14 nats. The rate shrinks toward the label type's pooled rate; a
    data-rich task keeps its own."""
    counts = {"audience_network/lead": (0.0, 8_000.0), "fb_feed/lead": (9.0, 30_000.0), "reels/lead": (10.0, 18_000.0),
              "fb_feed/click": (1_900.0, 30_000.0), "audience_network/click": (140.0, 8_000.0),
              "stories/app_install": (0.0, 12_000.0), "marketplace/app_install": (0.0, 0.0)}
    rates = shrunk_base_rates(counts)
    pooled_lead = (19 + 1) / (56_000 + 2)
    assert rates["audience_network/lead"] == pytest.approx(1 / (8_000 + 1 / pooled_lead))
    assert pooled_lead / 10 < rates["audience_network/lead"] < pooled_lead
    assert rates["fb_feed/lead"] == pytest.approx((9 + 1) / (30_000 + 56_002 / 20))
    assert rates["fb_feed/click"] == pytest.approx(1_900 / 30_000, rel=0.01)
    assert rates["audience_network/click"] == pytest.approx(140 / 8_000, rel=0.03)
    # A label type without any positive: about one in (all its examples), not 0.
    assert rates["stories/app_install"] == pytest.approx(1 / 24_002, rel=1e-6)
    assert "marketplace/app_install" not in rates  # no examples: nothing to start from


def test_the_study_starts_a_task_without_positives_above_the_floor():
    """gem.study.runner.base_rates (what the study's heads start from) on batches where one task has
    no positive: its rate is its label type's shrunk rate, not 0."""
    from gem.data.batch import Batch
    from gem.study.runner import base_rates

    tasks = ("fb_feed/lead", "reels/lead")
    labels = torch.zeros(400, 2)
    labels[:4, 0] = 1.0  # fb_feed/lead: 4 positives in 400; reels/lead: none
    batch = Batch(dense=torch.zeros(400, 1), sparse={}, sequences={}, labels=labels,
                  label_mask=torch.ones(400, 2, dtype=torch.bool), weights=torch.ones(400, 2), tasks=tasks,
                  impression_times=torch.zeros(400, dtype=torch.int64))
    rates = base_rates([batch])
    assert rates["reels/lead"] == pytest.approx(1 / (400 + 802 / 5))  # pooled (4 + 1) / (800 + 2)
    assert rates["fb_feed/lead"] == pytest.approx(5 / (400 + 802 / 5))

"""DomainExpertHeads: the towers applied to each expert's output, then mixed by the gates, give the
logits of the definition (each task's gated mixture of experts, then its tower), in values and
gradients; and the heads start at their base rates."""

from __future__ import annotations

import pytest
import torch

from gem.model.heads import DomainExpertHeads
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

"""Task heads with domain experts: one logit per task (surface, label type).

Each surface has its own expert MLP; a few shared experts serve every surface. Task t of surface s
mixes [expert_s, shared_1..M] with a softmax gate computed from the input, then a linear tower
gives its logit. So tasks of one surface share their surface's expert, and all tasks share the
shared experts in proportions they learn.

Shapes: x (B, in_dim) -> logits (B, T).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn


def shrunk_base_rates(counts: Mapping[str, tuple[float, float]]) -> dict[str, float]:
    """Per task "surface/label_type", (positives, examples) -> its base rate shrunk toward its label
    type's rate pooled over every surface, by one pseudo-positive at that pooled rate:

        rate_t = (positives_t + 1) / (examples_t + 1 / pooled),   pooled = (P + 1) / (N + 2)

    (P, N: the label type's positives and examples over all tasks). A sparse task's raw rate is
    mostly noise: with no positive in training it is 0, and its head would start at the 1e-6 floor,
    so one positive on the held-out day costs ~14 nats and the task's held-out NE lands far above 1.
    Data-rich tasks barely move (a click task's
    pseudo-count is a few dozen examples). Tasks with no examples are left out."""
    by_label: dict[str, list[float]] = {}
    for task, (positives, examples) in counts.items():
        pooled = by_label.setdefault(task.split("/")[-1], [0.0, 0.0])
        pooled[0] += positives
        pooled[1] += examples
    rates = {}
    for task, (positives, examples) in counts.items():
        if examples > 0:
            label_positives, label_examples = by_label[task.split("/")[-1]]
            pooled = (label_positives + 1) / (label_examples + 2)
            rates[task] = (positives + 1) / (examples + 1 / pooled)
    return rates


class DomainExpertHeads(nn.Module):
    def __init__(self, in_dim: int, tasks: tuple[str, ...], hidden: int, shared_experts: int) -> None:
        super().__init__()
        self.tasks = tasks
        self.surfaces = tuple(dict.fromkeys(t.split("/")[0] for t in tasks))

        def expert() -> nn.Module:
            return nn.Sequential(nn.Linear(in_dim, hidden), nn.GELU(), nn.Linear(hidden, hidden), nn.GELU())

        self.surface_experts = nn.ModuleDict({s: expert() for s in self.surfaces})
        self.shared = nn.ModuleList(expert() for _ in range(shared_experts))
        self.gates = nn.Linear(in_dim, len(tasks) * (1 + shared_experts))
        # Zero towers: every task starts at exactly its bias (the base rate, init_from_base_rates) and
        # its tower learns from its own labels. Random towers give each task a random initial
        # direction over the shared features, which a task with few positives (Audience Network's
        # clicks: under one per demo batch) never unlearns: its held-out AUC falls below 0.5.
        self.towers = nn.Parameter(torch.zeros(len(tasks), hidden))
        self.bias = nn.Parameter(torch.zeros(len(tasks)))
        self.task_surface = [self.surfaces.index(t.split("/")[0]) for t in tasks]
        # (surface of task t, t) for picking each task's own surface expert's tower output; not saved
        self.register_buffer("own_expert", torch.tensor([self.task_surface, list(range(len(tasks)))]),
                             persistent=False)

    @torch.no_grad()
    def init_from_base_rates(self, rates: dict[str, float]) -> None:
        """Start each task's logit at its base rate (logit(p)), not at p = 0.5: training then begins
        from the base-rate model (NE 1) instead of spending steps on the global offset. Callers pass
        shrunk_base_rates of the training examples' counts."""
        for j, task in enumerate(self.tasks):
            if task in rates:
                p = min(max(rates[task], 1e-6), 1 - 1e-6)
                self.bias[j] = torch.logit(torch.tensor(p))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Task t's logit: its tower applied to its gated mixture of experts. The tower is linear, so
        it is applied to each expert's output first and the gate mixes T scalars per expert: the
        same logits without the (B, T, 1 + M, h) block of mixtures (tests/unit/test_heads.py holds
        them to the mixture computed first)."""
        b, tasks = x.shape[0], len(self.tasks)
        surface_out = torch.stack([self.surface_experts[s](x) for s in self.surfaces], dim=1)  # (B, S, h)
        gate = torch.softmax(self.gates(x).view(b, tasks, -1), dim=-1)  # (B, T, 1 + M)
        by_surface = surface_out @ self.towers.T  # (B, S, T): every task's tower on every surface expert
        logits = gate[..., 0] * by_surface[:, self.own_expert[0], self.own_expert[1]]  # (B, T)
        if len(self.shared):
            shared_out = torch.stack([e(x) for e in self.shared], dim=1)  # (B, M, h)
            by_shared = (shared_out @ self.towers.T).transpose(1, 2)  # (B, T, M)
            logits = logits + (gate[..., 1:] * by_shared).sum(-1)  # (B, T)
        return logits + self.bias  # (B, T)

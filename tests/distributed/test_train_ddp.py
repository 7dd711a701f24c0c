"""Two-process data-parallel training on CPU (gloo): both ranks end with the same weights, equal to
one process stepping on the mean of the two ranks' losses; rank 0 writes the checkpoint.

The comparison uses SGD: its update is linear in the gradient, so float rounding of the all-reduce
stays at rounding size. (With Adam the same runs differ by far more: it divides by the root of
tiny second moments, which magnifies rounding; not a DDP fault.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gem.config import TrainConfig
from gem.train.trainer import Trainer
from tests.support import run_two_ranks, tiny_batch, tiny_task

STEPS = 3
LR = 0.1


class RankStream:
    def __init__(self, rank: int) -> None:
        self.rank, self.position = rank, 0

    def batches(self, limit=None):
        for _ in range(limit):
            yield tiny_batch(seed=100 * self.position + self.rank)
            self.position += 1

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]


def _worker(rank: int, init_file: str, out: str) -> None:
    torch.distributed.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        # train.lr, not the optimizer's own: the trainer sets each step's rate (gem.train.lr_schedule).
        trainer = Trainer(tiny_task(), RankStream(rank), TrainConfig(steps=STEPS, lr=LR, checkpoint_every=STEPS),
                          Path(out) / "ckpt")
        trainer.optimizer = torch.optim.SGD(trainer.task.parameters(), lr=LR)
        trainer.fit()
        torch.save(trainer.task.state_dict(), Path(out) / f"rank{rank}.pt")
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.slow
def test_two_rank_gloo_training_matches_the_mean_loss(tmp_path):
    r0, r1 = run_two_ranks(_worker, tmp_path)
    for name in r0:
        assert torch.equal(r0[name], r1[name]), name
    # One process, one optimizer, the mean of the two ranks' losses per step.
    task = tiny_task()
    opt = torch.optim.SGD(task.parameters(), lr=LR)
    for step in range(STEPS):
        opt.zero_grad()
        loss = (task(tiny_batch(seed=100 * step))[0] + task(tiny_batch(seed=100 * step + 1))[0]) / 2
        loss.backward()
        opt.step()
    for name, tensor in task.state_dict().items():
        assert torch.allclose(tensor, r0[name], atol=1e-6), name
    assert (tmp_path / "ckpt" / f"step-{STEPS:08d}" / "extra.json").is_file()

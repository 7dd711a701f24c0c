"""The dense learning-rate schedule: warmup ramps to train.lr, cosine ends at lr_min_ratio * lr, the
trainer applies it, and a killed and resumed run follows it exactly."""

from __future__ import annotations

import dataclasses
import itertools
import math
import shutil

import pytest

from gem.config import TrainConfig
from gem.train.lr_schedule import learning_rate
from tests.support import TINY_TRAIN, tiny_trainer

SCHEDULED = dataclasses.replace(TINY_TRAIN, lr_warmup_steps=3, lr_decay="cosine", lr_min_ratio=0.1)


def test_warmup_then_cosine_to_the_floor():
    rates = [learning_rate(SCHEDULED, s) for s in range(SCHEDULED.steps)]
    lr = SCHEDULED.lr
    assert rates[:3] == pytest.approx([lr / 3, 2 * lr / 3, lr])
    assert all(a >= b for a, b in itertools.pairwise(rates[2:]))  # non-increasing after warmup
    # The last step (index steps - 1) is one step short of the floor, reached at index `steps`.
    assert learning_rate(SCHEDULED, SCHEDULED.steps) == pytest.approx(0.1 * lr)
    assert rates[-1] > 0.1 * lr
    constant = dataclasses.replace(TINY_TRAIN, lr_warmup_steps=0)
    assert {learning_rate(constant, s) for s in range(10)} == {constant.lr}


def test_bad_schedule_is_refused():
    with pytest.raises(ValueError, match="lr_decay"):
        TrainConfig(lr_decay="linear")
    with pytest.raises(ValueError, match="lr_min_ratio"):
        TrainConfig(lr_min_ratio=1.5)


def test_trainer_applies_the_schedule_and_resumes_on_it(tmp_path):
    full = tiny_trainer(tmp_path / "full", cfg=SCHEDULED)
    result = full.fit()
    assert math.isclose(full.optimizer.param_groups[0]["lr"], learning_rate(SCHEDULED, SCHEDULED.steps - 1))
    constant = tiny_trainer(tmp_path / "constant").fit()
    assert result.losses[1] != constant.losses[1]  # step 1 already ran at lr / 3
    killed = tiny_trainer(tmp_path / "killed", cfg=SCHEDULED)
    killed.fit(steps=6)
    shutil.rmtree(tmp_path / "killed" / "step-00000006")  # resume from step 4
    resumed = tiny_trainer(tmp_path / "killed", cfg=SCHEDULED)
    assert resumed.resume() and resumed.step == 4
    assert resumed.fit().losses == result.losses

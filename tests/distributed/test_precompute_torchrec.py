"""A checkpoint trained with torchrec tables (sharded by the trainer's plan) loads into the plain-torch
model precompute runs (gem.precompute.model.load_plain_weights), weight for weight."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from gem.config import TrainConfig
from gem.precompute.model import load_plain_weights
from gem.train.trainer import Trainer
from tests.support import ListStream, tiny_task

pytest.importorskip("torchrec")


def test_a_torchrec_checkpoint_loads_into_the_plain_model(tmp_path: Path) -> None:
    torch.manual_seed(0)
    trainer = Trainer(tiny_task("torchrec"), ListStream(), TrainConfig(steps=3, lr=3e-3, checkpoint_every=3),
                      tmp_path / "run")
    try:
        result = trainer.fit()
        trained = trainer.plain_state()  # the trained weights gathered under the plain task's names
    finally:
        trainer.close()
    plain = tiny_task("torch")
    load_plain_weights(plain, result.checkpoint, "torchrec")
    loaded = plain.state_dict()
    assert set(loaded) == set(trained)
    for key, value in trained.items():
        torch.testing.assert_close(loaded[key], value, rtol=0, atol=0)
    fresh = tiny_task("torch").state_dict()["embeddings.tables.user_id.weight"]
    assert not torch.equal(loaded["embeddings.tables.user_id.weight"], fresh)  # the tables were trained

"""Each architecture learns the generator's traffic, and Kunlun uses the sequences.

Traffic from jobs.generate_events' world (gem/study/traffic.py), click tasks only: 2 days to train on, the
next day held out (40k impressions a day, 500 users, 50 ads, history weight 4). NE is the held-out cross-entropy over the base-rate model's (the held-out
day's click rate), so the base-rate model scores 1.0. Margins (thresholds every architecture
clears on this traffic, with room for run-to-run noise):
every architecture must reach NE <= 1 - LEARN_MARGIN on every surface's click task
with at least MIN_POSITIVES held-out positives (each task against its own base rate); Kunlun with the user's
histories must beat Kunlun with every history emptied by SEQUENCE_MARGIN (the generator's click
logit adds w * h_u . a, h_u the user's decayed clicked-ad vector, which only the histories reveal).
"""

from __future__ import annotations

import pytest
import torch

from gem.model.configs import (
    DLRMConfig,
    EmbeddingConfig,
    EventConfig,
    HSTUConfig,
    InterFormerConfig,
    KunlunConfig,
    ModelConfig,
    WukongConfig,
)
from gem.study import runner
from gem.study.traffic import batches, simulate

LEARN_MARGIN = 0.05
SEQUENCE_MARGIN = 0.01
MIN_POSITIVES = 200
DIM = 16
LENGTHS = {"impression": 32, "click": 16, "conversion": 4}


@pytest.fixture(scope="module")
def traffic():
    # 500 users and 50 ads, so 80k training impressions teach every id's embedding; the generator's
    # history weight raised from 1.5 to 4 so the planted sequence signal is measurable at this size.
    return simulate(days=3, impressions_per_day=40_000, users=500, ads=50, history_weight=4.0)


def _config(arch: str, pooling: str = "hsp") -> ModelConfig:
    events = {"impression": EventConfig(width=16, depth=2, window=16, max_len=LENGTHS["impression"]),
              "click": EventConfig(width=16, depth=2, window=8, max_len=LENGTHS["click"]),
              "conversion": EventConfig(width=8, activations=("silu",), depth=1, window=4, max_len=4)}
    return ModelConfig(
        arch=arch,
        kunlun=KunlunConfig(dim=DIM, mlp_hidden=32, events=events, pooling=pooling), hstu=HSTUConfig(dim=DIM, max_len=LENGTHS),
        interformer=InterFormerConfig(dim=DIM, max_len=LENGTHS), wukong=WukongConfig(dim=DIM, max_len=LENGTHS),
        dlrm=DLRMConfig(dim=DIM, dense_arch=(32, DIM), over_arch=(64, 32), max_len=LENGTHS),
        embeddings=EmbeddingConfig(dim=DIM, buckets={"user_id": 4_096, "ad_id": 512, "surface": 8, "position": 16}),
    )


_SCORES: dict[tuple[str, bool, str], tuple[float, dict[str, float]]] = {}


def train_and_score(traffic, arch: str, sequences: bool = True, epochs: int = 2,
                    pooling: str = "hsp") -> tuple[float, dict[str, float]]:
    """Train on days 0-1, score day 2 -> (pooled NE, {task: NE} for tasks with enough positives).
    Memoized per (arch, sequences, Kunlun's pooling): the module's traffic is fixed, training is seeded."""
    if (arch, sequences, pooling) not in _SCORES:
        _SCORES[arch, sequences, pooling] = _train_and_score(traffic, arch, sequences, epochs, pooling)
    return _SCORES[arch, sequences, pooling]


def _train_and_score(traffic, arch: str, sequences: bool, epochs: int, pooling: str) -> tuple[float, dict[str, float]]:
    # The pipeline's loop and scorer: gem.study.runner.run trains through gem.train's Trainer and
    # scores with gem.train.evaluate.
    train = batches(traffic, (0, 1), 256, LENGTHS, sequences=sequences, seed=1, label_types=("click",))
    held_out = batches(traffic, (2,), 2048, LENGTHS, sequences=sequences, shuffle=False, label_types=("click",))
    result = runner.run(_config(arch, pooling), train, {"held_out": held_out}, lr=3e-3, seed=0, epochs=epochs,
                        device=torch.device("cpu"), bf16=False)
    scores = result.scores["held_out"]
    per_task = {name: scores.ne((name,)) for name in scores.tasks if scores.positives(name) >= MIN_POSITIVES}
    return scores.ne(scores.tasks), per_task


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["kunlun", "hstu", "interformer", "wukong", "dlrm"])
def test_each_architecture_learns_the_held_out_day(traffic, arch):
    pooled, per_task = train_and_score(traffic, arch)
    print(f"{arch}: held-out NE pooled {pooled:.4f}, per task {per_task}")
    assert per_task and all(ne <= 1 - LEARN_MARGIN for ne in per_task.values()), (arch, per_task)


# On this traffic HSP (GDPA seed pooling, scale 1/max_len) takes a small fraction of the sequence
# gain mean pooling takes: the open defect behind Kunlun trailing DLRM (mean-pooled history bags)
# here. Normalizing HSP by each sequence's length or seeds at unit scale close only part of it.
@pytest.mark.slow
@pytest.mark.parametrize("pooling", [
    "mean",
    pytest.param("hsp", marks=pytest.mark.xfail(strict=True, reason="HSP gains 0.003 NE from the histories, "
                                                   "mean pooling 0.035 (module comment): not fixed yet")),
])
def test_kunlun_with_sequences_beats_kunlun_without(traffic, pooling):
    with_seq, _ = train_and_score(traffic, "kunlun", sequences=True, pooling=pooling)
    without, _ = train_and_score(traffic, "kunlun", sequences=False, pooling=pooling)
    print(f"kunlun ({pooling}) held-out NE: with sequences {with_seq:.4f}, without {without:.4f}")
    assert with_seq <= without - SEQUENCE_MARGIN, (with_seq, without)

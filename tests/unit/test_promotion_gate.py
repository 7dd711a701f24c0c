"""The promotion gate (gem.train.gate) and `gem promote`: a model trained with a learning rate that
diverges (set through the config) is refused, the promoted model stays, and precompute and the next
warm start read the promoted one; a surface's student is gated the same way against the promoted
student; `gem promote` overrides the refusal and rolls back, each recorded with who, why and the
figures. The models are the tiny ones of tests/unit/test_promotion.py (and a tiny student), on
batches whose labels follow a dense feature, so a sane run beats the base rate in ten steps."""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from typer.testing import CliRunner

from gem.config import GemConfig, PromotionConfig, TrainConfig
from gem.data.batch import Batch
from gem.distill.run import promotion_name
from gem.model.student import build_student
from gem.pipeline.command import app
from gem.precompute.plan import choose_model
from gem.report.run_report import promotion_rows
from gem.train import gate, promotion
from gem.train.evaluate import Predictions
from gem.train.promotion import checkpoint_root
from gem.train.trainer import CyclingStream, Trainer
from jobs.status import promotion_lines
from tests.support import STUDENT_TASKS, TINY_SPARSE, TINY_TASKS, make_config, student_batch, tiny_batch, tiny_task

ARCH = "kunlun"
DAY1, DAY2, DAY3 = "2026-01-02", "2026-01-03", "2026-01-04"


def learnable(batch: Batch, seed: int) -> Batch:
    """`batch` with labels that follow its first dense feature (plus noise), about a third positive."""
    noise = torch.randn(batch.size, 1, generator=torch.Generator().manual_seed(seed + 500))
    labels = ((batch.dense[:, :1] + 0.5 * noise) > 0.6).float().expand_as(batch.labels) * batch.label_mask
    return dataclasses.replace(batch, labels=labels)


def train_and_gate(root: Path, name: str, ds: str, train: TrainConfig, settings: PromotionConfig,
                   build: Callable[[tuple[str, ...]], torch.nn.Module], tasks: tuple[str, ...],
                   make_batch: Callable[[int], Batch]) -> promotion.Decision:
    """What gem.train.daily.run (and gem.distill.run per surface) does for day ds, on a tiny model:
    warm start from the promotion before ds, train, score beside the promoted model (day 100+ batches
    held out), gate."""
    previous = promotion.warm_start_for(root, name, ds)
    torch.manual_seed(0)
    batches = [learnable(make_batch(i), i) for i in range(8)]
    trainer = Trainer(build(tasks), CyclingStream(batches), train, root / f"{name}-{ds}")
    if previous is not None:
        trainer.warm_start(previous.checkpoint)
    result = trainer.fit()
    held_out = [learnable(make_batch(100 + i), 100 + i) for i in range(8)]  # ~115 positives per task
    paired = gate.score_pair(held_out, trainer.task, gate.incumbent_task(previous, build, "torch"))
    candidate = promotion.Promotion(name, ds, result.checkpoint, result.steps, tasks, ds)
    return gate.decide(root, candidate, paired, settings, by="test")


def two_days(cfg: GemConfig, diverging: GemConfig, name: str, train: Callable[[GemConfig], TrainConfig],
             build: Callable[[tuple[str, ...]], torch.nn.Module], tasks: tuple[str, ...],
             make_batch: Callable[[int], Batch]) -> tuple[promotion.Decision, promotion.Decision]:
    """Day 1 trained with `cfg`, day 2 with `diverging` (its learning rate, from the config)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny models: more threads only add overhead
    try:
        return tuple(train_and_gate(checkpoint_root(c), name, ds, train(c), c.promotion, build, tasks, make_batch)
                     for c, ds in ((cfg, DAY1), (diverging, DAY2)))
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def days(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The foundation model: day 1 trains sanely and is promoted; day 2's learning rate diverges."""
    tmp = tmp_path_factory.mktemp("gate")
    settings = {"start_ds": "2026-01-01", "promotion": {"min_positives": 50, "ne_tolerance": 0.01}}
    sane = make_config(tmp, train={"steps": 10, "lr": 1e-2, "checkpoint_every": 10}, **settings)
    diverging = make_config(tmp, train={"steps": 10, "lr": 0.3, "checkpoint_every": 10}, **settings)
    first, second = two_days(sane, diverging, ARCH, lambda c: c.train, lambda heads: tiny_task(), TINY_TASKS,
                             lambda seed: tiny_batch(64, seed))
    return {"cfg": sane, "first": first, "second": second}


def test_a_diverged_model_is_refused_and_everything_downstream_reads_the_promoted_one(days: dict[str, Any]) -> None:
    cfg, first, second = days["cfg"], days["first"], days["second"]
    root = checkpoint_root(cfg)
    # The first day has no promoted model: each label type's pooled NE must beat the base rate.
    assert first.promoted and first.against is None
    assert [(f.label, f.tasks) for f in first.figures] == [
        ("click", ("reels/click", "fb_feed/click")), ("lead", ("reels/lead", "fb_feed/lead"))]
    assert all(f.candidate_ne < 1 and f.promoted_ne is None for f in first.figures)
    # Day 2 is scored beside day 1's model on the same examples: day 1's own figures, to the digit.
    assert not second.promoted and second.against == first.model.version
    for f, before in zip(second.figures, first.figures, strict=True):
        assert f.promoted_ne == pytest.approx(before.candidate_ne, abs=1e-9)
        assert f.candidate_ne > f.promoted_ne + cfg.promotion.ne_tolerance and not f.passed
    # Nothing moved: day 1's model is current, serves day 2 and warm-starts day 3.
    assert promotion.of_day(root, ARCH, DAY2) is None
    assert promotion.current(root, ARCH).checkpoint == first.model.checkpoint
    assert promotion.warm_start_for(root, ARCH, DAY3).checkpoint == first.model.checkpoint
    pin, _ = choose_model(cfg, DAY2)  # precompute's refresh on day 2 (the students read its outputs)
    assert (pin.checkpoint, pin.model_ds) == (str(first.model.checkpoint), DAY1)
    # The refusal is kept with both figures, and says so in the log line and in `gem status`.
    (kept,) = promotion.decisions(root, ARCH, DAY2)
    assert kept == second and kept.model.checkpoint == second.model.checkpoint
    assert f"{ARCH}@{DAY2}:step10 not promoted: click NE {second.figures[0].candidate_ne:.4f} vs promoted " \
           f"{second.figures[0].promoted_ne:.4f}" in second.summary()
    assert f"{ARCH}@{DAY1}:step10 stays in use" in second.summary()
    lines = promotion_lines(cfg, [DAY1, DAY2])
    assert lines[1].split() == [ARCH, f"{ARCH}@{DAY1}:step10"]
    assert lines[2].strip() == second.summary()  # the gate's promotion of day 1 is no news: not listed
    rows, notes = promotion_rows(cfg, [DAY1, DAY2])  # the run report's Promotion section
    assert [(r["day"], r["decision"], r["label"], r["NE"], r["promoted NE"]) for r in rows] == [
        (DAY1, "promoted", f.label, f.candidate_ne, None) for f in first.figures] + [
        (DAY2, "NOT promoted", f.label, f.candidate_ne, f.promoted_ne) for f in second.figures]
    assert notes == [second.summary()]


def test_gem_promote_overrides_a_refusal_and_rolls_back(days: dict[str, Any], tmp_path: Path) -> None:
    lake = tmp_path / "lakehouse"
    shutil.copytree(Path(days["cfg"].lakehouse_uri), lake)  # pointers are relative: the copy stands alone
    config = tmp_path / "gem.yaml"
    config.write_text(yaml.safe_dump({"lakehouse_uri": str(lake), "start_ds": "2026-01-01"}))
    root, first, second = lake / "_checkpoints", days["first"], days["second"]

    def gem_promote(*args: str) -> Any:
        return CliRunner().invoke(app, ["promote", *args, "--config", str(config)])

    assert gem_promote("--ds", DAY2).exit_code == 2  # --reason is required
    refused = gem_promote("--ds", DAY1, "--reason", "x")
    assert refused.exit_code == 1 and f"the gate promoted {first.model.version} for {DAY1}" in refused.output
    done = gem_promote("--ds", DAY2, "--reason", "the click drop is a logging change", "--by", "ana")
    assert done.exit_code == 0, done.output
    promoted = promotion.of_day(root, ARCH, DAY2)
    assert promoted.checkpoint == root / second.model.checkpoint.relative_to(checkpoint_root(days["cfg"]))
    assert promotion.current(root, ARCH) == promoted
    record = promoted.decision
    assert (record["how"], record["by"], record["reason"]) == ("override", "ana", "the click drop is a logging change")
    assert [f["candidate_ne"] for f in record["figures"]] == [f.candidate_ne for f in second.figures]
    assert [f["promoted_ne"] for f in record["figures"]] == [f.promoted_ne for f in second.figures]
    # Roll back: day 1's model becomes day 2's, recorded as a promotion of its own.
    assert gem_promote("--ds", DAY1, "--from-ds", DAY2, "--reason", "x").exit_code == 1  # a later model: refused
    back = gem_promote("--ds", DAY2, "--from-ds", DAY1, "--reason", "the override was wrong", "--by", "ana")
    assert back.exit_code == 0, back.output
    rolled = promotion.current(root, ARCH)
    assert rolled.mix_ds == DAY2 and rolled.checkpoint.name == first.model.checkpoint.name
    assert rolled.checkpoint.parent.name == f"{ARCH}-{DAY1}" and rolled.trained_through == DAY1
    assert (rolled.decision["how"], rolled.decision["reason"]) == ("rollback", "the override was wrong")
    assert [d.how for d in promotion.decisions(root, ARCH, DAY2)] == ["gate", "override", "rollback"]
    assert f"rolled back to {first.model.version} by ana" in back.output
    assert f"replaces {ARCH}@{DAY2}:step10" in back.output
    assert gem_promote("--ds", DAY2, "--model", "hstu", "--reason", "x").exit_code == 2  # no such model


def test_students_are_gated_the_same_way_against_the_promoted_student(tmp_path: Path) -> None:
    settings = {"promotion": {"min_positives": 50}}
    sane = make_config(tmp_path, student_train={"steps": 10, "lr": 1e-2, "checkpoint_every": 10}, **settings)
    diverging = make_config(tmp_path, student_train={"steps": 10, "lr": 0.3, "checkpoint_every": 10}, **settings)
    name = promotion_name(sane.student.variant, "reels")
    first, second = two_days(sane, diverging, name, lambda c: c.student_train,
                             lambda heads: build_student(sane.student, heads, TINY_SPARSE, 6, 8), STUDENT_TASKS,
                             lambda seed: student_batch(64, seed))
    assert first.promoted and all(f.candidate_ne < 1 for f in first.figures)
    assert not second.promoted and second.against == first.model.version
    # The promoted student, read back from its checkpoint, scores exactly what it scored as a candidate.
    assert [f.promoted_ne for f in second.figures] == pytest.approx([f.candidate_ne for f in first.figures], abs=1e-9)
    assert promotion.warm_start_for(checkpoint_root(sane), name, DAY3).checkpoint == first.model.checkpoint


def _pairs(candidate: list[float], promoted: list[float], labels: list[float], task: list[int]) -> gate.Paired:
    tasks = ("reels/click", "fb_feed/click")
    t = torch.tensor(task)
    y, w = torch.tensor(labels, dtype=torch.float64), torch.ones(len(labels), dtype=torch.float64)
    make = lambda p: Predictions(torch.tensor(p, dtype=torch.float64), y, w, t, tasks)
    incumbent = gate.Incumbent(promotion.Promotion(ARCH, DAY1, "", 1, tasks), torch.nn.Linear(1, 1))
    return gate.Paired(make(candidate), make(promoted), incumbent)


def test_tasks_below_the_minimum_do_not_vote_and_the_tolerance_is_absolute() -> None:
    # reels/click: 3 positives of 6; fb_feed/click: 1 positive of 2.
    labels, task = [1, 1, 1, 0, 0, 0, 1, 0], [0, 0, 0, 0, 0, 0, 1, 1]
    good = [0.8, 0.8, 0.8, 0.2, 0.2, 0.2, 0.6, 0.4]
    paired = _pairs(good, good, labels, task)
    (votes,), silent = gate.judge(paired, PromotionConfig(min_positives=2, ne_tolerance=0.0))
    assert votes.tasks == ("reels/click",) and silent == ("fb_feed/click",) and votes.positives == 3
    assert votes.passed and votes.candidate_ne == votes.promoted_ne  # equal is no worse
    worse = [0.7, 0.7, 0.7, 0.3, 0.3, 0.3, 0.6, 0.4]
    (votes,), _ = gate.judge(_pairs(worse, good, labels, task), PromotionConfig(min_positives=2, ne_tolerance=0.0))
    assert not votes.passed
    gap = votes.candidate_ne - votes.promoted_ne
    (votes,), _ = gate.judge(_pairs(worse, good, labels, task), PromotionConfig(min_positives=2, ne_tolerance=gap + 1e-9))
    assert votes.passed
    assert gate.judge(paired, PromotionConfig(min_positives=4)) == ((), ("reels/click", "fb_feed/click"))

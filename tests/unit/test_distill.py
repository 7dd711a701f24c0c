"""The students' training window and the transfer report's page, without Spark: a student trains on
every FM-predicted day of student_train.days before the held-out one (the newest always), for
steps or passes; the window is bounded by the config; the transfer page gives each surface's FM
gain, whether TR can be read there, and the steps and examples every arm trained on."""

from __future__ import annotations

from pathlib import Path

import pytest

from gem.config import ConfigError, load_config
from gem.distill import transfer
from gem.distill.leakage import FmModel
from gem.distill.run import DistillInputs, StudentRun, training_days

D1, D2, D3, D4, D5 = (f"2026-01-0{i}" for i in range(1, 6))


def test_a_student_trains_on_the_predicted_days_of_its_window() -> None:
    predicted = {D2, D3, D4}
    assert training_days(D4, 1, predicted) == (D4,)
    assert training_days(D4, 2, predicted) == (D3, D4)
    assert training_days(D4, 7, predicted) == (D2, D3, D4)  # no older day was predicted: the window holds 3
    assert training_days(D5, 3, {D3, D5}) == (D3, D5)  # D4 was not predicted (no precompute): skipped
    assert training_days(D5, 3, set()) == (D5,)  # the newest always (leakage.check names it if unpredicted)


def test_the_window_length_and_baseline_are_configured_and_bounded() -> None:
    cfg = load_config(environ={"GEM__STUDENT_TRAIN__DAYS": "3", "GEM__STUDENT_TRAIN__BASELINE": "false",
                               "GEM__STUDENT_TRAIN__PASSES": "2.5"})
    assert (cfg.student_train.days, cfg.student_train.baseline, cfg.student_train.passes) == (3, False, 2.5)
    # A section that sets some fields keeps the students' own defaults for the others.
    assert (cfg.student_train.steps, cfg.student_train.lr, cfg.student_train.checkpoint_every) == (60, 3e-3, 60)
    assert load_config(environ={}).student_train.days == 7
    assert (cfg.student_train.length(), load_config(environ={}).student_train.length()) == ("2.5 passes", "60 steps")
    with pytest.raises(ConfigError, match="student_train.passes"):
        load_config(overrides={"student_train": {"passes": -1}}, environ={})
    with pytest.raises(ConfigError, match="student_train.days=31 must be at most training_horizon_days=30"):
        load_config(overrides={"student_train": {"days": 31}}, environ={})
    with pytest.raises(ConfigError, match="student_train.days"):
        load_config(overrides={"student_train": {"days": 0}}, environ={})


def _run(surface: str, arm: str, ne: float) -> StudentRun:
    score = {"ne": ne, "auc": 0.7}
    return StudentRun(surface, arm, {f"{surface}/click": score}, {f"{surface}/click": {"ne": 0.9}}, steps=40,
                      examples=40 * 512, seconds=1.0, checkpoint=None, train_rows=6_000)


def _result(surface: str, baseline: float, kd: float, loop: float) -> transfer.SurfaceResult:
    nes = {"baseline": baseline, "kd": kd, "kd_adapter": kd, "kd_loopfm": loop}
    runs = {arm: [_run(surface, arm, ne + 0.002 * seed) for seed in range(3)] for arm, ne in nes.items()}
    return transfer.SurfaceResult(surface, f"{surface}/click", runs, fm_ne=0.9)


def test_the_transfer_page_says_where_tr_reads_and_what_each_arm_trained_on(tmp_path: Path) -> None:
    cfg = load_config(overrides={"lakehouse_uri": str(tmp_path / "lake")}, environ={})
    inputs = DistillInputs(train_days=(D2, D3), eval_day=D4, examples=("", 0), sequences=("", 0),
                           predictions_version=0, codes_version=0, code_days=(), counters_start_ds=D1,
                           fm_models={D4: FmModel(D4, D4, "kunlun@2026-01-04:step120", D4, D3)})
    results = [_result("reels", baseline=0.99, kd=0.97, loop=0.95), _result("fb_feed", baseline=0.91, kd=0.905, loop=0.9)]
    assert results[0].fm_gain() == pytest.approx(0.092) and results[1].fm_gain() == pytest.approx(0.012)
    assert results[0].tr_of_means("kd_loopfm") == pytest.approx((0.992 - 0.952) / (0.992 - 0.9))  # seed means
    index = transfer.write_report(cfg, D4, inputs, results, 3, None)
    page = Path(index).read_text()
    assert f"students trained on {D2}..{D3} (2 FM-predicted days), scored on {D4}" in page
    assert page.count("6,000 examples of 2 days") == 2  # every arm of each surface on the same rows
    # Steps and examples trained on (40 steps of 512: passes over 6,000 rows repeat) of every arm.
    assert page.count('<td class="num">40</td><td class="num">20480</td>') == 8
    assert "<td>reels</td><td>+0.092</td>" in page and "<td>fb_feed</td><td>+0.012</td>" in page
    assert page.count("FM gain below 0.03: not readable") == 3  # fb_feed's three arms; reels' TR reads
    # The verdict reads the surfaces where TR does: reels alone, TR(+KD+LoopFM) / TR(+KD) = 2.
    assert "over the 1 of 2 surfaces whose FM gain is at least 0.03" in page
    assert "+KD 0.217, +KD+LoopFM 0.435 (ratio 2.00)" in page

"""The distill stage (gem.distill, jobs.distill) on the precompute tests' small real Delta lakehouse:
day 2's model promoted (trained through day 1), precompute run on days 2 and 3, then the students of
day 3 (and the no-FM baseline beside each) trained on day 2 and scored on day 3 with real torch training.

What is checked: the stage skips until an FM-predicted day precedes the held-out one; it writes one
gold.metrics row per (surface, task) for the student, the baseline and the FM's logged predictions, the latter
equal to NE computed by hand from gold.fm_predictions and the labels; it promotes each surface's
student with what it trained through; a rerun replaces its rows; the loader hands an example only
the FM codes logged strictly before it; and a model that trained on a day it would serve is refused.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pytest

from gem import storage
from gem.data.delta_log import read_table
from gem.data.loader import ResumableLoader
from gem.distill import leakage
from gem.distill.data import StudentStream
from gem.distill.run import FM_ARCH, plan_inputs, promotion_name, student_arch, surface_tasks
from gem.distill.run import run as distill
from gem.lakehouse import completions, tables
from gem.lakehouse.commit import StageCommit, StageContext
from gem.precompute.run import run as precompute
from gem.train import promotion
from gem.train.daily import checkpoint_root
from schemas.examples import SILVER_TRAINING_EXAMPLES
from schemas.metrics import GOLD_METRICS
from schemas.precompute import GOLD_FM_HISTORY_CODES, GOLD_FM_PREDICTIONS
from tests.precompute_lakehouse import build_days, precompute_config, promote_model, publish_training_records

# Precompute runs its shard tasks on the suite's local Spark session.
pytestmark = pytest.mark.usefixtures("spark")

if TYPE_CHECKING:
    from gem.config import GemConfig


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    cfg = precompute_config(tmp_path_factory.mktemp("distill"))
    cfg = cfg.replace(student_train={**dataclasses.asdict(cfg.student_train), "days": 2})
    _, days = build_days(cfg, 3, users=60)
    promote_model(cfg, days[1])
    publish_training_records(cfg, days[2])
    skipped = None
    for ds in days[1:]:
        precompute(StageContext(cfg), ds)
        if ds == days[1]:
            skipped = distill(StageContext(cfg), ds)  # no FM-predicted day before day 2's held-out day
    result = distill(StageContext(cfg), days[2])
    return {"cfg": cfg, "days": days, "skipped": skipped, "result": result}


def metrics(cfg: GemConfig, ds: str) -> list[dict]:
    return read_table(tables.table_path(cfg, GOLD_METRICS), where={"ds": ds}).to_pylist()


def test_the_stage_skips_until_a_predicted_day_precedes_the_held_out_day(lake: dict[str, Any]) -> None:
    cfg, (_, day2, day3) = lake["cfg"], lake["days"]
    assert not lake["skipped"].published
    assert completions.completion(cfg, "distill", day2) is None
    assert completions.completion(cfg, "distill", day3) is not None
    assert (lake["result"].details["train_day"], lake["result"].details["eval_day"]) == (day2, day3)
    # Day 1 was never predicted (no model preceded it): the window of 2 days holds day 2 alone.
    assert lake["cfg"].student_train.days == 2 and lake["result"].details["train_days"] == [day2]


def test_one_row_per_surface_and_task_for_the_student_and_the_fm(lake: dict[str, Any]) -> None:
    cfg, day3 = lake["cfg"], lake["days"][2]
    rows = metrics(cfg, day3)
    surfaces = sorted(lake["result"].details["surfaces"])
    assert surfaces == ["fb_feed", "reels"]  # the surfaces the small lakehouse has examples on
    expected = sorted(t for s in surfaces for t in surface_tasks(cfg, s))
    for arch in (student_arch(cfg.student.variant), student_arch("baseline"), FM_ARCH):
        assert sorted(r["task"] for r in rows if r["arch"] == arch) == expected
    assert lake["result"].record["rows_written"] == 3 * len(expected)
    for surface, ran in lake["result"].details["surfaces"].items():
        # The configured steps run whole, over more than one pass of the surface's small day.
        assert ran["steps"] == cfg.student_train.steps == 3 and ran["examples"] > ran["train_rows"] > 0
        assert sorted(ran["baseline_ne"]) == sorted(surface_tasks(cfg, surface))
    first = {r["arch"]: r for r in rows if r["task"] == "reels/click"}
    assert first[student_arch("baseline")]["examples"] == first[FM_ARCH]["examples"]  # the same held-out rows


def test_fm_rows_are_the_logged_predictions_scored_by_hand(lake: dict[str, Any]) -> None:
    """NE = weighted BCE / BCE of the base rate, from gold.fm_predictions and the day's click labels."""
    cfg, day3 = lake["cfg"], lake["days"][2]
    predictions = read_table(tables.table_path(cfg, GOLD_FM_PREDICTIONS), where={"ds": day3}).to_pylist()
    labels = {r["impression_id"]: r["label_click"] for r in read_table(
        tables.table_path(cfg, SILVER_TRAINING_EXAMPLES), where={"ds": day3},
        columns=["impression_id", "label_click"]).to_pylist()}
    fm = {r["task"]: r for r in metrics(cfg, day3) if r["arch"] == FM_ARCH}
    for surface in ("fb_feed", "reels"):
        rows = [r for r in predictions if r["surface"] == surface]
        p = np.clip(np.array([dict(r["predictions"])[f"{surface}/click"] for r in rows]), 1e-7, 1 - 1e-7)
        y = np.array([labels[r["impression_id"]] for r in rows], dtype=np.float64)
        rate = y.mean()
        bce = -np.mean(y * np.log(p) + (1 - y) * np.log(1 - p))
        base = -(rate * math.log(rate) + (1 - rate) * math.log(1 - rate))
        assert fm[f"{surface}/click"]["examples"] == len(rows)
        assert fm[f"{surface}/click"]["ne"] == pytest.approx(bce / base, rel=1e-4)


def test_each_surface_student_is_promoted_with_what_it_trained_through(lake: dict[str, Any]) -> None:
    cfg, (_, day2, day3) = lake["cfg"], lake["days"]
    root = checkpoint_root(cfg)
    for surface in ("fb_feed", "reels"):
        promoted = promotion.of_day(root, promotion_name(cfg.student.variant, surface), day3)
        assert promoted is not None and promoted.trained_through == day2
        assert promoted.tasks == surface_tasks(cfg, surface)
        assert promoted.checkpoint.is_dir()
    # The FM outputs it read were computed by a model trained through day 1, before both days.
    assert lake["result"].details["fm_trained_through"] == {day2: lake["days"][0], day3: lake["days"][0]}


def test_codes_reach_an_example_only_from_before_its_impression(lake: dict[str, Any]) -> None:
    cfg, day3 = lake["cfg"], lake["days"][2]
    commit = StageCommit.begin(StageContext(cfg), "distill", day3)
    try:
        inputs = plan_inputs(commit)
    finally:
        for held in commit.leases:
            held.release()
    tasks = surface_tasks(cfg, "reels")
    signals = inputs.signals(cfg, tasks, [inputs.train_day, inputs.eval_day])
    manifest = inputs.manifest("reels", tasks, inputs.eval_day, "eval", 0)
    coded_today = read_table(tables.table_path(cfg, GOLD_FM_HISTORY_CODES), where={"ds": day3},
                             columns=["impression_id"]).num_rows
    assert coded_today > 0
    seen = 0
    for batch in ResumableLoader(StudentStream(manifest, tasks, cfg.loader, signals, 0, 1)).epoch():
        history = batch.fm_history_codes
        assert history is not None and batch.fm_prediction_mask is not None
        assert batch.fm_prediction_mask[:, tasks.index("reels/click")].all()  # every held-out impression scored
        for i in range(batch.labels.shape[0]):
            lo, hi = int(history.offsets[i]), int(history.offsets[i + 1])
            times = history.values["time_us"][lo:hi]
            assert (times < batch.impression_times[i]).all()  # strictly before: never its own code
            seen += hi - lo
    assert seen > 0  # earlier impressions of the same users on the same day are coded


def test_a_model_that_trained_on_the_day_it_serves_is_refused(lake: dict[str, Any], tmp_path: Path) -> None:
    cfg, (_, day2, day3) = lake["cfg"], lake["days"]
    root = checkpoint_root(cfg)
    honest = promotion.of_day(root, cfg.model.arch, day2)
    assert honest is not None
    promotion.promote(root, cfg.model.arch, day2, honest.checkpoint, honest.step, honest.tasks, trained_through=day2)
    try:
        with pytest.raises(leakage.LeakageError, match=f"outputs of {day2} come from kunlun@{day2}"):
            distill(StageContext(cfg), day3)
        assert completions.completion(cfg, "distill", day3) is None  # withdrawn, not republished
    finally:
        promotion.promote(root, cfg.model.arch, day2, honest.checkpoint, honest.step, honest.tasks,
                          trained_through=honest.trained_through)
    rerun = distill(StageContext(cfg), day3)  # and a rerun replaces the day's rows, one set per arch
    rows = metrics(cfg, day3)
    assert len(rows) == rerun.record["rows_written"] == lake["result"].record["rows_written"]


def test_the_transfer_report_compares_every_arm_over_seeds_and_renders(lake: dict[str, Any], tmp_path: Path) -> None:
    """Three seeds of every arm per surface, from scratch; the page shows TR per arm with intervals,
    the FM's NE, the LoopFM claim's verdict, and its figures load in headless Chromium. It leaves
    the stage's record and promotions as they were."""
    from gem.distill import transfer
    from tests.browser import render

    cfg, day3 = lake["cfg"], lake["days"][2]
    record = completions.completion(cfg, "distill", day3)
    inputs = transfer.read_inputs(cfg, day3)
    results = transfer.run_arms(cfg, inputs, seeds=3, steps=2, workdir=tmp_path, progress=lambda _: None)
    assert [r.surface for r in results] == ["fb_feed", "reels"]
    for res in results:
        assert {arm: len(runs) for arm, runs in res.runs.items()} == {arm: 3 for arm in transfer.ARMS}
        seeds = res.ne("baseline")
        assert len(set(seeds)) > 1  # seeds differ: the intervals are over real variation
        fm_rows = {r["task"]: r for r in metrics(cfg, day3) if r["arch"] == FM_ARCH}
        assert res.fm_ne == pytest.approx(fm_rows[res.task]["ne"])  # the stage's own FM score
    index = transfer.write_report(cfg, day3, inputs, results, 3, transfer.history_code_bytes(cfg, day3))
    assert index == storage.join(transfer.report_dir(cfg, day3), "index.html")
    page = render(Path(index))
    assert page.title == "Knowledge transfer from the foundation model"
    for text in ("Transfer ratio", "+KD+LoopFM", "FM (logged predictions)", "LoopFM bytes per user per day",
                 "LoopFM about doubles the transfer ratio of KD alone"):
        assert text in page.text
    assert [img.src for img in page.images] == ["img/ne-fb_feed.png", "img/ne-reels.png"]
    assert all(img.loaded for img in page.images), page.images
    assert completions.completion(cfg, "distill", day3) == record

"""gem.train.evaluate: figures per task, per label type pooled over the surfaces, and the printed
table's refusal to read a task with too few positives."""

from __future__ import annotations

import torch

from gem.model import metrics
from gem.train.evaluate import Predictions, metrics_table, per_task, pooled


def _predictions() -> Predictions:
    g = torch.Generator().manual_seed(0)
    tasks = ("reels/click", "fb_feed/click", "reels/lead")
    task = torch.randint(0, 3, (3000,), generator=g)
    pred = torch.rand(3000, generator=g, dtype=torch.float64) * 0.5
    label = (torch.rand(3000, generator=g, dtype=torch.float64) < pred).double()
    weight = torch.where(task == 1, 2.0, 1.0).double()  # fb_feed's pairs drawn at rate 1/2
    return Predictions(pred, label, weight, task, tasks)


def test_a_label_type_of_two_surfaces_is_pooled_over_their_pairs():
    p = _predictions()
    out = pooled(p)
    assert list(out) == ["all/click"]  # lead is on one surface only: pooling would repeat it
    m = p.task < 2
    assert abs(out["all/click"]["ne"] - float(metrics.ne(p.pred[m], p.label[m], p.weight[m]))) < 1e-12
    tasks = per_task(p)
    assert out["all/click"]["examples"] == tasks["reels/click"]["examples"] + tasks["fb_feed/click"]["examples"]
    assert abs(out["all/click"]["positives"] - tasks["reels/click"]["positives"]
               - tasks["fb_feed/click"]["positives"]) < 1e-9


def test_the_table_reads_no_figure_of_a_task_below_min_positives():
    scores = per_task(_predictions())
    lead = scores["reels/lead"]["positives"]
    lines = metrics_table(scores, min_positives=lead + 1).splitlines()
    row = next(line for line in lines if line.split()[0] == "reels/lead")
    assert f"too few positives to read (< {lead + 1:g})" in row and f"{scores['reels/lead']['ne']:7.4f}" not in row
    row = next(line for line in metrics_table(scores, min_positives=lead).splitlines()
               if line.split()[0] == "reels/lead")
    assert f"{scores['reels/lead']['ne']:.4f}" in row

"""NE, AUC and calibration against plain definitions, with and without importance weights; the
transfer ratio."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from gem.model.metrics import auc, calibration, ne, transfer_ratio


def test_ne_is_one_for_the_base_rate_and_lower_for_a_better_model():
    label = torch.tensor([1.0, 0.0, 0.0, 0.0])
    w = torch.ones(4)
    assert float(ne(torch.full((4,), 0.25), label, w)) == pytest.approx(1.0)
    assert float(ne(torch.tensor([0.9, 0.1, 0.1, 0.1]), label, w)) < 0.5


def test_ne_matches_its_definition_with_weights():
    pred, label, w = torch.tensor([0.2, 0.7, 0.4]), torch.tensor([0.0, 1.0, 1.0]), torch.tensor([2.0, 1.0, 3.0])
    ll = -(2 * math.log(0.8) + math.log(0.7) + 3 * math.log(0.4)) / 6
    p = 4 / 6
    assert float(ne(pred, label, w)) == pytest.approx(ll / -(p * math.log(p) + (1 - p) * math.log(1 - p)))


def test_auc_equals_pairwise_definition_with_ties_and_weights():
    torch.manual_seed(1)
    pred = torch.randint(0, 5, (40,)).double() / 5  # many ties
    label = (torch.rand(40) < 0.4).double()
    w = torch.rand(40) + 0.5
    num = den = 0.0
    for i, j in itertools.product(range(40), range(40)):
        if label[i] == 1 and label[j] == 0:
            pair = float(w[i] * w[j])
            den += pair
            num += pair * (1.0 if pred[i] > pred[j] else 0.5 if pred[i] == pred[j] else 0.0)
    assert float(auc(pred, label, w)) == pytest.approx(num / den)
    assert float(auc(label, label, torch.ones(40))) == 1.0


def test_calibration_is_weighted_predicted_over_observed():
    assert float(calibration(torch.tensor([0.5, 0.5]), torch.tensor([1.0, 0.0]), torch.tensor([1.0, 3.0]))) == 2.0


def test_transfer_ratio_is_the_share_of_the_fm_gain_the_student_keeps():
    assert transfer_ratio(0.90, 0.85, 0.80) == pytest.approx(0.5)
    assert transfer_ratio(0.90, 0.90, 0.80) == 0.0  # the student gained nothing
    assert transfer_ratio(0.90, 0.78, 0.80) == pytest.approx(1.2)  # a student may beat the FM
    assert transfer_ratio(0.90, 0.92, 0.80) == pytest.approx(-0.2)  # or lose to its baseline
    assert math.isnan(transfer_ratio(0.90, 0.85, 0.95))  # the FM is no better than the baseline

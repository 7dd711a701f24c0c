"""gem.data.encode.dense_matrix: counts enter as log1p of their full-window estimate."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pyarrow as pa
import pytest

from gem.data.encode import DENSE_COLUMNS, dense_matrix

START = "2026-01-01"


def _table(features_days: list[int], values: dict[str, list[float | None]]) -> pa.Table:
    """Rows whose counters are those of START + features_days[i]; every counter 0 unless given."""
    n = len(features_days)
    start = dt.date.fromisoformat(START)
    columns = {"features_ds": pa.array([start + dt.timedelta(days=k) for k in features_days], pa.date32())}
    for name in DENSE_COLUMNS:
        columns[name] = pa.array(values.get(name, [0] * n), pa.float64())
    return pa.table(columns)


def test_a_young_lakes_window_counts_are_scaled_to_their_full_window():
    # A lake 0, 1, 3, 10 and 40 days old: the counters of START+k read min(w, k) days of a w-day window.
    days = [0, 1, 3, 10, 40]
    table = _table(days, {"user_impressions_1d": [0, 5, 5, 5, 5], "user_impressions_7d": [0, 6, 6, 6, 6],
                          "ad_clicks_28d": [0, 2, 2, 2, 2], "user_ctr_7d": [None, 0.5, 0.5, 0.5, 0.5]})
    dense = dense_matrix(table, START)
    column = {name: dense[:, DENSE_COLUMNS.index(name)] for name in DENSE_COLUMNS}
    np.testing.assert_allclose(column["user_impressions_1d"], np.log1p([0, 5, 5, 5, 5]), rtol=1e-6)
    np.testing.assert_allclose(column["user_impressions_7d"], np.log1p([0, 6 * 7, 6 * 7 / 3, 6, 6]), rtol=1e-6)
    np.testing.assert_allclose(column["ad_clicks_28d"], np.log1p([0, 2 * 28, 2 * 28 / 3, 2 * 28 / 10, 2]), rtol=1e-6)
    # Rates are ratios of counts of the same window: never scaled; null -> 0.
    np.testing.assert_allclose(column["user_ctr_7d"], [0, 0.5, 0.5, 0.5, 0.5])
    assert not np.any(dense[:, [DENSE_COLUMNS.index(n) for n in DENSE_COLUMNS if n.endswith("_1d")]][0])


def test_counters_from_before_the_start_day_are_left_as_they_are():
    # A row whose features day precedes start_ds read no day of the lake: nothing to scale by.
    table = _table([-3], {"user_clicks_7d": [4]})
    assert dense_matrix(table, START)[0, DENSE_COLUMNS.index("user_clicks_7d")] == pytest.approx(np.log1p(4))

"""NEWS2 scoring (RCP 2017 chart 1) on rows scored by hand."""

import numpy as np
import pytest

from svattn.data.icu import FEATURES
from svattn.data.news2 import (
    NEWS2_PARAMETERS,
    news2_high_risk_mask,
    news2_parameter_scores,
)

NAMES = ("heart_rate", "spo2", "resp_rate", "sys_bp", "temp_c")


def test_band_edges_score_as_the_chart_on_whole_values():
    # each column walks across the chart's band edges; expected scores read off chart 1
    cases = {
        "resp_rate": ([8, 9, 11, 12, 20, 21, 24, 25], [3, 1, 1, 0, 0, 2, 2, 3]),
        "spo2": ([91, 92, 93, 94, 95, 96, 100, 50], [3, 2, 2, 1, 1, 0, 0, 3]),
        "sys_bp": ([90, 91, 100, 101, 110, 111, 219, 220], [3, 2, 2, 1, 1, 0, 0, 3]),
        "heart_rate": ([40, 41, 50, 51, 90, 91, 130, 131], [3, 1, 1, 0, 0, 1, 2, 3]),
        "temp_c": ([35.0, 35.1, 36.0, 36.1, 38.0, 38.1, 39.0, 39.1], [3, 1, 1, 0, 0, 1, 1, 2]),
    }
    normal = {"heart_rate": 70, "spo2": 98, "resp_rate": 16, "sys_bp": 120, "temp_c": 37.0}
    for name, (values, expected) in cases.items():
        rows = np.array([[v if n == name else normal[n] for n in NAMES] for v in values], float)
        scores = news2_parameter_scores(rows, NAMES)
        assert scores[name].tolist() == expected, name
        for other in NEWS2_PARAMETERS:
            if other != name:
                assert scores[other].tolist() == [0] * len(values), (name, other)


def test_textbook_rows_aggregate_and_high_risk_band():
    rows = np.array([
        # pulse, SpO2, resp, SBP, temp
        [72, 98, 14, 128, 36.8],    # healthy adult: 0
        [105, 95, 22, 108, 38.4],   # 1 + 1 + 2 + 1 + 1 = 6: medium, not high
        [118, 93, 23, 104, 38.6],   # 2 + 2 + 2 + 1 + 1 = 8: high (aggregate)
        [135, 97, 16, 120, 37.0],   # pulse 135 scores 3 alone: red score, aggregate 3
        [88, 97, 16, 120, 34.6],    # temperature 34.6 scores 3 alone
        [95, 94, 21, 100, 39.3],    # 1 + 1 + 2 + 2 + 2 = 8
        [60, 96, 12, 111, 36.1],    # every value on a normal edge: 0
    ], dtype=float)
    flag, total = news2_high_risk_mask(rows, NAMES)
    assert total.tolist() == [0, 6, 8, 3, 3, 8, 0]
    assert flag.tolist() == [False, False, True, True, True, True, False]


def test_unmeasured_parameters_score_zero_and_feature_order_is_by_name():
    nan = np.nan
    rows = np.array([[nan, 97, 16, 120, 70, 85, 37.0],
                     [nan, nan, nan, nan, nan, nan, nan],
                     [nan, 91, nan, nan, nan, nan, nan]])  # SpO2 91 alone: 3
    flag, total = news2_high_risk_mask(rows, FEATURES)
    assert total.tolist() == [0, 0, 3]
    assert flag.tolist() == [False, False, True]


def test_bad_shapes_and_missing_parameters_are_refused():
    with pytest.raises(ValueError, match="shape"):
        news2_high_risk_mask(np.zeros((3, 4)), NAMES)
    with pytest.raises(ValueError, match="temp_c"):
        news2_high_risk_mask(np.zeros((3, 4)), NAMES[:4])

"""NEWS2: the National Early Warning Score 2, from the vitals of :mod:`svattn.data.icu`.

The scoring tables are those of the Royal College of Physicians, *National
Early Warning Score (NEWS) 2* (London, RCP 2017), chart 1, written out in
:data:`NEWS2_TABLES`. Each parameter scores 0-3; the aggregate is their sum.
The *high-risk* band (an emergency response) is an aggregate of 7 or more;
a single parameter scoring 3 (a "red score") also triggers an urgent
clinical review. :func:`news2_high_risk_mask` flags an hour when either holds.

What the vitals at hand lack
----------------------------
Of NEWS2's seven parameters the ICU vitals carry five: respiration rate,
SpO2 (scored on scale 1, the default scale; scale 2 is for confirmed
hypercapnic respiratory failure, which the data do not record), systolic
blood pressure, pulse and temperature. Two are absent from both loaders:

* *air or oxygen* (supplemental oxygen scores 2), and
* *consciousness* (new confusion, voice, pain or unresponsive scores 3).

They are scored from the available parameters only, i.e. the missing ones
count 0. The score is therefore a lower bound on the bedside NEWS2 (most ICU
patients breathe supplemental oxygen, which would add 2), and the high-risk
flag under-counts. Likewise a parameter not measured in the hour (NaN)
scores 0.

Hourly means are not whole numbers, so the integer bands of the chart are
read as half-open intervals cut at the chart's upper edges: respiration
"9-11" is ``8 < x <= 11``, temperature "35.1-36.0" is ``35.0 < x <= 36.0``.
On the whole (or one-decimal) values the chart is written in, this is the
chart exactly.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "NEWS2_PARAMETERS",
    "NEWS2_MISSING_PARAMETERS",
    "NEWS2_TABLES",
    "news2_high_risk_mask",
    "news2_parameter_scores",
]

NEWS2_TABLES: dict[str, tuple[tuple[float, int], ...]] = {
    # (upper edge, score): a value scores the first band whose edge it does not
    # exceed; the last edge is +inf. RCP 2017, chart 1.
    "resp_rate": ((8, 3), (11, 1), (20, 0), (24, 2), (np.inf, 3)),
    #  <=8: 3 | 9-11: 1 | 12-20: 0 | 21-24: 2 | >=25: 3
    "spo2": ((91, 3), (93, 2), (95, 1), (np.inf, 0)),
    #  scale 1: <=91: 3 | 92-93: 2 | 94-95: 1 | >=96: 0
    "sys_bp": ((90, 3), (100, 2), (110, 1), (219, 0), (np.inf, 3)),
    #  <=90: 3 | 91-100: 2 | 101-110: 1 | 111-219: 0 | >=220: 3
    "heart_rate": ((40, 3), (50, 1), (90, 0), (110, 1), (130, 2), (np.inf, 3)),
    #  <=40: 3 | 41-50: 1 | 51-90: 0 | 91-110: 1 | 111-130: 2 | >=131: 3
    "temp_c": ((35.0, 3), (36.0, 1), (38.0, 0), (39.0, 1), (np.inf, 2)),
    #  <=35.0: 3 | 35.1-36.0: 1 | 36.1-38.0: 0 | 38.1-39.0: 1 | >=39.1: 2
}
"""NEWS2 scoring bands per parameter, keyed by the feature names of :mod:`svattn.data.icu`."""

NEWS2_PARAMETERS: tuple[str, ...] = tuple(NEWS2_TABLES)
"""The NEWS2 parameters the vitals carry (scored)."""

NEWS2_MISSING_PARAMETERS: tuple[str, ...] = ("air or oxygen", "consciousness (ACVPU)")
"""NEWS2 parameters the vitals lack; they count 0 in the aggregate."""


def _score(values: np.ndarray, bands: tuple[tuple[float, int], ...]) -> np.ndarray:
    out = np.zeros(values.shape, dtype=np.int64)
    assigned = np.isnan(values)  # not measured: scores 0
    for edge, score in bands:
        hit = ~assigned & (values <= edge)
        out[hit] = score
        assigned |= hit
    return out


def news2_parameter_scores(
    vitals: np.ndarray, feature_names: tuple[str, ...]
) -> dict[str, np.ndarray]:
    """Per-parameter NEWS2 scores (0-3) of each row.

    Parameters
    ----------
    vitals : ndarray, shape (N, F)
        Vital signs in physical units (bpm, %, breaths/min, mmHg, degrees
        Celsius); NaN where not measured, which scores 0.
    feature_names : tuple of str
        Column names; must contain every name of :data:`NEWS2_PARAMETERS`.

    Returns
    -------
    dict of str to ndarray of int64, shape (N,)
        One array per name of :data:`NEWS2_PARAMETERS`.

    Raises
    ------
    ValueError
        If ``vitals`` is not 2-D with ``len(feature_names)`` columns, or a
        parameter is missing from ``feature_names``.
    """
    vitals = np.asarray(vitals, dtype=np.float64)
    if vitals.ndim != 2 or vitals.shape[1] != len(feature_names):
        raise ValueError(
            f"news2: vitals must have shape (N, {len(feature_names)}), got {vitals.shape}"
        )
    missing = [name for name in NEWS2_PARAMETERS if name not in feature_names]
    if missing:
        raise ValueError(f"news2: feature_names lacks {missing}, needed by the score")
    return {
        name: _score(vitals[:, feature_names.index(name)], bands)
        for name, bands in NEWS2_TABLES.items()
    }


def news2_high_risk_mask(
    vitals: np.ndarray, feature_names: tuple[str, ...]
) -> tuple[np.ndarray, np.ndarray]:
    """Flag NEWS2 high-risk rows: aggregate score >= 7, or any parameter scoring 3.

    Parameters
    ----------
    vitals : ndarray, shape (N, F)
        Vital signs in physical units; NaN where not measured (scores 0).
    feature_names : tuple of str
        Column names; must contain every name of :data:`NEWS2_PARAMETERS`.

    Returns
    -------
    (ndarray of bool, ndarray of int64), each shape (N,)
        The high-risk flag and the aggregate score (over the available
        parameters; see the module docstring for the two it lacks).

    Examples
    --------
    >>> import numpy as np
    >>> names = ("heart_rate", "spo2", "resp_rate", "sys_bp", "temp_c")
    >>> rows = np.array([
    ...     [80, 97, 16, 120, 37.0],    # all normal: 0
    ...     [115, 93, 22, 105, 38.5],   # 2 + 2 + 2 + 1 + 1 = 8
    ...     [80, 91, 16, 120, 37.0],    # SpO2 91 alone scores 3
    ... ])
    >>> flag, score = news2_high_risk_mask(rows, names)
    >>> flag.tolist(), score.tolist()
    ([False, True, True], [0, 8, 3])
    """
    scores = news2_parameter_scores(vitals, feature_names)
    stacked = np.stack([scores[name] for name in NEWS2_PARAMETERS], axis=1)
    total = stacked.sum(axis=1)
    return (total >= 7) | (stacked == 3).any(axis=1), total

"""Shared data of the estimator tests: scikit-learn's bundled wine table, shuffled."""

from __future__ import annotations

import numpy as np
import pandas as pd
from sklearn.datasets import load_wine


def shuffled_wine(seed: int = 0) -> pd.DataFrame:
    """The 178 wines (13 features and ``target``), rows in a shuffled order: index
    labels 0..177 that are no longer the rows' positions."""
    return load_wine(as_frame=True).frame.sample(frac=1.0, random_state=seed)


def features(frame: pd.DataFrame) -> pd.DataFrame:
    """The wine features, standardised with fixed constants (the whole table's, computed
    once here: a scaler fitted beside the model would keep forgotten rows' statistics)."""
    X = frame.drop(columns="target")
    full = load_wine(as_frame=True).frame.drop(columns="target")
    return (X - full.mean()) / full.std()


def max_gap(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(np.asarray(a) - np.asarray(b)).max())

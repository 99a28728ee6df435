"""What docs/usage.md (and the README) say about svattn.SVDD in scikit-learn's tools holds:
a search needs ``scoring=``, and forgetting through a Pipeline is exact for the estimator
only (the scaler keeps the forgotten rows)."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from sklearn.model_selection import GridSearchCV
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

from svattn import SVDD

ROOT = Path(__file__).resolve().parents[1]
X = np.random.default_rng(0).normal(size=(150, 3)) * [1.0, 50.0, 0.01]


def _usage() -> str:
    return " ".join((ROOT / "docs" / "usage.md").read_text().split())


def test_a_search_needs_scoring_as_documented():
    assert "need a `scoring=`" in _usage()
    with pytest.raises(TypeError, match="scoring"):
        GridSearchCV(SVDD(), {"nu": [0.1, 0.2]}, cv=3).fit(X)
    search = GridSearchCV(SVDD(), {"nu": [0.1, 0.2]}, cv=3,
                          scoring=lambda est, X_, y=None: est.score_samples(X_).mean())
    assert search.fit(X).best_params_["nu"] in (0.1, 0.2)


def test_forgetting_through_a_pipeline_is_exact_for_the_estimator_only():
    assert "is exact for the estimator only" in _usage()
    gone = [0, 1, 2]
    pipe = make_pipeline(StandardScaler(), SVDD(nu=0.1)).fit(X)
    pipe[-1].forget(indices=gone)
    rest = np.delete(X, gone, axis=0)
    model = pipe[-1]
    # the estimator equals a fresh fit on the rows it kept, as the scaler shows them
    fresh = SVDD(C=model.C_, gamma=model.gamma_).fit(pipe[0].transform(rest))
    Z = pipe[0].transform(X)
    np.testing.assert_allclose(model.decision_function(Z), fresh.decision_function(Z),
                               atol=1e-9)
    # the scaler still holds the forgotten rows: the pipeline is no fresh pipeline fit
    assert pipe[0].mean_ == pytest.approx(X.mean(axis=0))
    again = make_pipeline(StandardScaler(), SVDD(C=model.C_, gamma=model.gamma_)).fit(rest)
    assert np.abs(pipe.decision_function(X) - again.decision_function(X)).max() > 1e-6


def test_readme_says_both_too():
    text = " ".join((ROOT / "README.md").read_text().split())
    assert "give it a `scoring=`" in text
    assert re.search(r"forgetting is exact for the estimator only", text)

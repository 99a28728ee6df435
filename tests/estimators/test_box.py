"""A box C that the rows held cannot fill (n·C < 1) is said, not left silent.

``SVDD(C=0.001)`` on 100 rows used to fit without a word and call every row an
outlier; now it warns with :class:`InfeasibleBoxWarning`, whose message is checked
against what the model then does.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
from sklearn.metrics.pairwise import rbf_kernel

from svattn import SVDD
from svattn.estimators import InfeasibleBoxWarning

X = np.random.default_rng(0).normal(size=(100, 2))


def test_a_box_the_rows_cannot_fill_warns_and_says_what_it_does():
    with pytest.warns(InfeasibleBoxWarning) as seen:
        model = SVDD(C=0.001).fit(X)
    text = str(seen[0].message)
    assert "n·C = 0.1 < 1" in text and "ceil(1/C) = 1000" in text
    assert re.search(r"uniform \(every row weight 1/n\), not fitted to the rows' shape, "
                     r"until it holds 1000 rows", text)
    assert "mean kernel value to the rows is >= 1/2" in text
    assert "C = 1/k lets k rows carry all the weight" in text and "nu=" in text
    # what it says: uniform weights; inside where the mean kernel value is >= 1/2
    assert np.allclose(model.dual_coef_, model.dual_coef_[0, 0])
    Z = np.random.default_rng(3).normal(size=(400, 2)) * 1.5
    mean_k = rbf_kernel(Z, X, gamma=model.gamma_).mean(1)
    np.testing.assert_allclose(model.decision_function(Z), (2 * mean_k - 1) / (2 * model.C_),
                               rtol=0, atol=1e-9)
    assert (model.predict(X) == -1).all()  # these rows: every one outside


@pytest.mark.parametrize("params", [{"C": 1 / 100}, {"C": 1 / 20}, {"nu": 0.05}, {"nu": 1.0},
                                    {}], ids=str)
def test_a_box_the_rows_fill_is_quiet(params):
    with warnings.catch_warnings():
        warnings.simplefilter("error", InfeasibleBoxWarning)
        SVDD(**params).fit(X)


def test_forget_below_ceil_one_over_C_warns_and_partial_fit_back_above_is_quiet():
    model = SVDD(C=1 / 50).fit(X)
    with pytest.warns(InfeasibleBoxWarning, match=r"after forget: .* 40 rows"):
        model.forget(indices=list(range(60)))
    assert (model.predict(X) == -1).all()
    with warnings.catch_warnings():
        warnings.simplefilter("error", InfeasibleBoxWarning)
        model.partial_fit(X[:60])  # 100 rows again, C = 1/50
    assert (model.predict(X) == 1).any()
    with pytest.warns(InfeasibleBoxWarning, match="after fit: .* 3 rows"):
        small = SVDD(C=0.1).fit(X[:3])
    with pytest.warns(InfeasibleBoxWarning, match="after partial_fit: .* 5 rows"):
        small.partial_fit(X[3:5])

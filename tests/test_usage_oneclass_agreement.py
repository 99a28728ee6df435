"""The agreement with ``OneClassSVM`` that docs/usage.md and the README quote holds under
the settings they name beside it, and only there; ``predict`` differs only on margin
vectors. Checked on scikit-learn's bundled data, against the code."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from sklearn.datasets import load_breast_cancer, load_digits, load_wine
from sklearn.preprocessing import StandardScaler
from sklearn.svm import OneClassSVM

from svattn import SVDD

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = "tol=1e-12, shrinking=False"
DATA = {"wine": load_wine, "breast-cancer": load_breast_cancer, "digits": load_digits}


def _bullet() -> str:
    text = " ".join((ROOT / "docs" / "usage.md").read_text().split())
    start = text.index("* **Against `OneClassSVM`.**")
    return text[start:text.index("* **", start + 5)]


def _fits(name: str, nu: float):
    X = StandardScaler().fit_transform(DATA[name]().data)
    ours = SVDD(nu=nu, gamma="scale").fit(X)
    tight = OneClassSVM(nu=nu, gamma=ours.gamma_, tol=1e-12, shrinking=False).fit(X)
    default = OneClassSVM(nu=nu, gamma=ours.gamma_).fit(X)
    return X, ours, tight, default


def test_the_figure_names_its_condition_in_the_guide_and_the_readme():
    bullet = _bullet()
    figure = re.search(r"within (\d\.\de-\d+) of values", bullet).group(1)
    assert f"OneClassSVM(nu=..., gamma=..., {SETTINGS})" in bullet
    assert f"The {figure} holds only with `{SETTINGS}`" in bullet
    row = next(line for line in (ROOT / "README.md").read_text().splitlines()
               if "OneClassSVM" in line and f"| {figure} |" in line)
    assert f"OneClassSVM({SETTINGS})" in row and "defaults about 5e-4" in row
    # the benchmark runs libsvm so, and its record gives the figure
    bench = (ROOT / "benchmarks" / "bench_estimator.py").read_text()
    assert f"OneClassSVM(nu=nu, gamma=ours.gamma_, {SETTINGS})" in bench
    rec = json.loads((ROOT / "results" / "bench_estimator.json").read_text())
    assert float(f"{max(a['decision_dev'] for a in rec['agreement']):.1e}") == float(figure)


@pytest.mark.parametrize("nu", [0.05, 0.5])
@pytest.mark.parametrize("name", ["wine", "breast-cancer"])
def test_the_stated_settings_agree_and_the_defaults_do_not(name, nu):
    """Within the quoted figure under the named settings; about 5e-4 apart with
    OneClassSVM's defaults (in the range the guide gives)."""
    bullet = _bullet()
    figure = float(re.search(r"within (\d\.\de-\d+) of values", bullet).group(1))
    lo, hi = (float(x) for x in re.search(r"about 5e-4 \((\S+) … (\S+) on", bullet).groups())
    X, ours, tight, default = _fits(name, nu)
    d = ours.decision_function(X)
    assert np.abs(d - tight.decision_function(X)).max() <= figure
    assert lo <= np.abs(d - default.decision_function(X)).max() <= hi


@pytest.mark.parametrize("settings", ["stated", "default"])
def test_predictions_differ_only_on_margin_vectors(settings):
    bullet = _bullet()
    margin_said = int(re.search(
        r"wine, ν = 0\.05: about half of its (\d+) margin vectors",
        bullet).group(1))
    bound = float(re.search(r"here \|value\| ≤ (\S+)\)", bullet).group(1))
    for name in DATA:
        for nu in (0.05, 0.5):
            X, ours, tight, default = _fits(name, nu)
            libsvm = tight if settings == "stated" else default
            d = ours.decision_function(X)
            margin = np.zeros(len(X), bool)
            margin[ours.support_[np.abs(ours.dual_coef_[0]) < 1 - 1e-9]] = True
            flips = ours.predict(X) != libsvm.predict(X)
            assert not (flips & ~margin).any(), (name, nu)
            assert np.abs(d[margin]).max() <= bound, (name, nu)
            if (name, nu, settings) == ("wine", 0.05, "stated"):
                assert margin.sum() == margin_said
                assert 0.3 * margin_said <= flips.sum() <= 0.7 * margin_said

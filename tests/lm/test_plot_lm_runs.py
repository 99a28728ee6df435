"""``scripts/plot_lm_runs.py``: two runs of one config get their own labels and legend entries."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest
from lm_helpers import tiny_config

from svattn.lm.train import train

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.fixture
def plot(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))
    yield importlib.import_module("plot_lm_runs")
    sys.modules.pop("plot_lm_runs", None)


def test_two_runs_of_one_config_are_told_apart(tmp_path, plot, monkeypatch):
    runs = [tmp_path / "a", tmp_path / "b"]
    for run in runs:  # the same config, twice
        train(tiny_config(run, steps=3, log_every=1))
    legends = []
    real_legend = plot.plt.Axes.legend

    def spy(ax, *args, **kwargs):
        legends.append(list(args[1]) if len(args) > 1 else [])
        return real_legend(ax, *args, **kwargs)

    monkeypatch.setattr(plot.plt.Axes, "legend", spy)
    out = tmp_path / "curves.png"
    assert plot.main([str(r) for r in runs] + ["--out", str(out), "--json",
                                               str(tmp_path / "t.json")]) == 0
    assert out.stat().st_size > 0
    labels = [row["label"] for row in json.loads((tmp_path / "t.json").read_text())]
    assert labels == ["softmax (NoPE, seed 0) [a]", "softmax (NoPE, seed 0) [b]"]
    (entries,) = legends
    assert sum(e.endswith("train (smoothed)") for e in entries) == 2

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
    # one entry per run, and what the line and the marks mean said once (not per run)
    assert entries.count("softmax (NoPE, seed 0) [a]") == 1
    assert entries.count("softmax (NoPE, seed 0) [b]") == 1
    assert sum("training loss" in e for e in entries) == 1
    assert len(entries) == 2 + 1 + 3  # runs, the paper's line, line / hollow / filled


def test_title_and_y_range_never_cut_silently(tmp_path, plot, monkeypatch):
    run = tmp_path / "a"
    train(tiny_config(run, steps=3, log_every=1))
    axes = []
    real_title = plot.plt.Axes.set_title

    def spy(ax, *args, **kwargs):
        axes.append(ax)
        return real_title(ax, *args, **kwargs)

    monkeypatch.setattr(plot.plt.Axes, "set_title", spy)
    out = tmp_path / "c.png"
    assert plot.main([str(run), "--out", str(out), "--title", "lookback probe"]) == 0
    ax = axes.pop()
    assert ax.get_title() == "lookback probe"
    lo, hi = ax.get_ylim()  # default: every point inside the axis
    ys = [y for line in ax.get_lines() for y in line.get_ydata()]
    assert ys and lo <= min(ys) and max(ys) <= hi
    assert not ax.texts
    # a --ylim that cuts the curve says so on the figure
    assert plot.main([str(run), "--out", str(out), "--ylim", "0", "1"]) == 0
    ax = axes.pop()
    assert ax.get_ylim() == (0.0, 1.0)
    (note,) = ax.texts
    assert note.get_text().startswith("y axis cut to [0, 1]:")

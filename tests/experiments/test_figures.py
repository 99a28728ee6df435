"""Figures a reader can read (issue #23): the key line is not hidden, panels have
legends, a panel shows a contrast. Each experiment runs in quick mode and its figure
is inspected just before it is saved."""

from __future__ import annotations

from pathlib import Path

import pytest

from svattn.experiments import fact_editing, secret, selective_copy
from svattn.experiments._common import Context


@pytest.fixture
def figures(monkeypatch, tmp_path: Path):
    """Run an experiment; return the axes of every figure it saved."""

    def run(module):
        seen = []
        real = module.save_figure

        def spy(fig, out, name, caption):
            seen.append(fig.axes)
            return real(fig, out, name, caption)

        monkeypatch.setattr(module, "save_figure", spy)
        ctx = Context(out=tmp_path, quick=True, seed=0, data_dir=None, command="svattn x")
        module.run(ctx)
        (axes,) = seen
        return axes

    return run


def test_secret_exact_removal_is_on_top_and_labelled(figures):
    (ax,) = figures(secret)
    lines = {line.get_label(): line for line in ax.get_lines()}
    exact = [line for label, line in lines.items() if label.startswith("SV exact removal")]
    assert exact and all("leak" in line.get_label() for line in exact)
    others = [line for line in ax.get_lines() if line not in exact]
    # drawn above and thicker than every other line, e.g. "linear subtract" at the same 0
    assert min(line.get_zorder() for line in exact) > max(line.get_zorder() for line in others)
    assert min(line.get_linewidth() for line in exact) > max(
        line.get_linewidth() for line in others)
    assert any(t.get_text().startswith("SV exact removal:") for t in ax.texts)


def test_selective_copy_state_panel_has_a_legend_and_sv_on_top(figures):
    recall, state = figures(selective_copy)
    assert state.get_legend() is not None
    labels = [t.get_text() for t in state.get_legend().get_texts()]
    assert "sv" in labels and "sliding" in labels
    lines = {line.get_label(): line for line in state.get_lines()}
    assert lines["sv"].get_zorder() > lines["sliding"].get_zorder()
    assert lines["sv"].get_marker() != lines["sliding"].get_marker()
    assert lines["linear"].get_marker() != lines["deltanet"].get_marker()


def test_fact_editing_forgetting_panel_shows_the_contrast(figures):
    _, forget = figures(fact_editing)
    assert forget.get_yscale() == "log"
    from matplotlib.collections import PathCollection

    points = [c for c in forget.collections if isinstance(c, PathCollection)]  # the scatters
    exact, decay = (c.get_offsets()[:, 1] for c in points)
    assert len(exact) == len(decay) == 3  # one point per quick trial
    assert exact.max() < 1e-9 < decay.min()  # orders of magnitude apart
    ticks = [t.get_text() for t in forget.get_xticklabels()]
    assert all("still retrieved:" in t and " of " in t for t in ticks)

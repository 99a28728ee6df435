"""Figures a reader can read (issue #23): the key line is not hidden, panels have
legends, a panel shows a contrast. Each experiment runs in quick mode and its figure
is inspected just before it is saved."""

from __future__ import annotations

from pathlib import Path

import pytest

from svattn.experiments import fact_editing, recall, secret, selective_copy
from svattn.experiments._common import QUICK_STAMP, Context, save_figure


@pytest.fixture
def saved(monkeypatch):
    """Spy on a module's save_figure: a list that collects each saved figure."""

    def spy_on(module):
        seen = []
        real = module.save_figure

        def spy(fig, out, name, caption, **kw):
            seen.append(fig)
            return real(fig, out, name, caption, **kw)

        monkeypatch.setattr(module, "save_figure", spy)
        return seen

    return spy_on


@pytest.fixture
def figures(saved, tmp_path: Path):
    """Run an experiment in quick mode; return the axes of the figure it saved."""

    def run(module, keep=None):
        seen = saved(module)
        ctx = Context(out=tmp_path, quick=True, seed=0, data_dir=None, command="svattn x")
        module.run(ctx)
        (fig,) = seen
        if keep is not None:
            keep.append(fig)
        return fig.axes

    return run


@pytest.mark.parametrize("module", [fact_editing, secret, selective_copy])
def test_quick_mode_figures_say_they_are_machinery_checks(figures, module):
    kept = []
    figures(module, keep=kept)
    texts = [t.get_text().replace("\n", " ") for t in kept[0].texts]
    assert sum(QUICK_STAMP in t for t in texts) == 2  # across the figure and in the caption


def test_full_mode_figures_carry_no_quick_stamp(tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, _ = plt.subplots()
    save_figure(fig, tmp_path, "f.png", "caption")
    assert [t.get_text() for t in fig.texts] == ["caption"]


def test_recall_by_state_tick_labels_do_not_overlap(saved, tmp_path):
    """States 2048 (DeltaNet) and 2112 (linear attention) sit side by side, and a log
    axis labels its minor ticks (3×10³, 4×10³): no two visible labels may overlap."""
    seen = saved(recall)
    acc = {"mean": 0.5, "ci95": [0.4, 0.6], "n": 3}
    cells = [{"task": task, "mixer": mixer, "state_floats": state, "seq_len": T,
              "accuracy": acc}
             for task in ("mqar", "selective-copy")
             for T in (64, 128)
             for mixer, state in (("hybrid_sv", 4096), ("sliding", 4096), ("deltanet", 2048),
                                  ("linear", 2112), ("softmax", 128 * T))]
    recall.figure_by_state(Context(out=tmp_path, quick=False, seed=0, data_dir=None,
                                   command="svattn x"), cells)
    (fig,) = seen
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)  # the figure was closed when saved: draw it again
    canvas.draw()
    renderer = canvas.get_renderer()
    for ax in fig.axes:
        labels = [t for t in ax.get_xticklabels(minor=False) + ax.get_xticklabels(minor=True)
                  if t.get_visible() and t.get_text()]
        assert len(labels) >= 3
        boxes = sorted((t.get_window_extent(renderer) for t in labels), key=lambda b: b.x0)
        gaps = [b.x0 - a.x1 for a, b in zip(boxes[:-1], boxes[1:], strict=True)]
        text = [t.get_text() for t in labels]
        assert min(gaps) >= 4, f"tick labels {text} touch or overlap (gaps {gaps} px)"


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


@pytest.mark.slow  # draws the full panel
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
    # a deleted fact 'still retrieved' is read against the memory retrained without it
    assert "retrained without it:" in ticks[0]

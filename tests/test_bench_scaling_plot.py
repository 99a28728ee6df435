"""bench_scaling's figure says what it shows and is redrawn from its record alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from script_helpers import load_script

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # ~2 s idle (matplotlib, five panels), more on a loaded machine
def test_replot_from_the_record_has_a_title_and_exponents(tmp_path, monkeypatch):
    bench = load_script("benchmarks/bench_scaling.py")
    drawn = []
    real = bench.plot
    monkeypatch.setattr(bench, "plot", lambda *a, **k: drawn.append(real(*a, **k)))
    out = tmp_path / "scaling.png"
    assert bench.main(["--replot", str(REPO / "results" / "bench_scaling.json"),
                       "--plot", str(out)]) == 0
    assert out.is_file() and out.stat().st_size > 0
    (fig,) = drawn
    assert "cost against n" in fig._suptitle.get_text()
    removal = next(ax for ax in fig.axes if ax.get_title().startswith("removal"))
    labels = [t.get_text() for t in removal.get_legend().get_texts()]
    # the record's fitted exponents (removal: 0.74 redundant, 0.65 Gaussian)
    assert labels == ["redundant (∝ n^0.74)", "gaussian (∝ n^0.65)"]

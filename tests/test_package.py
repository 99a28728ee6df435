"""The package's top level: what ``import svattn`` offers and lists."""

from __future__ import annotations

import svattn


def test_dir_lists_the_lazily_imported_estimator():
    # svattn.SVDD is imported on first use (no scikit-learn import for the CLI or the
    # torch layers), and dir(svattn) hid it
    assert "SVDD" in dir(svattn) and "__version__" in dir(svattn)
    assert set(svattn.__all__) <= set(dir(svattn))
    assert svattn.SVDD.__name__ == "SVDD"

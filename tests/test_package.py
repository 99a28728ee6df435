"""The package's top level: what ``import svattn`` offers and lists."""

from __future__ import annotations

import svattn


def test_dir_lists_the_lazily_imported_estimator():
    # svattn.SVDD is imported on first use (no scikit-learn import for the CLI or the
    # torch layers), and dir(svattn) hid it
    assert "SVDD" in dir(svattn) and "__version__" in dir(svattn)
    assert set(svattn.__all__) <= set(dir(svattn))
    assert svattn.SVDD.__name__ == "SVDD"


def test_the_estimator_imports_and_fits_without_torch():
    """``import svattn``, ``from svattn import SVDD`` and a fit never import torch (nor
    the torch layers): each worker of a parallel cross-validation imports only what the
    estimator needs. Checked in a fresh process, where nothing else imported it."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    code = ("import sys\n"
            "import numpy as np\n"
            "import svattn\n"
            "after_package = 'torch' in sys.modules\n"
            "from svattn import SVDD\n"
            "SVDD(nu=0.2).fit(np.random.default_rng(0).normal(size=(80, 3)))\n"
            "print(after_package, 'torch' in sys.modules,\n"
            "      any(m.startswith(('svattn.nn', 'svattn.mixers')) for m in sys.modules))\n")
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1] / "src"))
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                         capture_output=True, text=True, timeout=300).stdout
    assert out.split() == ["False", "False", "False"]

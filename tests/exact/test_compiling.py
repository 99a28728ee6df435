"""A compile of one of svattn's kernels says so, once, on stderr; a cache hit is silent."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from svattn.exact.core.compiling import MESSAGE

SRC = str(Path(__file__).resolve().parents[2] / "src")
CHILD = ("import numpy as np\n"
         "from svattn.exact.core.kernels import sq_distances\n"
         "sq_distances(np.zeros((2, 2)), np.zeros((3, 2)))\n"
         "sq_distances(np.zeros((2, 2)), np.zeros((40, 2)))\n")  # (a second kernel)


def _run(cache: Path) -> str:
    env = dict(os.environ, PYTHONPATH=SRC, NUMBA_CACHE_DIR=str(cache))
    return subprocess.run([sys.executable, "-c", CHILD], env=env, check=True,
                          capture_output=True, text=True, timeout=300).stderr


def test_a_compile_is_announced_once_and_a_cached_kernel_loads_silently(tmp_path):
    first = _run(tmp_path)  # an empty cache: numba compiles
    assert first.count(MESSAGE) == 1
    assert MESSAGE not in _run(tmp_path)  # the same kernels, from the cache

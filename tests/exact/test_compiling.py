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


QUICK_CHILD = """
import sys
import numpy as np
if sys.argv[1] == "refresh":  # numba's registries loaded first, as its own cache loads them
    from numba.core.registry import cpu_target
    cpu_target.target_context.refresh()
from svattn.exact import SVDDMemory
from svattn.exact.backends.compiled import columns
from svattn.exact.core.compiling import QuickLoadCache
x = np.random.default_rng(0).normal(size=(90, 5))
mem = SVDDMemory(0.05)
mem.extend(x[:60])  # the warm-up, the threshold solve and the drives
for row in x[60:]:
    mem.add(row)
for tid in mem.support_ids()[:3]:  # support removals: the segments and the event loop
    mem.remove(tid)
print(mem.state_digest(), mem.alpha.tobytes().hex(), mem.decision_function(x[:5]).tobytes().hex())
print(type(columns.kernel_column._cache) is QuickLoadCache, "numba.np.linalg" in sys.modules)
"""


def _quick(mode: str) -> list[str]:
    env = dict(os.environ, PYTHONPATH=SRC)
    return subprocess.run([sys.executable, "-c", QUICK_CHILD, mode], env=env, check=True,
                          capture_output=True, text=True, timeout=600).stdout.splitlines()


def test_a_fresh_process_loads_cached_kernels_without_numba_s_registries():
    """A fresh process's first operations load svattn's cached kernels after numba's
    runtime only (not the registries numba's own cache loads: 0.4-0.5 s of a first
    operation), and compute what the same kernels compute after the full refresh, bit
    for bit (state digest, alpha, decision values)."""
    refreshed = _quick("refresh")  # (also writes any kernel missing from the cache)
    quick = _quick("plain")
    assert quick[0] == refreshed[0]
    assert quick[1] == "True False"  # the quick cache; numba's registries never loaded
    assert refreshed[1] == "True True"

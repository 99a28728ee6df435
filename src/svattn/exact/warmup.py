"""Compile (or load from numba's disk cache) every kernel of the exact core once.

``make setup`` runs it after installing, so that no printed or recorded figure (the
demo's timings, a benchmark) ever contains compile time: the first run on a fresh
machine otherwise spends about a minute compiling inside whatever it measures.

Usage::

    python -m svattn.exact.warmup
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from svattn.exact.memory import SVDDMemory


def warm() -> float:
    """Run every operation of the compiled backend on tiny memories; return seconds."""
    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as tmp:
        for kernel, scale in (("rbf", 1.0), ("exp", 0.3)):
            x = scale * rng.normal(size=(80, 3))
            mem = SVDDMemory(C=0.05, kernel=kernel, tag_key=b"svattn-warmup-tag-key-0123456")
            mem.extend(x[:60], tags=["a"] * 30 + ["b"] * 30)
            for row in x[60:]:
                mem.add(row, tag="c")
            part = mem.partition()
            for name in ("margin", "error", "reserve"):
                if part[name]:
                    mem.remove(part[name][0])
            mem.erase("a")
            mem.readout(x[:4])
            mem.decision_function(x[:4])
            mem.kkt_residual()
            mem.unique_optimum()
            path = Path(tmp) / f"{kernel}.safetensors"
            mem.save(path)
            SVDDMemory.load(path).compact()
    return time.perf_counter() - t0


def main() -> int:
    seconds = warm()
    print(f"svattn: the exact core's compiled kernels are ready ({seconds:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

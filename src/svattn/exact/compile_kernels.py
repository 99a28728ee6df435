"""Compile (or load from numba's disk cache) every kernel of the exact core once.

``make setup`` runs it after installing, so that no printed or recorded figure (the
demo's timings, a benchmark) ever contains compile time: the first run on a fresh
machine otherwise spends about a minute compiling inside whatever it measures.

Usage::

    python -m svattn.exact.compile_kernels
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import numpy as np

from svattn.exact.backends.compiled import columns, linalg
from svattn.exact.core.gram import padded_square
from svattn.exact.memory import SVDDMemory


def _compile_kept_factor(rng: np.random.Generator) -> None:
    """The kept uniqueness factor's kernels, which only margin sets of ~100 tokens and
    more reach (``compiled.FACTOR_KEPT_FROM``), called with the types a removal uses."""
    x = rng.normal(size=(8, 2))
    K = padded_square(8)  # the buffers' own shape and order
    K[:, :8] = np.exp(-((x[:, None] - x[None]) ** 2).sum(-1))
    L = padded_square(8, columns=True)  # (column-major, as the kept factor)
    L[:6, :6] = np.linalg.cholesky(K[:6, :6] - 1e-9 * np.eye(6))
    fpos = np.arange(8, dtype=np.int64)
    linalg.chol_update(L, 6, np.array([2], dtype=np.int64), fpos,
                       np.array([6, 7], dtype=np.int64), K, 1e-9)
    # the uniqueness test with tied tokens appends their rows from Python
    # (compiled.tied_positive_definite), then takes them off
    if linalg.chol_append_block(L, 7, np.ascontiguousarray(K[7:8, :7]), np.ones((1, 1)), 1e-9):
        L[7, :8] = 0.0
    n = linalg.chol_hole(L, 1, 7)  # (the kept factor's trim, SlotState.release_margin_gram)
    linalg.chol_compact(L, n, np.arange(n) != 1)  # (its holes closed)
    linalg.positive_definite(np.ascontiguousarray(K[:6, :6]), 1e-10)
    # the batch finish's delete from its factor (operations.batch._margin_system)
    linalg.chol_delete(np.asfortranarray(np.linalg.cholesky(K[:6, :6] + np.eye(6))), 2, 6)


def _compile_cache_rebuild(rng: np.random.Generator) -> None:
    """The compiled column routine a pickle's or a state file's cache rebuild calls
    (:mod:`svattn.exact.records.kcache`), which only a column the batch routine does not
    reproduce reaches, with the types it passes: the Fortran-ordered cache, the keys."""
    x = rng.normal(size=(6, 3))
    for is_rbf in (True, False):  # (a one-column scratch is typed C-ordered by numba)
        for cache in (np.zeros((6, 2), order="F"), np.zeros((6, 1))):
            columns.kernel_column(cache, x, np.ones(6), 1, 0, 6, 0.5, is_rbf)


def compile_all() -> float:
    """Run every operation of the compiled backend on tiny memories; return seconds."""
    t0 = time.perf_counter()
    rng = np.random.default_rng(0)
    _compile_kept_factor(rng)
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
    # the batch path of a large rbf block (libsvm warm start, ingest.add_block)
    SVDDMemory(C=1 / 60, kernel="rbf").extend(rng.normal(size=(600, 3)))
    _compile_cache_rebuild(rng)
    return time.perf_counter() - t0


def main() -> int:
    seconds = compile_all()
    print(f"svattn: the exact core's compiled kernels are ready ({seconds:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

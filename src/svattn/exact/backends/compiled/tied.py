"""The uniqueness test of an optimum with tokens tied at ``g = 0``, compiled: the block of
the margin set and the tied tokens minus ``1e-10·trace`` must be positive definite
(:func:`svattn.exact.backends.reference.tied_positive_definite`). The kept factor tells
where it can (:func:`on_kept_factor`: the tied tokens' rows appended, O(|S|²·t)); else
the general test gathers the block from the keys and factors it whole (the reference's
:func:`~svattn.exact.backends.reference.tied_block_test` with this backend's
factorization, O(|S|³): 170-200 ms at 2,184-2,401 margin tokens, where the kept factor
took 1.4-1.8 ms, ``benchmarks/bench_tied_uniqueness.py``; 4 of 600 support
forgets of the distinct ICU rows left a tied token).

Every temporary holding keys or kernel values is zeroed before it is freed, on every
path (an exception included): the tied tokens' keys, their kernel rows against the
margin set, their own block, the whole block of the general test. A tied token may be
removed later, and nothing of a removed token survives in freed memory
(``tests/exact/test_attack_tied_uniqueness.py`` scans the process's memory for it).

The package (:mod:`svattn.exact.backends.compiled`) passes its own margin test and
general factorization in (this module does not import it).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from svattn.exact.backends import reference
from svattn.exact.backends.compiled import linalg
from svattn.exact.core.cache import take_rows
from svattn.exact.core.gram import locate
from svattn.exact.core.kernels import gram_matrix
from svattn.exact.core.state import SlotState, scrub

MarginTest = Callable[[SlotState, np.ndarray], bool]
BlockTest = Callable[[np.ndarray, float], bool]


def tied_positive_definite(ss: SlotState, tied: np.ndarray, margin_test: MarginTest,
                           block_test: BlockTest, kept_from: int) -> bool:
    """The kept factor's verdict where it gives one (:func:`on_kept_factor`), else
    :func:`~svattn.exact.backends.reference.tied_block_test`'s (the general test) with
    ``block_test``."""
    if on_kept_factor(ss, tied, margin_test, kept_from):
        return True
    return reference.tied_block_test(ss, tied, block_test)


def on_kept_factor(ss: SlotState, tied: np.ndarray, margin_test: MarginTest,
                   kept_from: int) -> bool:
    """True when the kept factor proves the block of the margin set and ``tied`` minus
    ``1e-10·trace`` positive definite: the factor brought to the margin set
    (``margin_test``, the package's ``margin_positive_definite``), the tied tokens' rows
    appended at its shift and taken off again (zeroed). Its shift must be at least
    ``1e-10·trace`` of the whole block (a larger shift's verdict holds for the smaller:
    ``gram.py`` says why the kept factor's is doubled). False where it cannot tell: no
    current ``K_SS`` or factor, a smaller shift, no room, an append that fails."""
    t = len(tied)
    # the buffer first: one too small for the cache's columns is replaced by zeros, and
    # a K_SS read before that would be read as zeros (its trace 0: too small a shift)
    kss_buffer = ss.gram_buffer()
    kss = ss.current_margin_gram()
    if kss is None or ss.nS < kept_from or not margin_test(ss, kss_buffer):
        return False
    f, margin = ss.pd_factor, ss.margin_ids()
    shift = 1e-10 * (float(np.trace(kss)) + float(ss.diag[tied].sum()))
    if f is None or f.shift < shift or f.n + t > min(f.L.shape) or not f.within(margin):
        return False
    KC = ss.KC
    if not KC.flags.f_contiguous:  # (always column-major: the read below needs a view)
        return False
    found, where = locate(f.ids, margin)  # (a hole's row: 0 against it)
    B = np.zeros((t, f.n))
    D = keys = None
    try:
        # the tied tokens' rows of the margin columns read straight into B (a fancy
        # index's copy was freed unzeroed; take_rows: no buffered copy either)
        at = tied[:, None] + KC.shape[0] * np.where(found, where, 0)[None, :]
        take_rows(KC.reshape(-1, order="F"), at, B)
        B[:, ~found] = 0.0
        keys = ss.X[tied]
        D = gram_matrix(keys, ss.kernel, ss.gamma_value)
        return bool(linalg.chol_append_block(f.L, f.n, B, D, f.shift))
    finally:  # the appended rows off the factor; keys and kernel values scrubbed
        f.L[f.n:f.n + t, :f.n + t] = 0.0
        scrub(B)
        for a in (D, keys):
            if a is not None:
                scrub(a)

"""The batch re-solve holds one Gram matrix, not four (``solver.resolve``).

Its pairwise copy test (``svattn.exact.core.kernels.copy_groups``) went over n×n distance and
comparison matrices, three float64 temporaries the size of K (the warm-up
threshold solve peaked at ~32·n² bytes); it now goes one row at a time. numpy's
allocations are traced by tracemalloc.
"""

from __future__ import annotations

import tracemalloc

import numpy as np

from svattn.exact.core.kernels import copy_groups, gram_matrix


def _groups_by_matrix(K, diag):  # the former whole-matrix form: the reference
    dist = diag[:, None] + diag[None, :] - 2.0 * K
    same = dist <= 1e-13 * (diag[:, None] + diag[None, :])
    group = np.full(len(diag), -1)
    reps = []
    for i in range(len(diag)):
        if group[i] < 0:
            members = np.flatnonzero(same[i] & (group < 0))
            group[members] = len(reps)
            reps.append(i)
    return group, reps


def test_copy_groups_equal_the_matrix_form_with_row_temporaries():
    rng = np.random.default_rng(4)
    n = 1500
    x = rng.normal(size=(n, 6))
    x[7] = x[3]
    x[100:110] = x[50]
    x[200] = x[201] + 1e-9  # near, not a copy at rbf gamma 1/6
    for kernel, scale in (("rbf", 1.0), ("exp", 0.3)):
        K = gram_matrix(scale * x, kernel, 1 / 6)
        diag = np.diag(K).copy()
        tracemalloc.start()
        try:
            group, reps = copy_groups(K)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        g2, r2 = _groups_by_matrix(K, diag)
        assert (group == g2).all() and reps == r2
        assert len(reps) < n - 10
        assert peak < 200 * n, f"{kernel}: traced peak {peak} bytes (n = {n})"

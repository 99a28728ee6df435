"""Kernels of the SV memory (float64: numpy, and numba for the distances).

Two kernels are supported (``docs/design.md`` §1):

========  =====================  =============
name      k(x, y)                default gamma
========  =====================  =============
``rbf``   exp(-gamma·‖x − y‖²)   1 / d
``exp``   exp(gamma · x·y)       1 / sqrt(d)
========  =====================  =============

Every function here returns ``log k`` or ``k`` computed the same way, so the
incremental solver, the oracle and the readout agree to the last bit on the
same inputs.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

KERNELS = ("rbf", "exp")

# exp() of anything above this overflows float64.
LOG_MAX = math.log(np.finfo(np.float64).max)


class KernelOverflowError(ValueError):
    """Raised when a kernel value would overflow float64 (``exp`` kernel)."""


def check_kernel(kernel: str) -> str:
    """Return ``kernel`` if it is a supported kernel name, else raise ``ValueError``."""
    if kernel not in KERNELS:
        raise ValueError(f"kernel must be one of {KERNELS}, got {kernel!r}")
    return kernel


def default_gamma(kernel: str, dim: int) -> float:
    """Default bandwidth: ``1/d`` for ``rbf``, ``1/sqrt(d)`` for ``exp``."""
    check_kernel(kernel)
    if dim < 1:
        raise ValueError(f"dim must be >= 1, got {dim}")
    return 1.0 / dim if kernel == "rbf" else 1.0 / math.sqrt(dim)


def sq_distances(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Squared distances ``‖x_i − y_j‖² = Σ_k (x_ik − y_jk)²`` (m, n), from differences.

    Never ``‖x‖² + ‖y‖² − 2 x·y``: that form loses ``~1e-16·(‖x‖² + ‖y‖²)`` to
    cancellation, so keys far from the origin get wrong kernel values (a cloud
    shifted by 1e7 moved α by ~3e-3). Differences keep the relative accuracy of
    the distance itself, so rbf kernel values are translation invariant (up to
    the rounding of the keys). Cost O(d) per entry, like the dot product.

    Examples
    --------
    >>> import numpy as np
    >>> x = np.array([[1e8, 0.0], [1e8 + 1.0, 1.0]])
    >>> sq_distances(x, x)
    array([[0., 2.],
           [2., 0.]])
    """
    x = np.ascontiguousarray(x, dtype=np.float64)
    if len(y) < _WIDE:
        return _sq_dist(x, np.ascontiguousarray(y, dtype=np.float64))
    return _sq_dist_wide(x, np.ascontiguousarray(np.asarray(y, dtype=np.float64).T))


# Compiled loops, not scipy's cdist/pdist: importing scipy.spatial (it pulls in
# scipy.sparse, scipy.linalg, unittest, cffi, ...) cost a fresh process ~1 s on its
# first operation; the same difference loop compiled is ready in milliseconds.
@njit(cache=True)
def _sq_dist(x: np.ndarray, y: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
    m, n, d = x.shape[0], y.shape[0], x.shape[1]
    out = np.empty((m, n))
    for i in range(m):
        for j in range(n):
            s = 0.0
            for k in range(d):
                t = x[i, k] - y[j, k]
                s += t * t
            out[i, j] = s
    return out


# From this many columns on, the loop runs across columns (each entry still sums its
# d terms in order, so the result is bitwise the same): it vectorizes, ~2-3x faster.
_WIDE = 32


@njit(cache=True)
def _sq_dist_wide(x: np.ndarray, yT: np.ndarray) -> np.ndarray:  # pragma: no cover
    """:func:`_sq_dist` of ``x`` (m, d) and ``y`` given transposed (d, n), accumulated
    over k for all columns at once (the same additions per entry, in the same order)."""
    m, d, n = x.shape[0], yT.shape[0], yT.shape[1]
    out = np.empty((m, n))
    acc = np.empty(n)
    for i in range(m):
        acc[:] = 0.0
        for k in range(d):
            xik = x[i, k]
            for j in range(n):
                t = xik - yT[k, j]
                acc[j] += t * t
        out[i, :] = acc
    return out


def sq_distances_t(x: np.ndarray, yT: np.ndarray, out: np.ndarray | None = None
                   ) -> np.ndarray:
    """:func:`sq_distances` of ``x`` (m, d) and ``y`` given transposed and C-ordered,
    ``yT`` (d, n): the same values, bit for bit, without the transposed copy of ``y``
    that :func:`sq_distances` makes (a caller that scrubs key copies keeps ``yT``);
    into ``out`` (m, n, C-ordered rows) when given, without a temporary."""
    x = np.ascontiguousarray(x, dtype=np.float64)
    if yT.shape[1] < _WIDE:
        d = _sq_dist(x, np.ascontiguousarray(yT.T))
        if out is None:
            return d
        out[:] = d
        return out
    if out is None:
        return _sq_dist_wide(x, yT)
    _sq_dist_wide_into(x, yT, out)
    return out


@njit(cache=True)
def _sq_dist_wide_into(x: np.ndarray, yT: np.ndarray, out: np.ndarray) -> None:  # pragma: no cover
    """:func:`_sq_dist_wide` written into ``out`` (the same additions, in order)."""
    m, d, n = x.shape[0], yT.shape[0], yT.shape[1]
    for i in range(m):
        row = out[i]
        row[:] = 0.0
        for k in range(d):
            xik = x[i, k]
            for j in range(n):
                t = xik - yT[k, j]
                row[j] += t * t


@njit(cache=True)
def _sq_dist_pairs(x: np.ndarray) -> np.ndarray:  # pragma: no cover - compiled
    """Symmetric squared distances, each pair computed once (zero diagonal)."""
    n, d = x.shape[0], x.shape[1]
    out = np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1, n):
            s = 0.0
            for k in range(d):
                t = x[i, k] - x[j, k]
                s += t * t
            out[i, j] = s
            out[j, i] = s
    return out


def log_kernel(x: np.ndarray, y: np.ndarray, kernel: str, gamma: float) -> np.ndarray:
    """``log k(x_i, y_j)`` for rows of ``x`` (m, d) and ``y`` (n, d) → (m, n).

    The rbf squared distance comes from differences (:func:`sq_distances`).
    """
    if kernel == "rbf":
        sq = sq_distances(x, y)
        sq *= -gamma
        return sq
    out = x @ y.T
    out *= gamma
    return out


def kernel_matrix(x: np.ndarray, y: np.ndarray, kernel: str, gamma: float) -> np.ndarray:
    """Kernel matrix ``k(x_i, y_j)`` (m, n) in float64.

    Raises
    ------
    KernelOverflowError
        If an ``exp`` kernel entry would overflow float64.

    Examples
    --------
    >>> import numpy as np
    >>> x = np.array([[0.0, 0.0], [1.0, 0.0]])
    >>> np.round(kernel_matrix(x, x, "rbf", 0.5), 4)
    array([[1.    , 0.6065],
           [0.6065, 1.    ]])
    """
    logk = log_kernel(x, y, kernel, gamma)
    if kernel == "exp" and logk.size and float(logk.max()) >= LOG_MAX:
        raise KernelOverflowError(
            f"exp kernel overflows float64: gamma·x·y reaches {float(logk.max()):.4g} "
            f"(limit {LOG_MAX:.1f}); scale the keys down or lower gamma"
        )
    return np.exp(logk, out=logk)


def kernel_diag(x: np.ndarray, kernel: str, gamma: float) -> np.ndarray:
    """``k(x_i, x_i)`` for each row: 1 for ``rbf``, ``exp(gamma‖x‖²)`` for ``exp``."""
    if kernel == "rbf":
        return np.ones(x.shape[0])
    logd = gamma * np.einsum("ij,ij->i", x, x)
    if logd.size and float(logd.max()) >= LOG_MAX:
        raise KernelOverflowError(
            f"exp kernel overflows float64: gamma·‖x‖² reaches {float(logd.max()):.4g} "
            f"(limit {LOG_MAX:.1f}); scale the keys down or lower gamma"
        )
    return np.exp(logd)


def biased_softmax_readout(
    queries: np.ndarray,
    keys: np.ndarray,
    values: np.ndarray,
    alpha: np.ndarray,
    kernel: str,
    gamma: float,
) -> np.ndarray:
    """``softmax_i(log alpha_i + log k(q, x_i)) · V`` over the tokens with alpha > 0.

    The SV readout ``sum alpha_i k(q,x_i) v_i / sum alpha_i k(q,x_i)``, computed
    max-subtracted in log space (never as the raw ratio).

    Examples
    --------
    >>> import numpy as np
    >>> x = np.array([[0.0], [1.0]]); v = np.array([[1.0], [3.0]])
    >>> biased_softmax_readout(np.array([[0.5]]), x, v, np.array([0.5, 0.5]), "rbf", 1.0)
    array([[2.]])
    """
    keep = alpha > 0
    logits = log_kernel(queries, keys[keep], kernel, gamma)
    logits += np.log(alpha[keep])[None, :]
    logits -= logits.max(axis=1, keepdims=True)
    w = np.exp(logits, out=logits)
    w /= w.sum(axis=1, keepdims=True)
    return w @ values[keep]


def gram_matrix(x: np.ndarray, kernel: str, gamma: float) -> np.ndarray:
    """Symmetric Gram matrix of the rows of ``x`` with the exact diagonal ``k(x, x)``.

    Every from-scratch solve (re-solves, the oracle's callers, verification)
    uses this form. rbf: each pair's distance once, so ``K`` is
    symmetric and ``K_ii = exp(0) = 1`` exactly by construction; ``exp``: the
    product ``x xᵀ`` leaves ~1e-16 in ``K − Kᵀ`` and on the diagonal, so the
    diagonal is set exactly and ``K`` symmetrised.

    Examples
    --------
    >>> import numpy as np
    >>> K = gram_matrix(np.array([[0.0], [1.0]]), "rbf", 1.0)
    >>> bool(np.all(np.diag(K) == 1.0)), bool(np.all(K == K.T))
    (True, True)
    """
    if kernel == "rbf":
        K = _sq_dist_pairs(np.ascontiguousarray(x, dtype=np.float64))
        K *= -gamma
        return np.exp(K, out=K)
    K = kernel_matrix(x, x, kernel, gamma)
    np.fill_diagonal(K, kernel_diag(x, kernel, gamma))
    K += K.T
    K *= 0.5
    return K


def decision_values(
    queries: np.ndarray,
    keys: np.ndarray,
    alpha: np.ndarray,
    mu: float,
    kernel: str,
    gamma: float,
) -> np.ndarray:
    """``R² − ‖phi(q) − a‖² = 2 sum_i alpha_i k(q, x_i) − k(q, q) + mu`` per query row.

    Positive inside the description (scikit-learn's sign convention).

    Examples
    --------
    >>> import numpy as np
    >>> decision_values(np.zeros((1, 1)), np.zeros((1, 1)), np.ones(1), -1.0, "rbf", 1.0)
    array([0.])
    """
    keep = alpha > 0
    Kq = kernel_matrix(queries, keys[keep], kernel, gamma)
    return 2.0 * (Kq @ alpha[keep]) - kernel_diag(queries, kernel, gamma) + mu

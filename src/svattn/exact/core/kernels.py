"""Kernels of the SV memory (float64: numpy, and numba for the distances).

A kernel is an object that owns its formulas (:class:`Kernel`; ``docs/design.md`` §1);
its name is the public spelling (constructor arguments, files, receipts keep the
string, resolved by :func:`get_kernel`). Two are registered:

========  =====================  =============  ===========================
name      k(x, y)                default gamma  dot form ``(s, c)``
========  =====================  =============  ===========================
``rbf``   exp(-gamma·‖x − y‖²)   1 / d          ``(2·gamma, gamma)``
``exp``   exp(gamma · x·y)       1 / sqrt(d)    ``(gamma, 0)``
========  =====================  =============  ===========================

Both are of the *dot form* ``log k(x, y) = s·x·y − c·‖x‖² − c·‖y‖²``, on which every
vectorised formula is written once: the torch layers' kernel matrix (one
``baddbmm``), their readout (scores ``s·q·x``, per-key bias ``−c‖x‖²``) and their
closed-form gradients (``∂ log k(x, y)/∂x = s·y − 2c·x``).

Every function here returns ``log k`` or ``k`` computed the same way, so the
incremental solver, the oracle and the readout agree to the last bit on the
same inputs.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import njit

from svattn.exact.core.compiling import quick_load

#: The built-in kernels' names (:func:`kernel_names` also lists registered ones).
KERNELS = ("rbf", "exp")

# exp() of anything above this overflows float64.
LOG_MAX = math.log(np.finfo(np.float64).max)


class KernelOverflowError(ValueError):
    """Raised when a kernel value would overflow float64 (``exp`` kernel)."""


class Kernel:
    """One kernel's formulas: the base of :class:`RBFKernel` and :class:`ExpKernel`.

    A kernel of the dot form ``log k(x, y) = s·x·y − c‖x‖² − c‖y‖²`` (``s > 0``:
    positive definite, as ``exp(s·x·y)`` times a rank-one positive factor; see
    :func:`check_positive_definite`)
    defines :attr:`name`, the flags, :meth:`default_gamma` and :meth:`dot_form`; every
    other formula here follows from those and serves the exact core (numpy float64),
    the oracle's Gram matrix and the torch layers (:mod:`svattn.nn`) alike. A
    subclass overrides a formula only to compute the same values in another order
    (:class:`RBFKernel`: distances from differences) or, for a kernel not of the dot
    form, all of them (the torch layers' fast paths need the dot form).

    The methods marked *array-generic* use only operators and methods that numpy
    arrays and torch tensors share (``+ - * @``, ``.clip``, ``.sum``, indexing), so
    :mod:`svattn.nn` runs them on tensors (with autograd) while this package never
    imports torch. The others are the core's, numpy float64.

    Attributes
    ----------
    name : str
        The public spelling (files and receipts store it).
    compiled_flag : bool or None
        The argument the backends' kernels take for it (their ``is_rbf``); ``None``:
        no variant in the SV memory's backends (:class:`~svattn.exact.SVDDMemory`
        refuses the kernel; the oracle and the torch layers still take it). A flag
        selects formulas written for one class (True: :class:`RBFKernel`, False:
        :class:`ExpKernel`); a subclass that inherits it is refused there too.
    unit_diagonal : bool
        ``k(x, x) = 1`` for every ``x`` (the core's unit of g is 1; the torch layers'
        diagonal is a constant, with no gradient).
    bounded : bool
        ``k <= 1`` everywhere, so ``log k`` never overflows (no overflow checks).
    """

    name: str = ""
    compiled_flag: bool | None = None
    unit_diagonal: bool = False
    bounded: bool = False

    def default_gamma(self, dim: int) -> float:
        """Default bandwidth for keys of dimension ``dim`` (>= 1)."""
        raise NotImplementedError

    def dot_form(self, gamma: float) -> tuple[float, float]:
        """``(s, c)`` with ``log k(x, y) = s·x·y − c‖x‖² − c‖y‖²`` at bandwidth ``gamma``."""
        raise NotImplementedError(f"the {self.name!r} kernel is not of the dot form")

    def diag_scale(self, gamma: float) -> float:
        """``e`` with ``log k(x, x) = e‖x‖²`` (``e = s − 2c``; 0 for a unit diagonal)."""
        s, c = self.dot_form(gamma)
        return s - 2.0 * c

    # ---------------------------------------------------------- array-generic
    def log_from_dots(self, xy: Any, xx: Any, yy: Any, gamma: float) -> Any:
        """``log k`` from dot products ``xy`` ``(..., M, N)`` and squared norms ``xx``
        ``(..., M, 1)``, ``yy`` ``(..., 1, N)`` (array-generic)."""
        s, c = self.dot_form(gamma)
        out = s * xy
        if c:
            out = out - c * xx - c * yy
        return out

    def log_diag(self, xx: Any, gamma: float) -> Any:
        """``log k(x, x)`` from the squared norms ``xx`` (array-generic)."""
        return self.diag_scale(gamma) * xx

    def dlog_dx(self, x: Any, y: Any, gamma: float) -> Any:
        """``∂ log k(x_i, y_j) / ∂x_i``: x ``(..., M, D)``, y ``(..., N, D)`` →
        ``(..., M, N, D)`` (array-generic)."""
        s, c = self.dot_form(gamma)
        return s * y[..., None, :, :] - (2.0 * c) * x[..., :, None, :]

    def dlog_dy(self, x: Any, y: Any, gamma: float) -> Any:
        """``∂ log k(x_i, y_j) / ∂y_j`` → ``(..., M, N, D)`` (array-generic; ``k`` is
        symmetric, so this is :meth:`dlog_dx` with the arguments' roles swapped)."""
        s, c = self.dot_form(gamma)
        return s * x[..., :, None, :] - (2.0 * c) * y[..., None, :, :]

    # ------------------------------------------------------- numpy float64 core
    def log_kernel(self, x: np.ndarray, y: np.ndarray, gamma: float) -> np.ndarray:
        """``log k(x_i, y_j)`` (m, n), float64: one product ``x yᵀ`` (dot form)."""
        s, c = self.dot_form(gamma)
        out = x @ y.T
        out *= s
        if c:
            out -= (c * np.einsum("ij,ij->i", x, x))[:, None]
            out -= (c * np.einsum("ij,ij->i", y, y))[None, :]
        return out

    def log_bound(self, top: float, gamma: float) -> float:
        """An upper bound of ``log k(x, y)`` over keys with ``‖x‖², ‖y‖² <= top``
        (dot form: ``s·x·y − c(‖x‖² + ‖y‖²) <= (s/2 − c)(‖x‖² + ‖y‖²)``)."""
        return max(self.diag_scale(gamma), 0.0) * top

    def check_overflow(self, top: float, what: str, fix: str = "scale the keys down or lower gamma"
                       ) -> None:
        """Raise :class:`KernelOverflowError` if ``top`` (the largest ``log k`` of
        ``what``) would overflow ``exp`` in float64; nothing for a bounded kernel."""
        if not self.bounded and top >= LOG_MAX:
            raise KernelOverflowError(
                f"{self.name} kernel overflows float64: {what} reaches {top:.4g} "
                f"(limit {LOG_MAX:.1f}); {fix}"
            )

    def diag(self, x: np.ndarray, gamma: float) -> np.ndarray:
        """``k(x_i, x_i)`` for each row (1 for a unit diagonal), overflow checked."""
        if self.unit_diagonal:
            return np.ones(x.shape[0])
        logd = self.log_diag(np.einsum("ij,ij->i", x, x), gamma)
        if logd.size:
            self.check_overflow(float(logd.max()), "log k(x, x)")
        return np.exp(logd)

    def gram(self, x: np.ndarray, gamma: float) -> np.ndarray:
        """Symmetric Gram matrix with the exact diagonal (:func:`gram_matrix`): the
        product leaves ~1e-16 in ``K − Kᵀ`` and on the diagonal, so the diagonal is set
        exactly and ``K`` symmetrised."""
        K = kernel_matrix(x, x, self, gamma)
        np.fill_diagonal(K, self.diag(x, gamma))
        K += K.T
        K *= 0.5
        return K

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class RBFKernel(Kernel):
    """``k(x, y) = exp(−gamma‖x − y‖²)``: unit diagonal, bounded, default gamma ``1/d``.

    The core's distances come from differences (:func:`sq_distances`), never from the
    dot form's ``‖x‖² + ‖y‖² − 2x·y`` (cancellation); the torch layers' one-matmul form
    clips that at 0 (:meth:`log_from_dots`).
    """

    name = "rbf"
    compiled_flag = True
    unit_diagonal = True
    bounded = True

    def default_gamma(self, dim: int) -> float:
        return 1.0 / dim

    def dot_form(self, gamma: float) -> tuple[float, float]:
        return 2.0 * gamma, gamma

    def log_from_dots(self, xy: Any, xx: Any, yy: Any, gamma: float) -> Any:
        """``−gamma·max(‖x‖² + ‖y‖² − 2 x·y, 0)`` (array-generic)."""
        sq = xx + yy - 2.0 * xy
        return -gamma * sq.clip(min=0.0)

    def log_kernel(self, x: np.ndarray, y: np.ndarray, gamma: float) -> np.ndarray:
        """``−gamma‖x_i − y_j‖²`` with the distances from differences."""
        sq = sq_distances(x, y)
        sq *= -gamma
        return sq

    def gram(self, x: np.ndarray, gamma: float) -> np.ndarray:
        """Each pair's distance once: ``K`` symmetric and ``K_ii = exp(0) = 1`` exactly."""
        K = _sq_dist_pairs(np.ascontiguousarray(x, dtype=np.float64))
        K *= -gamma
        return np.exp(K, out=K)


class ExpKernel(Kernel):
    """``k(x, y) = exp(gamma x·y)``: default gamma ``1/sqrt(d)``; overflows float64
    (:class:`KernelOverflowError`) rather than return inf."""

    name = "exp"
    compiled_flag = False

    def default_gamma(self, dim: int) -> float:
        return 1.0 / math.sqrt(dim)

    def dot_form(self, gamma: float) -> tuple[float, float]:
        return gamma, 0.0


_REGISTRY: dict[str, Kernel] = {k.name: k for k in (RBFKernel(), ExpKernel())}

# The class whose formulas each compiled variant computes: a flag is honoured for that
# class only (a subclass inherits the flag, not the variant, once it changes a formula).
_VARIANT_OF_FLAG: dict[bool, type] = {True: RBFKernel, False: ExpKernel}


def register_kernel(kernel: Kernel) -> Kernel:
    """Make ``kernel`` known by its name to :func:`get_kernel` (and everything that
    resolves a name through it); a registered name cannot be taken again.

    The kernel must be positive definite (:func:`check_positive_definite`): the SVDD
    dual is a convex problem with a unique optimum only then.

    Raises
    ------
    TypeError
        ``kernel`` is not a :class:`Kernel` with a name.
    ValueError
        The name is taken, or the kernel is not positive definite (the message says
        why: its dot form's ``s``, or a Gram matrix with a negative eigenvalue).
    """
    if not isinstance(kernel, Kernel) or not isinstance(kernel.name, str) or not kernel.name:
        raise TypeError(f"kernel must be a Kernel with a name, got {kernel!r}")
    if kernel.name in _REGISTRY:
        raise ValueError(f"a kernel named {kernel.name!r} is already registered")
    check_positive_definite(kernel)
    _REGISTRY[kernel.name] = kernel
    return kernel


# The bandwidths (relative to the default) and key dimensions a registration probes.
_PROBE_GAMMA_SCALES = (0.01, 1.0, 100.0)
_PROBE_DIMS = (1, 3, 8)


def check_positive_definite(kernel: Kernel) -> None:
    """Raise ``ValueError`` unless ``kernel`` is positive definite, saying why.

    A kernel of the dot form ``log k(x, y) = s·x·y − c‖x‖² − c‖y‖²`` is
    ``k = exp(s·x·y)·f(x)·f(y)`` with ``f = exp(−c‖·‖²) > 0``; a Gram matrix is then
    ``D·E·D`` with ``D = diag(f) > 0`` and ``E = [exp(s·x_i·x_j)]``, so ``k`` is positive
    definite exactly when ``E`` is. For ``s > 0``, ``E = exp(s·x·y)`` is the Gaussian
    kernel ``exp(−(s/2)‖x − y‖²)`` times ``exp((s/2)‖x‖²)·exp((s/2)‖y‖²)``: strictly
    positive definite on distinct keys, whatever ``c``. For ``s = 0`` it is the rank-one
    ``f fᵀ``; for ``s < 0`` the keys ``x = ±1`` (d = 1) give ``det E = e^{2s} − e^{−2s} <
    0``. So the dot form is checked exactly: ``s > 0`` at every probed bandwidth.

    Every kernel (dot form or not) is also probed numerically: its Gram matrices on
    random keys (and the pair ``±1``) at several bandwidths and dimensions must be
    symmetric and have no eigenvalue below ``−1e-9`` times their largest entry (a
    probe whose matrix overflows is skipped; at least one must be finite). A probe
    can miss a kernel that fails only elsewhere; it is a guard, not a proof.

    Examples
    --------
    >>> check_positive_definite(get_kernel("rbf"))
    >>> class Flipped(ExpKernel):
    ...     name = "flipped"
    ...     def dot_form(self, gamma):
    ...         return -gamma, 0.0
    >>> check_positive_definite(Flipped())  # doctest: +ELLIPSIS
    Traceback (most recent call last):
        ...
    ValueError: kernel 'flipped' is not positive definite: its dot form has s = -0.01 < 0 ...
    """
    name = kernel.name
    rng = np.random.default_rng(0)
    judged = 0
    for dim in _PROBE_DIMS:
        base = kernel.default_gamma(dim)
        for scale in _PROBE_GAMMA_SCALES:
            gamma = base * scale
            try:
                s, _ = kernel.dot_form(gamma)
            except NotImplementedError:
                s = None
            if s is not None and not s > 0:
                raise ValueError(
                    f"kernel {name!r} is not positive definite: its dot form has s = {s:.4g} "
                    f"{'<' if s < 0 else '='} 0 at gamma = {gamma:.4g} (log k(x, y) = "
                    f"s·x·y − c‖x‖² − c‖y‖² is positive definite exactly when s > 0); the "
                    f"SVDD dual needs a positive definite kernel for a unique optimum")
            keys = np.concatenate([np.eye(1, dim), -np.eye(1, dim),
                                   rng.normal(size=(10, dim)) / math.sqrt(dim)])
            with np.errstate(all="ignore"):
                K = np.exp(np.asarray(kernel.log_kernel(keys, keys, gamma), dtype=np.float64))
            if not np.all(np.isfinite(K)):
                continue  # an unbounded kernel overflowing here: no verdict from this probe
            judged += 1
            why = _not_positive_definite(K)
            if why:
                raise ValueError(
                    f"kernel {name!r} is not positive definite: on {len(keys)} keys of "
                    f"dimension {dim} at gamma = {gamma:.4g} its Gram matrix {why}; the SVDD "
                    f"dual needs a positive definite kernel for a unique optimum")
    if not judged:
        raise ValueError(f"kernel {name!r} cannot be checked positive definite: its Gram "
                         f"matrix on the probe's keys is never finite")


def _not_positive_definite(K: np.ndarray) -> str:
    """Why the probe's finite Gram matrix ``K`` fails (empty when it is symmetric and
    without a negative eigenvalue beyond rounding)."""
    top = float(np.abs(K).max())
    if not np.allclose(K, K.T, rtol=1e-12, atol=1e-12 * top):
        return "is not symmetric (k(x, y) != k(y, x))"
    low = float(np.linalg.eigvalsh(0.5 * (K + K.T))[0])
    if low < -1e-9 * top:
        return f"has the eigenvalue {low:.4g} < 0"
    return ""


# Kernel diagonals k(x, x) spanning more than this factor in log (ln 2**52, float64's
# relative precision; exp-kernel keys with gamma·‖x‖² from 0 to 40, or 500 to 700) put
# the solver's g of the smallest keys below the rounding of the largest: trusted alone,
# the drive's running updates of g accepted wrong optima there (KKT residual 1.0 on a
# fresh g, 24 of 1,500 random exp-kernel draws above the span).
WIDE_DIAGONAL = math.log(2.0**52)


def diagonal_log_span(diag: np.ndarray) -> float:
    """``max log k(x, x) − min log k(x, x)`` over kernel diagonals ``diag`` (n >= 1; inf
    if one underflowed to 0)."""
    low = float(diag.min())
    return math.inf if low <= 0 else math.log(float(diag.max())) - math.log(low)


def wide_diagonal_advice(span: float) -> str:
    """Why keys whose diagonals span ``span`` (in log) beyond :data:`WIDE_DIAGONAL` may
    have no exact float64 optimum, and what to do ('' within the span)."""
    if not span > WIDE_DIAGONAL:
        return ""
    return (f"; the keys' kernel diagonals k(x, x) span a factor e^{span:.0f}, beyond "
            f"float64's precision (e^{WIDE_DIAGONAL:.0f}): the smallest keys' conditions "
            f"are below the rounding of the largest. Lower gamma or scale the keys down "
            f"(e.g. normalise them) so that log k(x, x) (gamma·‖x‖² for exp) varies by "
            f"less than {WIDE_DIAGONAL:.0f}")


def kernel_names() -> tuple[str, ...]:
    """The registered kernels' names (the built-in :data:`KERNELS` first)."""
    return tuple(_REGISTRY)


def get_kernel(kernel: str | Kernel) -> Kernel:
    """The :class:`Kernel` named ``kernel`` (a :class:`Kernel` is returned as it is).

    Raises
    ------
    ValueError
        If no kernel of that name is registered.

    Examples
    --------
    >>> get_kernel("rbf").dot_form(0.5)
    (1.0, 0.5)
    """
    try:
        return _REGISTRY[kernel]  # the hot case first: a name (per operation of the core)
    except (KeyError, TypeError):
        if isinstance(kernel, Kernel):
            return kernel
        raise ValueError(f"kernel must be one of {kernel_names()}, got {kernel!r}") from None


def check_kernel(kernel: str, *, compiled: bool = False, dot_form: bool = False) -> str:
    """Return ``kernel`` if it is a registered kernel name, else raise ``ValueError``;
    with ``compiled``, also one the SV memory's backends have a variant of; with
    ``dot_form``, also one of the dot form (what the torch layers run)."""
    if not isinstance(kernel, str):
        raise ValueError(f"kernel must be one of {kernel_names()}, got {kernel!r}")
    k = get_kernel(kernel)
    if dot_form:
        try:
            k.dot_form(1.0)
        except NotImplementedError:
            raise ValueError(
                f"kernel {kernel!r} is not of the dot form (log k(x, y) = s·x·y − c‖x‖² − "
                "c‖y‖², Kernel.dot_form), which the torch layers need") from None
    if compiled and not _has_variant(k):
        names = tuple(n for n, o in _REGISTRY.items() if _has_variant(o))
        why = ("compiled_flag is None" if k.compiled_flag is None else
               f"its compiled_flag {k.compiled_flag!r} selects the variant of "
               f"{_VARIANT_OF_FLAG.get(k.compiled_flag, Kernel).__name__}, which computes "
               "that class's formulas")
        raise ValueError(f"kernel {kernel!r} has no variant in the SV memory's backends "
                         f"({why}); the memory takes one of {names}")
    return kernel


def _has_variant(k: Kernel) -> bool:
    """Whether the backends compute ``k``'s own formulas: its flag names a variant and
    ``k`` is of the class that variant was written for."""
    return k.compiled_flag is not None and type(k) is _VARIANT_OF_FLAG.get(k.compiled_flag)


def default_gamma(kernel: str | Kernel, dim: int) -> float:
    """Default bandwidth: ``1/d`` for ``rbf``, ``1/sqrt(d)`` for ``exp``."""
    k = get_kernel(kernel)
    if dim < 1:
        raise ValueError(f"dim must be >= 1, got {dim}")
    return k.default_gamma(dim)


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
    xc, yc = np.ascontiguousarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    wide = len(yc) >= _WIDE
    yc = np.ascontiguousarray(yc.T if wide else yc)
    try:
        return _sq_dist_wide(xc, yc) if wide else _sq_dist(xc, yc)
    finally:  # a copy made here holds keys: zeroed before it is freed
        for c, a in ((xc, x), (yc, y)):
            if not (isinstance(a, np.ndarray) and np.may_share_memory(c, a)):
                c.fill(0.0)


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


def _sq_dist_wide(x: np.ndarray, yT: np.ndarray) -> np.ndarray:
    """:func:`_sq_dist` of ``x`` (m, d) and ``y`` given transposed (d, n), accumulated
    over k for all columns at once (the same additions per entry, in the same order)."""
    out = np.empty((x.shape[0], yT.shape[1]))
    _sq_dist_wide_into(x, yT, out)
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
    """:func:`_sq_dist_wide` written into ``out`` (m, n)."""
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


def log_kernel(x: np.ndarray, y: np.ndarray, kernel: str | Kernel, gamma: float
               ) -> np.ndarray:
    """``log k(x_i, y_j)`` for rows of ``x`` (m, d) and ``y`` (n, d) → (m, n)
    (:meth:`Kernel.log_kernel`; the rbf squared distance from differences,
    :func:`sq_distances`)."""
    return get_kernel(kernel).log_kernel(x, y, gamma)


def kernel_matrix(x: np.ndarray, y: np.ndarray, kernel: str | Kernel, gamma: float
                  ) -> np.ndarray:
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
    k = get_kernel(kernel)
    logk = k.log_kernel(x, y, gamma)
    if not k.bounded and logk.size:
        k.check_overflow(float(logk.max()), "log k(x, y)")
    return np.exp(logk, out=logk)


def kernel_diag(x: np.ndarray, kernel: str | Kernel, gamma: float) -> np.ndarray:
    """``k(x_i, x_i)`` for each row: 1 for ``rbf``, ``exp(gamma‖x‖²)`` for ``exp``."""
    return get_kernel(kernel).diag(x, gamma)


def biased_softmax_readout(
    queries: np.ndarray,
    keys: np.ndarray,
    values: np.ndarray,
    alpha: np.ndarray,
    kernel: str | Kernel,
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
    every = bool(keep.all())  # (else copies of keys and values: scrubbed, as the weights)
    k, v = (keys, values) if every else (keys[keep], values[keep])
    w = None
    try:
        w = log_kernel(queries, k, kernel, gamma)
        w += np.log(alpha[keep])[None, :]
        w -= w.max(axis=1, keepdims=True)
        np.exp(w, out=w)
        w /= w.sum(axis=1, keepdims=True)
        return w @ v
    finally:
        for a in ((w,) if every else (k, v, w)):
            if a is not None:
                a.fill(0.0)


def gram_matrix(x: np.ndarray, kernel: str | Kernel, gamma: float) -> np.ndarray:
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
    return get_kernel(kernel).gram(x, gamma)


def decision_values(
    queries: np.ndarray,
    keys: np.ndarray,
    alpha: np.ndarray,
    mu: float,
    kernel: str | Kernel,
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
    every = bool(keep.all())  # (else a copy of keys: scrubbed, as the kernel values)
    k, Kq = (keys if every else keys[keep]), None
    try:
        Kq = kernel_matrix(queries, k, kernel, gamma)
        return 2.0 * (Kq @ alpha[keep]) - kernel_diag(queries, kernel, gamma) + mu
    finally:
        for a in ((Kq,) if every else (k, Kq)):
            if a is not None:
                a.fill(0.0)


def copy_groups(K: np.ndarray) -> tuple[np.ndarray, list[int]]:
    """Keys the kernel cannot tell apart, ``K_ii + K_jj − 2K_ij ≤ 1e-13 (K_ii + K_jj)``
    (each pair at its own scale: a huge exp-kernel diagonal elsewhere must not merge
    ordinary keys): each token's group, and each group's first member. One row at a
    time, so the temporaries are O(n), not n×n.

    The diagonal is ``K``'s own, so every key is at distance exactly 0 from itself and
    lands in a group. (The stored ``k(x, x)`` of an exp-kernel key is the compiled
    scoring's, which can differ from the Gram matrix's in the last bits — ~1e-13
    relative at ``gamma‖x‖²`` of a few hundred — and a key then missed its own group.)
    """
    diag = np.diagonal(K)
    group = np.full(len(diag), -1)
    reps: list[int] = []
    for i in range(len(diag)):
        if group[i] < 0:
            pair = diag[i] + diag
            same = pair - 2.0 * K[i] <= 1e-13 * pair
            members = np.flatnonzero(same & (group < 0))
            group[members] = len(reps)
            reps.append(i)
    return group, reps


def has_equal_rows(rows: np.ndarray) -> bool:
    """True when two rows are bitwise equal (one sort of the rows' bytes). The sorted copy
    (and a contiguous copy of ``rows`` where one is made) is zeroed before it is freed:
    the rows are keys, and nothing of a removed token may survive in freed memory."""
    c = np.ascontiguousarray(rows)
    keys = np.sort(c.view(np.dtype((np.void, c.dtype.itemsize * c.shape[1]))).ravel())
    try:
        return bool((keys[1:] == keys[:-1]).any())
    finally:
        keys.view(np.uint8).fill(0)
        if c is not rows:
            c.fill(0)

quick_load(globals())  # cached kernels load without numba's registry refresh (core.compiling)

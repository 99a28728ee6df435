"""Input validation of the exact memory: precise errors, nothing touched.

Each check raises ``TypeError`` / ``ValueError`` naming the argument and what was
expected, and reads the :class:`~svattn.exact.core.state.SlotState` only (dimensions,
the stored norms for the exp kernel's overflow bound). A loaded state is input too:
:func:`optimality_error` says why its alpha is not the optimum of its tokens.
"""

from __future__ import annotations

import numpy as np

from svattn.exact.backends import reference
from svattn.exact.backends.compiled.reserve import sq_norm
from svattn.exact.backends.protocol import Backend
from svattn.exact.core.kernels import LOG_MAX, default_gamma, get_kernel
from svattn.exact.core.state import SlotState, scrub
from svattn.exact.operations.solver import resolve

_MAX_NORM2 = 1e300  # ‖x‖² bound: x·y and ‖x − y‖² ≤ 2(‖x‖² + ‖y‖²) stay finite in float64


def check_norms(x: np.ndarray, name: str) -> None:
    """Refuse rows whose squared norm would overflow the kernel arithmetic."""
    with np.errstate(over="ignore"):
        big = float(np.max(np.einsum("ij,ij->i", x, x), initial=0.0))
    if not big <= _MAX_NORM2:
        raise ValueError(f"{name} are too large: ‖x‖² reaches {big:.3g}, above {_MAX_NORM2:.0e} "
                         "(float64 kernel arithmetic would overflow); rescale the data")


def is_numeric(x) -> bool:
    """Whether ``x`` converts to an array of real numbers (bool, int or float).

    A conversion that fails because ``x`` is not such an array (ragged, or an object
    whose ``__array__`` refuses) answers False; running out of memory is not an
    answer about ``x``, so a ``MemoryError`` propagates.
    """
    try:
        arr = np.asarray(x)
    except MemoryError:
        raise
    except Exception:
        return False
    return arr.dtype.kind in "biuf"


def check_rows(ss: SlotState, keys, values, *, batch: bool) -> tuple[np.ndarray, np.ndarray | None]:
    """Validate keys/values without touching state; return float64 2-D arrays."""
    name_k, name_v = ("keys", "values") if batch else ("key", "value")
    k = np.asarray(keys, dtype=np.float64) if is_numeric(keys) else None
    if k is None:
        raise TypeError(f"{name_k} must be an array of real numbers")
    if batch:
        if k.ndim != 2:
            raise ValueError(f"keys must be 2-D (n, d), got shape {k.shape}")
    else:
        if k.ndim != 1:
            raise ValueError(f"key must be 1-D (d,), got shape {k.shape}")
        k = k[None, :]
    d = k.shape[1]
    if d == 0:
        raise ValueError(f"{name_k} must have dimension d >= 1, got shape {k.shape}")
    if ss.dim is not None and d != ss.dim:
        raise ValueError(f"{name_k} must have dimension d={ss.dim}, got {d}")
    if not np.isfinite(k).all():
        raise ValueError(f"{name_k} must be finite (no NaN or inf)")
    check_norms(k, name_k)
    v = None
    if values is not None:
        v = np.asarray(values, dtype=np.float64) if is_numeric(values) else None
        if v is None:
            raise TypeError(f"{name_v} must be an array of real numbers")
        if not batch:
            if v.ndim != 1:
                raise ValueError(f"value must be 1-D (dv,), got shape {v.shape}")
            v = v[None, :]
        elif v.ndim != 2:
            raise ValueError(f"values must be 2-D (n, dv), got shape {v.shape}")
        if v.shape[0] != k.shape[0]:
            raise ValueError(
                f"values must have one row per key: {v.shape[0]} values for {k.shape[0]} keys"
            )
        if ss.vdim is not None and (ss.value_is_key or v.shape[1] != ss.vdim):
            if ss.value_is_key:
                raise ValueError(
                    "this memory stores keys as values (the first token came without a "
                    "value); pass value=None"
                )
            raise ValueError(f"{name_v} must have dimension dv={ss.vdim}, got {v.shape[1]}")
        if not np.isfinite(v).all():
            raise ValueError(f"{name_v} must be finite (no NaN or inf)")
    elif ss.vdim is not None and not ss.value_is_key:
        raise ValueError(f"{name_v} is required: this memory stores values of dim {ss.vdim}")
    if not get_kernel(ss.kernel).bounded:
        check_exp_overflow(ss, k)
    return k, v

def plain_row(ss: SlotState, key, value) -> tuple[np.ndarray, np.ndarray | None] | None:
    """The common case of :func:`check_rows` for one row, in two operations: a float64
    C-contiguous, writable key (and value) of the memory's dimensions, a bounded kernel
    (rbf: no overflow check), whose ‖x‖²
    (one compiled sum: NaN or inf fail it) is well below the bound. Returns the (1, d)
    key and (1, dv) value, or None: then :func:`check_rows` decides (and names the error)."""
    if not (get_kernel(ss.kernel).bounded and ss.dim is not None and _plain(key, ss.dim)):
        return None
    if value is None:
        ok = ss.value_is_key
    else:
        ok = not ss.value_is_key and _plain(value, ss.vdim) and sq_norm(value) <= _FAST
    if not (ok and sq_norm(key) <= _FAST):
        return None
    return key[None, :], None if value is None else value[None, :]


_FAST = 0.5 * _MAX_NORM2  # clear of the bound (einsum and dot may round differently)


def _plain(a, d) -> bool:
    # (a read-only array would compile another signature of sq_norm at first use)
    return (type(a) is np.ndarray and a.dtype == np.float64 and a.ndim == 1
            and a.shape[0] == d and a.flags.c_contiguous and a.flags.writeable)


def check_exp_overflow(ss: SlotState, k: np.ndarray) -> None:
    """Raise :class:`~svattn.exact.core.kernels.KernelOverflowError` if a kernel value of a
    new key ``k`` against itself or a stored key would overflow (an unbounded kernel:
    exp): first the kernel's bound from the largest ‖x‖² (:meth:`Kernel.log_bound`),
    then, past it, the values themselves."""
    kern = get_kernel(ss.kernel)
    gamma = ss.gamma if ss.gamma is not None else default_gamma(kern, k.shape[1])
    stored = float(ss.xn2[: ss.hi].max(initial=0.0))  # free slots hold 0
    top = max(float(np.einsum("ij,ij->i", k, k).max()), stored)
    if kern.log_bound(top, gamma) < LOG_MAX:
        return  # Cauchy–Schwarz: no product x·y can overflow
    live = ss.live_slots() if ss.dim is not None else np.zeros(0, dtype=np.int64)
    others = np.concatenate([k, ss.X[live]]) if len(live) else k
    logk = kern.log_kernel(k, others, gamma)
    kern.check_overflow(float(logk.max()), "log k(x, y) for this key",
                        "scale the keys or lower gamma")


def check_queries(ss: SlotState, queries) -> tuple[np.ndarray, bool]:
    if ss.n == 0:
        raise ValueError("the memory is empty: add tokens before reading")
    q = np.asarray(queries, dtype=np.float64) if is_numeric(queries) else None
    if q is None:
        raise TypeError("queries must be an array of real numbers")
    single = q.ndim == 1
    if single:
        q = q[None, :]
    if q.ndim != 2 or q.shape[1] != ss.dim:
        raise ValueError(f"queries must have shape (m, {ss.dim}) or ({ss.dim},), "
                         f"got {np.shape(queries)}")
    if not np.isfinite(q).all():
        raise ValueError("queries must be finite (no NaN or inf)")
    check_norms(q, "queries")
    return q, single


def optimality_error(ss: SlotState, be: Backend) -> str | None:
    """Why a (loaded) state is not the optimum of its own tokens, or None.

    The KKT residual is recomputed from the keys' kernel cache and alpha (not from the
    stored g). An honest state can sit a little above ``tol`` (the running g a memory
    checks drifts from the exact one by rounding between exact checks) or far above it
    where its tokens admit nothing better (near-copies); a forged alpha sits far above
    what its tokens allow. So: above ``100·tol``, the tokens are re-solved in batch on a
    copy, and the state is refused when its residual is over ten times the re-solve's.
    """
    if ss.n == 0 or ss.warm:
        return None
    # the full-cache g of the reference: the error-sum path would rebuild (modify) the sum
    kkt = float(be.kkt(ss, reference.g_exact(ss)))
    if kkt <= 100.0 * ss.tol:
        return None
    twin = ss.copy()
    try:
        resolve(twin, be, fallback=False, check=False)
        best = float(be.kkt(twin, reference.g_exact(twin)))
    finally:
        for buf in (twin.X, twin.V, twin.KC, twin.XC):
            scrub(buf)  # a full copy of the keys: nothing of it outlives the check
    if kkt <= max(100.0 * ss.tol, 10.0 * best):
        return None
    return (f"alpha is not the optimum of its tokens: KKT residual {kkt:.2e} recomputed "
            f"from the data, while a re-solve of the same tokens reaches {best:.1e} (the "
            f"file's alpha is wrong: forged or corrupted)")


__all__ = ["check_exp_overflow", "check_norms", "check_queries", "check_rows", "is_numeric",
           "optimality_error", "plain_row"]

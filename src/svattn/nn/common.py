"""Shared helpers of :mod:`svattn.nn`: kernels in torch and input validation.

The kernel formulas are the kernel objects' own (:class:`svattn.exact.core.kernels.Kernel`:
their array-generic methods run on tensors here, with autograd), resolved from the
kernel's name by :func:`~svattn.exact.core.kernels.get_kernel`.

Layout everywhere in this package: ``[B, H, T, D]`` (batch, head, token, feature).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import NamedTuple

import torch

from svattn.exact.core.conventions import warmup_threshold
from svattn.exact.core.kernels import check_kernel, default_gamma, get_kernel

__all__ = [
    "resolve_gamma",
    "log_kernel",
    "log_kernel_diag",
    "check_qkv",
    "check_key_mask",
    "non_finite",
    "centre_keys",
    "translation_invariant",
    "Partition",
    "flat_rows",
    "gather_rows",
    "host_reads",
    "no_host_reads",
]

_HOST_READS = [True]  # stack of no_host_reads() scopes (False inside one)


def host_reads(t: torch.Tensor) -> bool:
    """Whether code may read values of ``t`` on the host (``bool(...)``, ``.item()``).

    Only for CPU tensors in eager mode, where a read costs no device
    synchronisation: the input checks that look at values (finite entries,
    a float mask's values) and the solver's early exits (which give the
    same result as the full static schedule) use it. Never on an accelerator,
    never while :func:`torch.compile` traces, and not inside :func:`no_host_reads`.
    """
    return _HOST_READS[-1] and t.device.type == "cpu" and not torch.compiler.is_compiling()


@contextmanager
def no_host_reads() -> Iterator[None]:
    """Run CPU code as it runs on an accelerator: no value checks, no early exits.

    Examples
    --------
    >>> import torch
    >>> with no_host_reads():
    ...     host_reads(torch.zeros(1))
    False
    >>> host_reads(torch.zeros(1))
    True
    """
    _HOST_READS.append(False)
    try:
        yield
    finally:
        _HOST_READS.pop()


def resolve_gamma(kernel: str, gamma: float | None, dim: int) -> float:
    """``gamma`` if given (must be > 0), else the kernel's default for head dim ``dim``."""
    check_kernel(kernel, dot_form=True)
    if gamma is None:
        return default_gamma(kernel, dim)
    gamma = float(gamma)
    if not gamma > 0:
        raise ValueError(f"gamma must be > 0, got {gamma!r}")
    return gamma


def log_kernel(x: torch.Tensor, y: torch.Tensor, kernel: str, gamma: float) -> torch.Tensor:
    """``log k(x_i, y_j)``: x ``(..., M, D)``, y ``(..., N, D)`` → ``(..., M, N)``.

    :meth:`~svattn.exact.core.kernels.Kernel.log_from_dots` on one matmul ``x·y`` and the
    squared norms: for rbf ``‖x‖² + ‖y‖² − 2 x·y`` clipped at 0 (the exact core
    computes distances from differences, :func:`svattn.exact.core.kernels.sq_distances`).
    """
    xy = x @ y.transpose(-1, -2)  # (..., M, N)
    xx = (x * x).sum(-1, keepdim=True)  # (..., M, 1)
    yy = (y * y).sum(-1).unsqueeze(-2)  # (..., 1, N)
    return get_kernel(kernel).log_from_dots(xy, xx, yy, gamma)


def log_kernel_diag(x: torch.Tensor, kernel: str, gamma: float) -> torch.Tensor:
    """``log k(x_i, x_i)``: x ``(..., N, D)`` → ``(..., N)`` (0 for a unit diagonal, rbf)."""
    kern = get_kernel(kernel)
    if kern.unit_diagonal:
        return x.new_zeros(x.shape[:-1])
    return kern.log_diag((x * x).sum(-1), gamma)


def translation_invariant(kernel: str, gamma: float) -> bool:
    """Whether ``k(x + t, y + t) = k(x, y)`` for every shift ``t``: a dot form with
    ``s = 2c > 0`` (``log k = −c‖x − y‖²``, rbf), the test
    :func:`svattn.nn.margin.key_gradient` makes. ``exp`` (``c = 0``) is not."""
    s, c = get_kernel(kernel).dot_form(gamma)
    return bool(c) and s == 2.0 * c


def centre_keys(x: torch.Tensor, valid: torch.Tensor, kernel: str, gamma: float
                ) -> torch.Tensor:
    """Keys ``x`` (P, n, D) less the mean of each problem's valid keys, for a
    translation-invariant kernel (:func:`translation_invariant`); ``x`` itself otherwise.

    The kernel sees only differences, so the memory is the same function of the
    centred keys; but the solver's arithmetic is not translation-invariant: the kernel
    matrix's dot form ``‖x‖² + ‖y‖² − 2 x·y`` and the finish's merge of copies
    (:data:`svattn.nn.finish_cpu.MERGE_EPS`, relative to ``‖x‖``) lose the differences
    of keys far from the origin to cancellation. Differentiable (the mean is of the
    keys themselves; its gradient is zero to rounding, as the kernel's is along a
    common shift). The mean is taken in ``x``'s dtype; keys far from the origin and
    close to one another lose nothing to the subtraction (it is exact where ``x_i``
    and the mean are within a factor 2 of each other). Absent keys are left as they are.
    """
    if not translation_invariant(kernel, gamma):
        return x
    v = valid.unsqueeze(-1)  # (P, n, 1)
    count = v.sum(-2, keepdim=True).clamp_min(1).to(x.dtype)
    mean = torch.where(v, x, 0.0).sum(-2, keepdim=True) / count  # (P, 1, D)
    return torch.where(v, x - mean, x)


def check_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """Raise ``ValueError`` unless q, k, v are ``[B, H, Tq, D]``, ``[B, H, Tk, D]``,
    ``[B, H, Tk, Dv]`` floating tensors of one dtype and device with finite entries.

    Shapes, dtypes and devices are always checked; finite entries only where
    :func:`host_reads` allows (CPU, eager)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(
                f"{name} must have layout [B, H, T, D] (4 dims), got shape {tuple(t.shape)}"
            )
        if not t.is_floating_point():
            raise ValueError(f"{name} must be a floating tensor, got dtype {t.dtype}")
    if not (q.dtype == k.dtype == v.dtype):
        raise ValueError(f"q, k, v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must share a device, got {q.device}, {k.device}, {v.device}")
    if q.shape[:2] != k.shape[:2] or k.shape[:2] != v.shape[:2]:
        raise ValueError(
            "q, k, v must agree on [B, H] (layout [B, H, T, D]); got "
            f"q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must share the feature dim D: q {tuple(q.shape)}, k {tuple(k.shape)}"
        )
    if k.shape[2] != v.shape[2]:
        raise ValueError(
            f"k and v must have the same number of tokens Tk: k {tuple(k.shape)}, "
            f"v {tuple(v.shape)}"
        )
    if k.shape[2] < 1:
        raise ValueError(f"k must hold at least one token, got shape {tuple(k.shape)}")
    bad = non_finite((("k", k), ("q", q), ("v", v)))
    if bad is not None:
        raise ValueError(f"{bad} has non-finite entries (nan or inf)")


def non_finite(named: Iterable[tuple[str, torch.Tensor]]) -> str | None:
    """The name of the first of the ``(name, tensor)`` pairs with a non-finite entry
    (nan or inf), None if there is none, or if a value check would synchronise
    (:func:`host_reads` false for the first tensor: non-finite inputs then propagate).

    The finite-entries check of :func:`check_qkv` and of the hybrid mixer's global path
    (:meth:`svattn.mixers.hybrid.HybridSVAttention._global`), each with its own message.
    """
    named = list(named)
    if not named or not host_reads(named[0][1]):
        return None
    for name, t in named:
        if not bool(torch.isfinite(t).all()):
            return name
    return None


def check_key_mask(key_mask: torch.Tensor | None, k: torch.Tensor) -> torch.Tensor:
    """Boolean mask ``[B, H, Tk]`` (True = key present) broadcast from ``key_mask``."""
    B, H, Tk, _ = k.shape
    if key_mask is None:
        return torch.ones(B, H, Tk, dtype=torch.bool, device=k.device)
    if not isinstance(key_mask, torch.Tensor) or key_mask.dtype != torch.bool:
        raise ValueError("key_mask must be a bool tensor broadcastable to [B, H, Tk]")
    try:
        return key_mask.to(k.device).expand(B, H, Tk)
    except RuntimeError:
        raise ValueError(
            f"key_mask of shape {tuple(key_mask.shape)} does not broadcast to [B, H, Tk] = "
            f"{[B, H, Tk]}"
        ) from None


class Partition(NamedTuple):
    """The three KKT sets of each (batch, head) memory, bool tensors ``[B, H, Tk]``.

    ``margin`` (S): ``0 < alpha < C``; ``error`` (E): ``alpha = C``; ``reserve`` (R):
    ``alpha = 0``. Masked-out keys belong to none of them.
    """

    margin: torch.Tensor
    error: torch.Tensor
    reserve: torch.Tensor

    def kept(self) -> torch.Tensor:
        """Tokens the memory keeps (margin ∪ error), bool ``[B, H, Tk]``."""
        return self.margin | self.error

    def present(self) -> torch.Tensor:
        """Keys the memory was built over (margin ∪ error ∪ reserve), bool ``[B, H, Tk]``."""
        return self.margin | self.error | self.reserve

    def box_raised(self, C: float) -> torch.Tensor:
        """Memories over fewer than ``⌈1/C⌉`` present keys, bool ``[B, H]`` (``[B, H, Tq]``
        with a per-query mask): their box was raised to ``1/n``, every present key has
        weight ``1/n`` (:mod:`svattn.nn.masks`). An empty memory (``n = 0``) counts too.
        """
        return self.present().sum(-1) < warmup_threshold(C)


def gather_rows(mask: torch.Tensor, min_size: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices of the True entries of each row of ``mask`` (P, n), padded to one width.

    Returns ``idx`` (P, s) and ``valid`` (P, s) with ``s = max(row count, min_size)``;
    padded slots hold indices of False entries (distinct, so scatters stay well defined).
    """
    counts = mask.sum(-1)
    s = max(int(counts.max()) if mask.numel() else 0, min_size)
    s = min(s, mask.shape[-1])
    idx = torch.argsort(mask.to(torch.int8), dim=-1, descending=True, stable=True)[..., :s]
    valid = torch.arange(s, device=mask.device) < counts.unsqueeze(-1)
    return idx, valid


def flat_rows(idx: torch.Tensor, n: int) -> torch.Tensor:
    """Rows ``idx`` (P, s) of each of ``P`` problems of ``n`` rows as indices into the
    flattened ``(P·n, ·)`` rows, (P·s,): for one ``index_select`` / ``index_copy_``."""
    P = idx.shape[0]
    return (idx + n * torch.arange(P, device=idx.device).unsqueeze(-1)).reshape(-1)
